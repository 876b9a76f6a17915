"""The GRPO run itself (``train_grpo``): TRL's GRPOTrainer with a LoRA adapter (peft) on the 'train'
pairs, an optional supervised warm-up of the same adapter first (``warm_up``), the held-out pairs
scored before and after, a wall-clock budget every rank keeps to (``Deadline``), and the run's
metrics (``RunLog``: ``metrics.jsonl`` and the caller's tracker). torch, transformers, trl, peft and
datasets are imported inside the functions (the ``train`` extra)."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from kernelcast.surrogate.grpo.answers import REWARDS, render_prompt, sft_target
from kernelcast.surrogate.grpo.model import TransformersForecaster, evaluate_pairs, load_model
from kernelcast.surrogate.grpo.settings import GRPOResult, GRPOSettings
from kernelcast.surrogate.llm import build_messages, prompt_version
from kernelcast.surrogate.pairs import request_of

ADAPTER_FOLDER = "adapter"


def prompt_dataset(pairs: pd.DataFrame, tokenizer, answer_prefix: str = ""):
    """A datasets.Dataset for TRL: the forecaster's prompt rendered as text (``render_prompt``), the
    true bin and the answer prefix, which TRL hands to the reward functions by column name."""
    from datasets import Dataset

    rows = pairs.to_dict("records")
    return Dataset.from_dict({
        "prompt": [render_prompt(tokenizer, build_messages(request_of(r)), answer_prefix) for r in rows],
        "true_bin": [int(r["true_bin"]) for r in rows], "answer_prefix": [answer_prefix] * len(rows)})


class RunLog:
    """Where a run's metrics go: ``metrics.jsonl`` under the run folder, and MLflow when a URI is given."""

    def __init__(self, out_dir: str, make_tracker, params: Mapping[str, object], enabled: bool = True):
        """``make_tracker``: makes a ``kernelcast.storage.tracking.Tracker`` (the caller's: tracking is a layer above
        this one), called in the main process only; None for the run folder alone."""
        self.path = Path(out_dir) / "metrics.jsonl"
        self.enabled = enabled  # only the main process logs in a multi-GPU run
        self.tracker, self.run_id = None, ""
        if enabled and make_tracker is not None:
            self.tracker = make_tracker()
            name = f"grpo-{params['reward']}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
            self.run_id = self.tracker.start(name, params, {"kernelcast.surrogate": "llm-grpo"})

    def log(self, values: Mapping[str, float], step: int) -> None:
        if not self.enabled:
            return
        with open(self.path, "a") as f:
            f.write(json.dumps({"step": step, **{k: float(v) for k, v in values.items()
                                                 if isinstance(v, (int, float, np.number))}}) + "\n")
        if self.tracker:
            self.tracker.log_metrics(self.run_id, values, step)

    def log_folder(self, folder: str, name: str) -> None:
        if self.enabled and self.tracker:
            self.tracker.log_folder(self.run_id, folder, name)

    def finish(self, status: str = "FINISHED") -> None:
        if self.enabled and self.tracker:
            self.tracker.finish(self.run_id, status)


class Deadline:
    """A wall-clock time after which training stops; every rank of a multi-GPU run takes the main
    rank's word for it, so that they all stop at the same step."""

    def __init__(self, at: float | None, device=None):
        self.at, self.device = at, device

    def passed(self) -> bool:
        if self.at is None:
            return False
        import torch
        import torch.distributed as dist

        late = time.monotonic() > self.at
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            flag = torch.tensor([float(late)], device=self.device)
            dist.broadcast(flag, src=0)
            late = bool(flag.item())
        return late


def _stop_at(deadline: Deadline):
    from transformers import TrainerCallback

    class StopAtDeadline(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if deadline.passed():
                control.should_training_stop = True

    return StopAtDeadline()


def sft_batch(tokenizer, rows: Sequence[Mapping], answer_prefix: str, max_completion_tokens: int,
              rng: np.random.Generator | None = None) -> dict:
    """Right-padded (input_ids, attention_mask, labels) of prompt + warm-up target (+ EOS): the
    prompt tokenized as generation reads it, labels -100 everywhere but on the target's tokens.
    ``rng``: targets drawn at random around their shape (``sft_target``)."""
    import torch

    seqs, labels = [], []
    for r in rows:
        prompt = tokenizer(render_prompt(tokenizer, build_messages(request_of(r)), answer_prefix))["input_ids"]
        target = tokenizer(sft_target(int(r["true_bin"]), answer_prefix, rng), add_special_tokens=False)["input_ids"]
        target = (target + [tokenizer.eos_token_id])[:max_completion_tokens]
        seqs.append(prompt + target)
        labels.append([-100] * len(prompt) + target)
    width = max(map(len, seqs))
    pad = tokenizer.pad_token_id
    return {"input_ids": torch.tensor([s + [pad] * (width - len(s)) for s in seqs]),
            "attention_mask": torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs]),
            "labels": torch.tensor([x + [-100] * (width - len(x)) for x in labels])}


