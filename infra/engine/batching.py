"""The engine: a model, a request queue and the worker thread that decodes the queue in slots.

Concurrent requests queue up; one worker thread keeps up to ``max_batch`` of them decoding
together, each in a slot of a KV cache allocated once (``infra/slots.py``). A request is
prefilled into a free slot, decodes one token a step beside the others, and is answered the
moment it ends; its slot then takes the next queued request (continuous batching), so a
batch never waits for its longest answer. Each row keeps its own temperature, top_p,
max_tokens, stop strings and seeded random stream (``sample``), so a request's text depends
on its own seed, not on what shares the batch.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import threading
import time
from collections import deque

import torch

from kernelcast.infra.engine.api import Job, RequestError, read_request
from kernelcast.infra.engine.loading import chat_template, end_token_ids
from kernelcast.infra.slots import SlotCache, register
from kernelcast.infra.slots import masks as slots_masks

# A batch waits for stragglers at most this long, so that a steady stream of requests still gets
# served; short beside a batch's generation, long enough for hundreds of requests to be tokenized.
GATHER_LIMIT_S = 1.0
# Slot lengths are rounded up to this many tokens, so that bursts of similar requests share a cache size.
SLOT_ROUNDING = 128
# With a shared GPU lock, the engine waits this long after each step before taking it again: a child
# of the harness blocked on the lock is woken when it is released and needs a moment to take it.
LOCK_PAUSE_S = 0.002


TOP_K = 256  # tokens a sampled row chooses among (see sample)


def sample(logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor,
           uniform: torch.Tensor) -> torch.Tensor:
    """One token per row: argmax where the temperature is 0, else inverse-CDF sampling with row's uniform.

    Each row uses only its own logits and its own uniform number, and every sampling row
    goes through the same steps, so a row's token does not depend on the other rows.
    """
    chosen = logits.argmax(dim=-1)
    rows = (temperature > 0).nonzero().flatten()
    if rows.numel() == 0:
        return chosen
    scaled = logits[rows].float() / temperature[rows, None]
    # The TOP_K most likely tokens, renormalised: past them a code model's mass is negligible, and
    # sorting 256 rows of a 152k vocabulary every step cost more than the step's matmuls.
    top, order = scaled.topk(min(TOP_K, scaled.shape[-1]), dim=-1)
    probs = torch.softmax(top, dim=-1)
    # top_p keeps the most likely tokens whose mass before them is below top_p (the first always).
    probs = probs * ((probs.cumsum(dim=-1) - probs) < top_p[rows, None])
    cdf = probs.cumsum(dim=-1)
    target = (uniform[rows] * cdf[:, -1])[:, None]
    index = torch.searchsorted(cdf, target, right=True).clamp_(max=cdf.shape[-1] - 1)
    chosen[rows] = order.gather(-1, index).flatten()
    return chosen


class Engine:
    """A model, a request queue and the worker thread that generates the queue in batches."""

    def __init__(self, model, tokenizer, *, name: str, template: str | None = None, max_batch: int = 256,
                 max_batch_tokens: int | None = None, prefill_tokens: int = 16384, context: int | None = None,
                 default_max_tokens: int = 1024, gather_s: float = 0.02, ignore_response_format: bool = False,
                 gpu_lock: str | None = None):
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
        self.model = model
        self.tokenizer = tokenizer
        self.name = name
        self.template = chat_template(tokenizer, model.config, template)
        self.device = next(model.parameters()).device
        self.max_batch = max_batch
        model_context = getattr(model.config, "max_position_embeddings", None) or 4096
        self.context = min(context or model_context, model_context)
        self.max_batch_tokens = max_batch_tokens or self._default_batch_tokens()
        self.prefill_tokens = prefill_tokens
        self.default_max_tokens = default_max_tokens
        self.gather_s = gather_s
        self.ignore_response_format = ignore_response_format
        self.gpu_lock = gpu_lock  # a lock file shared with the measurement harness (see _gpu)
        self.end_ids = end_token_ids(tokenizer, model)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self.end_ids)
        self.stats = {"batches": 0, "requests": 0, "prompt_tokens": 0, "completion_tokens": 0,
                      "decode_steps": 0, "row_steps": 0, "slot_steps": 0, "prefill_s": 0.0, "generate_s": 0.0}
        self.batch_sizes: deque[int] = deque(maxlen=1000)  # of the latest batches, oldest first
        self._tokenizer_lock = threading.Lock()  # fast tokenizers are not safe to share across threads
        self._pending: list[Job] = []
        self._cond = threading.Condition()
        self._closed = False
        register(model)
        self._slot_cache: SlotCache | None = None  # allocated when requests arrive, given back when idle
        self._slots: list[Job | None] = []  # the job decoding in each slot
        self._streams: list[random.Random | None] = []
        self.slot_tokens = 0
        self._worker = threading.Thread(target=self._run, name="engine-worker", daemon=True)
        self._worker.start()

    def _default_batch_tokens(self) -> int:
        """Tokens (prompt + new) the slots may hold together: half the free memory as KV cache."""
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
        else:
            free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        per_token = SlotCache.bytes_per_token(self.model.config, next(self.model.parameters()).dtype)
        return max(self.context, int(0.5 * free / per_token))

    # ---- requests -------------------------------------------------------------------------------

    def prompt_ids(self, messages: list[dict]) -> list[int]:
        with self._tokenizer_lock:
            try:
                text = self.tokenizer.apply_chat_template(messages, chat_template=self.template, tokenize=False,
                                                          add_generation_prompt=True)
            except Exception as e:  # noqa: BLE001 - templates raise their own errors (roles out of order, ...)
                raise RequestError(f"the model's chat template refused the messages: {type(e).__name__}: {e}")
            # The template already holds every special token the model expects.
            return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def job(self, body) -> Job:
        """The job for a chat completions request body; ``RequestError`` naming the field when it is bad."""
        return read_request(body, self.prompt_ids, context=self.context, max_batch_tokens=self.max_batch_tokens,
                            default_max_tokens=self.default_max_tokens,
                            ignore_response_format=self.ignore_response_format)

    def submit(self, job: Job, timeout_s: float | None = None) -> Job:
        """Queue ``job`` and wait until the worker has generated it."""
        with self._cond:
            if self._closed:
                raise RequestError("the engine is shutting down", status=503)
            self._pending.append(job)
            self._cond.notify_all()
        if not job.done.wait(timeout_s):
            raise RequestError(f"no answer within {timeout_s} s", status=504)
        return job

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._worker.join(timeout=60)

    # ---- the worker ----------------------------------------------------------------------------

    def _run(self) -> None:
        """Admit queued requests into free slots, decode every busy slot one token a step, hand each
        request back the moment it ends; the slot cache is given back whenever the engine goes idle."""
        while True:
            admitted = self._admit()
            if admitted is None:
                return
            try:
                with self._gpu():
                    if admitted:
                        self._prefill(admitted)
                    if any(self._slots):
                        self._step()
            except Exception as e:  # noqa: BLE001 - a failed step fails the requests in flight, not the server
                self._fail(f"generation failed: {type(e).__name__}: {e}")
            if not any(self._slots):
                self._release()  # idle (or the queue needs longer slots): the next admission sizes a new cache

    @contextlib.contextmanager
    def _gpu(self):
        """Hold the shared GPU lock (``gpu_lock``) for one prefill and decode step, if there is one.

        The measurement harness's children take the same lock to time a kernel, so that the engine
        never runs beside a kernel being timed. The step's GPU work is finished before the lock
        goes, and the engine pauses a moment after it, so that a waiting child gets the lock."""
        if self.gpu_lock is None:
            yield
            return
        with open(self.gpu_lock, "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)
        time.sleep(LOCK_PAUSE_S)

    def _admit(self) -> list[tuple[int, Job]] | None:
        """Queued jobs paired with the free slots they go to (lowest first); None once closed.

        Idle, it waits for requests and gathers those that keep arriving within ``gather_s`` of each
        other (at most ``GATHER_LIMIT_S``), so that a client's burst is prefilled together, then sizes
        the slot cache for them. Busy, it admits the queued jobs that fit a slot, when all of them can
        go in or a sixteenth of the slots are free: each admission is a prefill forward, and one per
        finished row would cost more than the rows gain."""
        with self._cond:
            while not self._pending and not any(self._slots) and not self._closed:
                self._cond.wait()
            if self._closed:
                self._fail("the engine is shutting down", pending=True)
                return None
            if self._slot_cache is None and self._pending:
                deadline = time.monotonic() + max(GATHER_LIMIT_S, self.gather_s)
                while len(self._pending) < self.max_batch and time.monotonic() < deadline:
                    seen = len(self._pending)
                    self._cond.wait(timeout=self.gather_s)
                    if len(self._pending) == seen:
                        break
                self._allocate(max(_need(job) for job in self._pending))
            free = [slot for slot, job in enumerate(self._slots) if job is None]
            fitting = [job for job in self._pending if _need(job) <= self.slot_tokens]
            if not fitting or not free:
                return []
            if len(fitting) > len(free) and len(free) < max(1, len(self._slots) // 16) and any(self._slots):
                return []
            jobs = fitting[: len(free)]
            taken = set(map(id, jobs))
            self._pending = [job for job in self._pending if id(job) not in taken]
            batch_id = self.stats["batches"]
            self.stats["batches"] += 1
            self.batch_sizes.append(len(jobs))
        for job in jobs:
            job.batch_id, job.batch_size = batch_id, len(jobs)
        return list(zip(free, jobs))

    def _allocate(self, need: int) -> None:
        """A slot cache of up to ``max_batch`` slots within ``max_batch_tokens``: each slot holds a full share
        of them, or ``need`` tokens (rounded up) when that is more, and then fewer slots fit. A later job that
        needs longer slots than the cache has waits until the engine is idle, when the cache is sized again."""
        room = min(self.context, self.max_batch_tokens)
        share = self.max_batch_tokens // self.max_batch
        self.slot_tokens = min(room, max(share, -(-need // SLOT_ROUNDING) * SLOT_ROUNDING))
        slots = max(1, min(self.max_batch, self.max_batch_tokens // self.slot_tokens))
        param = next(self.model.parameters())
        self._slot_cache = SlotCache(self.model.config, slots, self.slot_tokens, device=self.device, dtype=param.dtype)
        self._slots = [None] * slots
        self._streams = [None] * slots
        self._lengths = torch.zeros(slots, dtype=torch.long, device=self.device)
        self._temperature = torch.zeros(slots, device=self.device)
        self._top_p = torch.ones(slots, device=self.device)
        self._logits = None

    @torch.inference_mode()
    def _prefill(self, admitted: list[tuple[int, Job]]) -> None:
        """Prefill the prompts of ``admitted`` into their slots, in row chunks of at most ``prefill_tokens``
        padded tokens so that the activations stay bounded, and set their next-token logits."""
        start = time.perf_counter()
        cache = self._slot_cache
        admitted = sorted(admitted, key=lambda pair: len(pair[1].prompt_ids))  # little padding per chunk
        lo = 0
        while lo < len(admitted):
            hi = lo + 1
            while hi < len(admitted) and (hi + 1 - lo) * len(admitted[hi][1].prompt_ids) <= self.prefill_tokens:
                hi += 1
            chunk = admitted[lo:hi]
            length = len(chunk[-1][1].prompt_ids)
            ids = torch.full((len(chunk), length), self.pad_id, dtype=torch.long)
            for row, (_, job) in enumerate(chunk):  # right padding: real tokens from column 0
                ids[row, :len(job.prompt_ids)] = torch.tensor(job.prompt_ids)
            slots = torch.tensor([slot for slot, _ in chunk], device=self.device)
            cache.prefilling(slots)
            hidden = self.model.base_model(input_ids=ids.to(self.device), attention_mask=slots_masks(self.model, None),
                                           position_ids=torch.arange(length, device=self.device)[None].expand(len(chunk), -1),
                                           past_key_values=cache, use_cache=True).last_hidden_state
            last = torch.tensor([len(job.prompt_ids) - 1 for _, job in chunk], device=self.device)
            logits = self.model.get_output_embeddings()(hidden[torch.arange(len(chunk), device=self.device), last])
            if self._logits is None:
                self._logits = logits.new_zeros((len(self._slots), logits.shape[-1]))
            self._logits[slots] = logits
            self._lengths[slots] = last + 1
            self._temperature[slots] = torch.tensor([job.sampling.temperature for _, job in chunk], device=self.device)
            self._top_p[slots] = torch.tensor([job.sampling.top_p for _, job in chunk], device=self.device)
            for slot, job in chunk:
                self._slots[slot] = job
                self._streams[slot] = random.Random(job.sampling.seed)
            lo = hi
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # so that prefill_s times the prefill
        self.stats["prefill_s"] += time.perf_counter() - start
        self.stats["generate_s"] += time.perf_counter() - start

    @torch.inference_mode()
    def _step(self) -> None:
        """Sample a token for every busy slot, hand back the jobs that end, and run one decode forward."""
        start = time.perf_counter()
        rows = max(slot for slot, job in enumerate(self._slots) if job is not None) + 1
        busy = [slot for slot in range(rows) if self._slots[slot] is not None]
        uniform = torch.zeros(rows, device=self.device)
        uniform[busy] = torch.tensor([self._streams[slot].random() for slot in busy], device=self.device)
        temperature = self._temperature[:rows].clone()
        idle = [slot for slot in range(rows) if self._slots[slot] is None]
        if idle:
            temperature[idle] = 0.0  # an idle slot's token is never read: the cheapest one will do
        tokens = sample(self._logits[:rows], temperature, self._top_p[:rows], uniform)
        values = tokens.tolist()
        for slot in busy:
            job = self._slots[slot]
            if self._extend(job, values[slot]):
                self._finish(slot)
        self.stats["decode_steps"] += 1
        self.stats["row_steps"] += len(busy)
        self.stats["slot_steps"] += rows
        if any(self._slots):
            rows = max(slot for slot, job in enumerate(self._slots) if job is not None) + 1
            mask = self._slot_cache.decoding(self._lengths, rows)
            out = self.model(input_ids=tokens[:rows, None], attention_mask=slots_masks(self.model, mask),
                             position_ids=self._lengths[:rows, None], past_key_values=self._slot_cache,
                             use_cache=True, logits_to_keep=1)
            self._logits[:rows] = out.logits[:, -1]
            self._lengths[:rows] += 1
        self.stats["generate_s"] += time.perf_counter() - start

    def _finish(self, slot: int) -> None:
        """Hand ``self._slots[slot]``'s job back to its client and free the slot."""
        job = self._slots[slot]
        self._slots[slot] = None
        self._lengths[slot] = 0
        if job.text is None:
            with self._tokenizer_lock:
                job.text = self.tokenizer.decode(job.token_ids, skip_special_tokens=True)
        with self._cond:
            self.stats["requests"] += 1
            self.stats["prompt_tokens"] += len(job.prompt_ids)
            self.stats["completion_tokens"] += len(job.token_ids)
        job.done.set()

    def _fail(self, error: str, pending: bool = False) -> None:
        """Fail every job in a slot (and, with ``pending``, every queued one) with ``error``."""
        jobs = [job for job in self._slots if job is not None]
        self._slots = [None] * len(self._slots)
        if pending:
            with self._cond:  # the caller may hold it already: Condition's lock is reentrant
                jobs += self._pending
                self._pending = []
        for job in jobs:
            job.error = error
            job.done.set()
        self._release()

    def _release(self) -> None:
        """Give the slot cache back: idle, the GPU is left to whatever runs next on it."""
        if self._slot_cache is None:
            return
        self._slot_cache = self._logits = None
        self._slots = self._streams = []
        self.slot_tokens = 0
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _extend(self, job: Job, token: int) -> bool:
        """Add ``token`` to ``job``; True when the job is finished (end of turn, a stop string, max_tokens)."""
        if token in self.end_ids:
            job.finish_reason = "stop"
            return True
        job.token_ids.append(token)
        if job.sampling.stop and self._stopped(job):
            job.finish_reason = "stop"
            return True
        if len(job.token_ids) >= job.sampling.max_tokens:
            job.finish_reason = "length"
            return True
        return False

    def _stopped(self, job: Job) -> bool:
        """Whether a stop string has appeared; if so the text is cut before it. Only the tail is decoded
        each step (a stop string spans few tokens), the whole text once it matched."""
        tail_tokens = max(len(s) for s in job.sampling.stop) + 8
        with self._tokenizer_lock:
            tail = self.tokenizer.decode(job.token_ids[-tail_tokens:], skip_special_tokens=True)
            if not any(s in tail for s in job.sampling.stop):
                return False
            text = self.tokenizer.decode(job.token_ids, skip_special_tokens=True)
        job.text = text[:min(text.find(s) for s in job.sampling.stop if s in text)]
        return True

    def snapshot(self) -> dict:
        """Counters since start and the latest batch sizes (for /stats)."""
        with self._cond:
            return {**self.stats, "pending": len(self._pending), "batch_sizes": list(self.batch_sizes),
                    "max_batch": self.max_batch, "max_batch_tokens": self.max_batch_tokens,
                    "slots": len(self._slots), "slots_busy": sum(job is not None for job in self._slots),
                    "slot_tokens": self.slot_tokens,
                    "context": self.context, "device": str(self.device)}


def _need(job: Job) -> int:
    """Tokens ``job`` occupies in its slot at most: its prompt and every token it may generate."""
    return len(job.prompt_ids) + job.sampling.max_tokens

