"""A code language model with LoRA and two small heads, read as one forecaster: ``LMHeadForecaster``.

The (anchor, candidate) pair is one text, the anchor's source then the candidate's, each cut to
half of ``max_tokens`` (a short one leaves the rest to the other). The decoder's last hidden
state is pooled two ways, the mean over the pair's tokens and the last token (in a causal model
the only one that has read both kernels), and a small network on the pooled vector gives three
numbers: the logit of failure, and the mean and log-variance of a Gaussian over the candidate's
log speedup against its anchor. Calibration maps them as the other forecasters' are mapped: a
Platt curve on the failure logit, and ``LevelSpreadCalibrator``'s spread scale on the Gaussian,
both fit on pairs held out of training; ``kernelcast.surrogate.learned.bin_probabilities`` turns the
Gaussian into the 8 bins.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np

from kernelcast.surrogate.forecast import Forecast, ForecastRequest, gaussian_forecasts

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")  # the attention projections of Qwen2 (and Llama)
ADAPTER_FOLDER, HEADS_FILE, CONFIG_FILE, CALIBRATION_FILE = "adapter", "heads.pt", "config.json", "calibration.json"
_LOG_VAR_RANGE = (-9.0, 4.0)  # spreads from 0.01 to 7 in log speedup: beyond either, the NLL only misleads
_ANCHOR_HEADER, _CANDIDATE_HEADER = "# anchor kernel\n", "\n# candidate kernel\n"
_SEEN_MAX = 65536  # raw outputs kept per forecaster: a long search must not keep every child's


@dataclass(frozen=True)
class HeadConfig:
    """What rebuilds the network: the base model, how pairs are cut, the adapter's and heads' shapes."""

    model: str  # a local model folder or .gguf file
    max_tokens: int = 1024
    lora_rank: int = 8
    lora_alpha: int = 16
    head_width: int = 256
    precision: str = "bf16"  # the decoder's weights on a GPU (a CPU is always fp32)

    def __post_init__(self) -> None:
        for name in ("max_tokens", "lora_rank", "lora_alpha", "head_width"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.max_tokens < 16:
            raise ValueError(f"max_tokens must leave room for both kernels (16 or more), got {self.max_tokens}")
        if not os.path.exists(self.model):
            raise ValueError(f"model {self.model!r} does not exist; give a local model folder or .gguf file")


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def kept_tokens(anchor: int, candidate: int, room: int) -> tuple[int, int]:
    """How many of the anchor's and the candidate's tokens a pair keeps in ``room``: each half of it, and what
    one leaves unused goes to the other."""
    keep_a = min(anchor, max(room // 2, room - candidate))
    return keep_a, min(candidate, room - keep_a)


def header_tokens(tokenizer) -> int:
    """The tokens the two headers take from ``max_tokens``."""
    return sum(len(tokenizer(h, add_special_tokens=False)["input_ids"]) for h in (_ANCHOR_HEADER, _CANDIDATE_HEADER))


class PairModel:
    """The decoder with its LoRA adapter and the heads; ``outputs`` maps texts to (failure logit, mean,
    log-variance), ``pooled`` to the vectors the heads read."""

    def __init__(self, config: HeadConfig, device: str = "", adapter: str = ""):
        import torch
        from peft import LoraConfig, PeftModel, get_peft_model

        from kernelcast.surrogate.grpo.model import load_causal_lm

        self.config, self.device = config, device or default_device()
        base, self.tokenizer = load_causal_lm(config.model, config.precision)
        if adapter:
            self.lm = PeftModel.from_pretrained(base, adapter)
        else:
            lora = LoraConfig(r=config.lora_rank, lora_alpha=config.lora_alpha, lora_dropout=0.0,
                              target_modules=list(LORA_TARGETS), bias="none")
            self.lm = get_peft_model(base, lora)
        self.lm.to(self.device)
        # The decoder alone: the LoRA layers sit inside it, and the vocabulary projection is never needed.
        self.decoder = self.lm.get_base_model().get_decoder()
        width = 2 * self.lm.get_base_model().config.hidden_size
        torch.manual_seed(0)
        self.heads = torch.nn.Sequential(torch.nn.LayerNorm(width), torch.nn.Linear(width, config.head_width),
                                         torch.nn.GELU(), torch.nn.Linear(config.head_width, 3)).to(self.device)
        torch.nn.init.zeros_(self.heads[-1].weight)  # starts at the base rates its bias is given
        self._tokens: dict[str, list[int]] = {}
        self._headers = [self._ids(h) for h in (_ANCHOR_HEADER, _CANDIDATE_HEADER)]

    def _ids(self, text: str) -> list[int]:
        ids = self._tokens.get(text)
        if ids is None:
            ids = self._tokens[text] = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            if len(self._tokens) > _SEEN_MAX:
                self._tokens.clear()
        return ids

    def pair_ids(self, anchor: str, candidate: str) -> list[int]:
        """The token ids of one pair: both headers, each source cut to its share of ``max_tokens``."""
        a, c = self._ids(anchor), self._ids(candidate)
        keep_a, keep_c = kept_tokens(len(a), len(c), self.config.max_tokens - len(self._headers[0])
                                     - len(self._headers[1]))
        return self._headers[0] + a[:keep_a] + self._headers[1] + c[:keep_c]

    def set_base_rates(self, failure_rate: float, mean: float, variance: float) -> None:
        """The heads' starting answer: the training set's failure rate and log-speedup mean and variance."""
        import torch

        p = min(max(failure_rate, 1e-3), 1 - 1e-3)
        with torch.no_grad():
            self.heads[-1].bias.copy_(torch.tensor(
                [math.log(p / (1 - p)), mean, min(max(math.log(max(variance, 1e-6)), _LOG_VAR_RANGE[0]),
                                                  _LOG_VAR_RANGE[1])]))

    def pooled(self, pairs: Sequence[tuple[str, str]]):
        """(n, 2 * hidden) float32 tensor: mean and last-token pooling of the last hidden state."""
        import torch

        ids = [self.pair_ids(a, c) for a, c in pairs]
        n = max(len(i) for i in ids)
        pad = self.tokenizer.pad_token_id or 0
        # Right padding: real tokens keep positions 0..len-1, and causal attention never reads the pads.
        input_ids = torch.tensor([i + [pad] * (n - len(i)) for i in ids], device=self.device)
        mask = torch.tensor([[1] * len(i) + [0] * (n - len(i)) for i in ids], device=self.device)
        hidden = self.decoder(input_ids=input_ids, attention_mask=mask, use_cache=False).last_hidden_state.float()
        m = mask.unsqueeze(-1).float()
        mean = (hidden * m).sum(1) / m.sum(1)
        last = hidden[torch.arange(len(ids), device=self.device), mask.sum(1) - 1]
        return torch.cat([mean, last], dim=-1)

    def outputs(self, pairs: Sequence[tuple[str, str]]):
        """(failure logit, mean, log-variance) tensors of shape (n,)."""
        out = self.heads(self.pooled(pairs))
        return out[:, 0], out[:, 1], out[:, 2].clamp(*_LOG_VAR_RANGE)

    def parameters(self):
        """What training changes: the LoRA weights and the heads."""
        return [p for p in self.lm.parameters() if p.requires_grad] + list(self.heads.parameters())

    def train(self, on: bool = True) -> None:
        self.lm.train(on)
        self.heads.train(on)

    def batches(self, pairs: Sequence[tuple[str, str]], batch_size: int):
        """Index batches of ``pairs`` grouped by length, so that a batch pads little."""
        order = np.argsort([len(a) + len(c) for a, c in pairs], kind="stable")
        return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]

    def predict_raw(self, pairs: Sequence[tuple[str, str]], batch_size: int = 8) -> np.ndarray:
        """(n, 3) uncalibrated (failure logit, mean, log-variance), in ``pairs``' order."""
        return self._each(pairs, batch_size, lambda b: np.stack([t.float().cpu().numpy() for t in self.outputs(b)], 1),
                          3)

    def embed(self, pairs: Sequence[tuple[str, str]], batch_size: int = 8) -> np.ndarray:
        """(n, 2 * hidden) pooled vectors, in ``pairs``' order."""
        return self._each(pairs, batch_size, lambda b: self.pooled(b).cpu().numpy(),
                          2 * self.lm.get_base_model().config.hidden_size)

    def _each(self, pairs, batch_size: int, fn, width: int) -> np.ndarray:
        import torch

        out = np.empty((len(pairs), width), dtype=np.float64)
        if not len(pairs):
            return out
        self.train(False)
        with torch.inference_mode():
            for idx in self.batches(pairs, batch_size):
                out[idx] = fn([pairs[i] for i in idx])
        return out

    def save(self, folder: str) -> None:
        import torch

        os.makedirs(folder, exist_ok=True)
        self.lm.save_pretrained(os.path.join(folder, ADAPTER_FOLDER))
        torch.save(self.heads.state_dict(), os.path.join(folder, HEADS_FILE))

    @classmethod
    def load(cls, folder: str, config: HeadConfig, device: str = "") -> "PairModel":
        import torch

        model = cls(config, device, adapter=os.path.join(folder, ADAPTER_FOLDER))
        model.heads.load_state_dict(torch.load(os.path.join(folder, HEADS_FILE), map_location=model.device))
        return model