def warm_up(model, tokenizer, train: pd.DataFrame, settings: GRPOSettings, log: RunLog | None = None,
            deadline: Deadline | None = None) -> list[float]:
    """Fine-tune ``model``'s trainable (LoRA) weights for ``settings.sft_steps`` steps on ``train``
    pairs towards ``sft_target`` answers, ``settings.batch_size`` pairs a step (AdamW, constant
    rate, cross-entropy on the target tokens only). Returns the loss of each step done.

    Pairs whose child failed (true bin 0) are taught a high failure probability, the others a low one
    and their speed bin."""
    import torch

    rows = train.to_dict("records")
    if not rows:
        raise ValueError("no training pairs: the warm-up has no target to train towards")
    order = np.random.default_rng(settings.seed).permutation(len(rows))
    targets = np.random.default_rng(settings.seed + 1) if settings.sft_jitter else None
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the model has no trainable weights to warm up")
    optimizer = torch.optim.AdamW(params, lr=settings.sft_learning_rate, weight_decay=0.0)
    device = next(model.parameters()).device
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" and settings.precision == "bf16"
                else torch.autocast(device.type, enabled=False))
    training = model.training
    model.train()
    losses: list[float] = []
    try:
        for step in range(settings.sft_steps):
            if deadline is not None and deadline.passed():
                break
            take = [rows[order[(step * settings.batch_size + i) % len(rows)]] for i in range(settings.batch_size)]
            batch = {k: v.to(device) for k, v in sft_batch(tokenizer, take, settings.answer_prefix,
                                                             settings.max_completion_tokens, targets).items()}
            with autocast:
                loss = model(**batch, use_cache=False).loss
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(float(loss.detach()))
            if log is not None:
                log.log({"sft.loss": losses[-1], "sft.grad_norm": float(grad_norm)}, step + 1)
    finally:
        model.train(training)
        optimizer.zero_grad(set_to_none=True)
    return losses


def _callback(log: RunLog):
    from transformers import TrainerCallback

    class LogMetrics(TrainerCallback):
        """Every trainer log (loss, reward, rewards/<term>/mean, ...) into the run log, at its step."""

        def on_log(self, args, state, control, logs=None, **kwargs):
            log.log({f"train.{k}": v for k, v in (logs or {}).items()}, state.global_step)

    return LogMetrics()


def scored_pairs(pairs: pd.DataFrame, n: int, seed: int) -> pd.DataFrame:
    """The held-out ('eval') pairs a run scores before and after training: ``n`` of them drawn with
    ``seed`` (all of them when ``n`` is 0 or more than there are)."""
    held_out = pairs[pairs["split"] == "eval"]
    return held_out.sample(n, random_state=seed) if n and len(held_out) > n else held_out


def train_grpo(pairs: pd.DataFrame, settings: GRPOSettings, make_tracker=None) -> GRPOResult:
    """Train a LoRA adapter with GRPO on the 'train' pairs; score before and after on the 'eval' pairs.

    ``make_tracker``: makes the MLflow experiment of ``settings.tracking_uri`` (``kernelcast.tasks.setup.grpo_tracker``),
    called on the main process only; the caller gives it because tracking sits a layer above the surrogates."""
    if settings.tracking_uri and make_tracker is None:
        raise ValueError(f"tracking_uri {settings.tracking_uri!r} is set but no make_tracker was given: "
                         "pass kernelcast.tasks.setup.grpo_tracker(settings)")
    import torch
    from peft import LoraConfig
    from transformers import set_seed
    from trl import GRPOConfig, GRPOTrainer

    started = time.monotonic()
    train = pairs[pairs["split"] == "train"]
    held_out = scored_pairs(pairs, settings.eval_pairs, settings.seed)
    if train.empty or held_out.empty:
        raise ValueError(f"GRPO needs 'train' and 'eval' pairs; got {len(train)} and {len(held_out)}")
    set_seed(settings.seed)
    out = Path(settings.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model, tokenizer = load_model(settings.model, settings.precision)
    on_gpu = torch.cuda.is_available()
    if on_gpu and settings.precision == "fp32":
        # fp32 weights, optimizer and softmax; matrix products on TF32 tensor cores (fp32 range, 10-bit
        # mantissa in, fp32 sums out), which keeps bfloat16's divergence away at a fraction of fp32's time.
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    config = GRPOConfig(
        output_dir=str(out / "trainer"), max_steps=settings.steps, learning_rate=settings.learning_rate,
        per_device_train_batch_size=settings.batch_size * settings.num_generations,
        num_generations=settings.num_generations, max_completion_length=settings.max_completion_tokens,
        temperature=settings.temperature, logging_steps=1, save_strategy="no", report_to="none",
        gradient_checkpointing=settings.gradient_checkpointing, seed=settings.seed,
        bf16=on_gpu and settings.precision == "bf16",
        use_cpu=not on_gpu, dataloader_num_workers=0, disable_tqdm=True)
    lora = LoraConfig(r=settings.lora_rank, lora_alpha=2 * settings.lora_rank, lora_dropout=0.0,
                      target_modules="all-linear", task_type="CAUSAL_LM")
    trainer = GRPOTrainer(model=model, reward_funcs=list(REWARDS[settings.reward]), args=config,
                          train_dataset=prompt_dataset(train, tokenizer, settings.answer_prefix), processing_class=tokenizer, peft_config=lora)
    main = trainer.accelerator.is_main_process
    params = {**{k: v for k, v in dataclasses.asdict(settings).items() if k != "tracking_uri"},
              "train_pairs": len(train), "eval_pairs": len(held_out), "prompt_version": prompt_version(),
              "eval_ops": ",".join(sorted(held_out["op"].unique()))}
    log = RunLog(str(out), make_tracker, params, enabled=main)
    trainer.add_callback(_callback(log))
    deadline = Deadline(None, trainer.accelerator.device)
    trainer.add_callback(_stop_at(deadline))
    try:
        def score(label: str) -> dict[str, float]:
            # LoRA's B matrices start at zero, so before training this is exactly the base model.
            forecaster = TransformersForecaster(trainer.model, tokenizer, max_new_tokens=settings.max_completion_tokens,
                                                batch_size=settings.eval_batch_size,
                                                answer_prefix=settings.answer_prefix)
            values = evaluate_pairs(forecaster, held_out) if main else {}
            log.log({f"{label}.{k}": v for k, v in values.items()}, trainer.state.global_step)
            return values

        scoring = time.monotonic()
        before = score("before")
        # Each evaluation still to come is reckoned as long as this one, and a little more.
        reserve = 1.2 * (time.monotonic() - scoring) + 5.0
        end = started + settings.max_seconds - reserve if settings.max_seconds else None
        after_sft, sft_loss, sft_seconds = {}, [], 0.0
        if settings.sft_steps:
            # The warm-up trains the adapter the trainer holds; GRPO then starts from it. It stops
            # early enough to leave room for the 'after_sft' evaluation too.
            start = time.perf_counter()
            deadline.at = None if end is None else end - reserve
            sft_loss = warm_up(trainer.model, tokenizer, train, settings, log, deadline)
            sft_seconds = time.perf_counter() - start
            log.log({"sft.seconds": sft_seconds, "sft.steps": len(sft_loss)}, 0)
            after_sft = score("after_sft")
        deadline.at = end
        start = time.perf_counter()
        if not deadline.passed():
            trainer.train()
        seconds = time.perf_counter() - start
        steps = trainer.state.global_step
        completions = steps * config.per_device_train_batch_size * trainer.accelerator.num_processes
        after = score("after")
        adapter = out / ADAPTER_FOLDER
        trainer.save_model(str(adapter))
        throughput = {"train.seconds": seconds, "train.steps": steps,
                      "train.completions_per_second": completions / seconds if seconds > 0 else 0.0,
                      "train.pairs_per_second": completions / settings.num_generations / seconds if seconds > 0 else 0.0}
        log.log(throughput, trainer.state.global_step)
        log.log_folder(str(adapter), ADAPTER_FOLDER)
        result = GRPOResult(str(out), str(adapter), log.run_id, before, after, len(train), len(held_out), seconds,
                            throughput["train.pairs_per_second"], throughput["train.completions_per_second"],
                            steps=steps, after_sft=after_sft, sft_steps=len(sft_loss), sft_loss=sft_loss)
        if main:
            (out / "evaluation.json").write_text(json.dumps(dataclasses.asdict(result), indent=1, default=float))
    except BaseException:
        log.finish("FAILED")
        raise
    log.finish()
    return result