@dataclass(frozen=True)
class Calibration:
    """Platt's curve on the failure logit, and the spread's scale (and mean's shift) of the Gaussian."""

    platt_slope: float = 1.0
    platt_intercept: float = 0.0
    mean_shift: float = 0.0
    spread_scale: float = 1.0

    def failure(self, logit: np.ndarray) -> np.ndarray:
        return 1.0 / (1.0 + np.exp(-(self.platt_slope * logit + self.platt_intercept)))

    def gaussian(self, mean: np.ndarray, log_var: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return mean + self.mean_shift, np.exp(0.5 * log_var) * self.spread_scale


def fit_calibration(raw: np.ndarray, failed: np.ndarray, log_speedup: np.ndarray) -> Calibration:
    """The calibration of raw outputs ``raw`` (n, 3) on held-out pairs: Platt on the failure logit where
    both outcomes occur, the spread scale on the pairs that ran (the mean is not shifted: the speed
    head was fit to these very targets' kind, and a shift would only follow the calibration problems)."""
    from sklearn.linear_model import LogisticRegression

    from kernelcast.surrogate.bins import speedup_bin
    from kernelcast.surrogate.calibration import LevelSpreadCalibrator

    fields = {}
    if failed.any() and not failed.all():
        platt = LogisticRegression(C=1e4).fit(raw[:, :1], failed)
        fields.update(platt_slope=float(platt.coef_[0, 0]), platt_intercept=float(platt.intercept_[0]))
    ran = ~failed & np.isfinite(log_speedup)
    if ran.sum() >= 2:
        bins = np.array([speedup_bin(math.exp(y)) for y in log_speedup[ran]])
        level = LevelSpreadCalibrator(max_shift=0.0).fit(raw[ran, 1], np.exp(0.5 * raw[ran, 2]), bins)
        fields.update(spread_scale=level.scale_)
    return Calibration(**fields)


class LMHeadForecaster:
    """The language model with heads as a ``Forecaster``: failure probability, 8 bins, expected speedup.

    Made empty by the registry and read from a trained folder (``load``, or ``fit(None)`` with
    ``folder`` set); ``python -m kernelcast.surrogate.lmhead train`` writes such a folder.
    """

    name = "lmhead"

    def __init__(self, folder: str = "", model: str = "", device: str = "", batch_size: int = 8):
        self.folder, self.model, self.device, self.batch_size = folder, model, device, batch_size
        self._seen: dict[tuple[str, str], np.ndarray] = {}  # raw outputs of the pairs read

    @property
    def version(self) -> str:
        config = getattr(self, "config_", None)
        return f"lmhead-{os.path.basename(config.model)}-{self.steps_}" if config else "lmhead-untrained"

    @classmethod
    def load(cls, folder: str, model: str = "", device: str = "", batch_size: int = 8) -> "LMHeadForecaster":
        """The forecaster saved in ``folder``; ``model`` replaces the base model's path recorded there
        (the same weights elsewhere: another machine's copy)."""
        return cls(folder, model, device, batch_size).fit(None)

    def fit(self, pairs=None) -> "LMHeadForecaster":
        """Read the trained folder. It is trained by ``python -m kernelcast.surrogate.lmhead train``, not here."""
        if pairs is not None:
            raise ValueError("the lmhead forecaster is trained with `python -m kernelcast.surrogate.lmhead train`, "
                             "then read from its folder; it does not fit on a search's pairs")
        if not self.folder:
            raise ValueError("the lmhead forecaster needs the folder of a trained one "
                             "(`python -m kernelcast.surrogate.lmhead train --out DIR`)")
        saved = read_json(self.folder, CONFIG_FILE)
        missing = [f for f in (ADAPTER_FOLDER, HEADS_FILE) if not os.path.exists(os.path.join(self.folder, f))]
        if missing:
            raise ValueError(f"{self.folder} is no trained lmhead folder: it lacks {', '.join(missing)}")
        head = dict(saved["head"])
        if self.model:
            head["model"] = self.model
        self.config_ = HeadConfig(**head)
        self.steps_ = int(saved.get("training", {}).get("steps", 0))
        self.calibration_ = Calibration(**read_json(self.folder, CALIBRATION_FILE))
        self.net_ = PairModel.load(self.folder, self.config_, self.device)
        return self

    @classmethod
    def of(cls, net: PairModel, calibration: Calibration, steps: int, batch_size: int = 8) -> "LMHeadForecaster":
        """A forecaster around a network in memory (training's own)."""
        forecaster = cls(model=net.config.model, device=net.device, batch_size=batch_size)
        forecaster.config_, forecaster.net_, forecaster.calibration_, forecaster.steps_ = (
            net.config, net, calibration, steps)
        return forecaster

    def save(self, folder: str, training: dict | None = None) -> None:
        """The adapter, heads, calibration and config (with ``training``'s record) into ``folder``."""
        self.net_.save(folder)
        write_json(folder, CALIBRATION_FILE, asdict(self.calibration_))
        write_json(folder, CONFIG_FILE, {"head": asdict(self.config_), "training": training or {}})

    def _check(self) -> None:
        if not hasattr(self, "net_"):
            raise RuntimeError("LMHeadForecaster used before it was loaded (load(folder) or fit(None))")

    def _raw(self, requests: Sequence[ForecastRequest]) -> np.ndarray:
        """(n, 3) raw outputs; a pair already read is not read again (a search asks about a candidate
        once per case, and this forecaster reads the same text for every case)."""
        self._check()
        seen = self._seen
        texts = _texts(requests)
        new = list(dict.fromkeys(t for t in texts if t not in seen))
        if new:
            if len(seen) + len(new) > _SEEN_MAX:
                seen.clear()
            seen.update(zip(new, self.net_.predict_raw(new, self.batch_size)))
        return np.array([seen[t] for t in texts]).reshape(len(texts), 3)

    def forget(self) -> None:
        """Drop the outputs kept for pairs already read: the next forecast reads every pair again."""
        self._seen = {}

    def predict(self, requests: Sequence[ForecastRequest]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(failure probability, mean, spread of log speedup against the anchor) per request, calibrated."""
        raw = self._raw(requests)
        mean, sigma = self.calibration_.gaussian(raw[:, 1], raw[:, 2])
        return self.calibration_.failure(raw[:, 0]), mean, sigma

    def predict_failure(self, requests: Sequence[ForecastRequest]) -> np.ndarray:
        """P(the kernel fails) per request."""
        return self.predict(requests)[0]

    def predict_log_speedup(self, requests: Sequence[ForecastRequest]) -> tuple[np.ndarray, np.ndarray]:
        """(mean, spread) of log speedup against the anchor per request."""
        return self.predict(requests)[1:]

    def embed(self, requests: Sequence[ForecastRequest]) -> np.ndarray:
        """(n, 2 * hidden) pooled last hidden states of the requests' (anchor, candidate) texts."""
        self._check()
        return self.net_.embed(_texts(requests), self.batch_size)

    def forecast(self, requests: Sequence[ForecastRequest]) -> list[Forecast]:
        if not requests:
            return []
        t0 = time.perf_counter()
        p_fail, mu, sigma = self.predict(requests)
        return gaussian_forecasts(requests, self.name, self.version, p_fail, mu, sigma, t0)


def append_embeddings(features: np.ndarray, requests: Sequence[ForecastRequest],
                      forecaster: LMHeadForecaster) -> np.ndarray:
    """``features`` (one row per request, e.g. ``SourceFeatures().matrix``) with the requests' pooled
    embeddings appended as further columns: a gradient-boosted forecaster's inputs with what the
    language model read."""
    features = np.asarray(features, dtype=float)
    if features.ndim != 2 or len(features) != len(requests):
        raise ValueError(f"need one feature row per request: {features.shape} for {len(requests)} requests")
    return np.hstack([features, forecaster.embed(requests)])


def _texts(requests: Sequence[ForecastRequest]) -> list[tuple[str, str]]:
    return [(r.anchor.source, r.candidate.source) for r in requests]


def read_json(folder: str, name: str) -> dict:
    path = os.path.join(folder, name)
    if not os.path.exists(path):
        raise ValueError(f"{folder} is no trained lmhead folder: it lacks {name}")
    with open(path) as f:
        return json.load(f)


def write_json(folder: str, name: str, value: dict) -> None:
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, name), "w") as f:
        json.dump(value, f, indent=2, sort_keys=True, allow_nan=True)
