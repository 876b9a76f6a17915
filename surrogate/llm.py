"""LLM forecasters: a language model reads the anchor and candidate kernels and answers bin probabilities.

Two backends share one prompt (Jinja2 templates in ``surrogate/prompts/``) and one parser:

- ``OpenAIForecaster`` talks to any OpenAI-compatible chat completions server (vLLM,
  llama.cpp's server) over HTTP, a bounded thread pool deep, with retries and a cache;
- ``VLLMForecaster`` runs a vLLM engine in-process and generates a whole batch at once.

The answer is a JSON object ``{"failure": p0, "probabilities": [8 numbers]}``: the probability
that the candidate fails (does not compile, crashes, gives a wrong result or times out), then
its speed bins given that it runs. Failure comes first so that a model commits to it before
the bins. It is asked for with a JSON schema so that servers with constrained decoding cannot
answer anything else. An answer without ``failure`` (the format before it was asked for) still
parses, its failure probability NaN. An answer that does not parse becomes an ``unparsed``
forecast (a forced deferral) with the raw text kept: one bad answer, or an unreachable server,
never loses the rest of the batch.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Sequence
from urllib.parse import urlparse

from kernelcast.kernels.records import canonical_params
from kernelcast.surrogate.bins import N_BINS, UPPER_EDGES
from kernelcast.surrogate.forecast import Forecast, ForecastRequest, normalise, unparsed

PROMPT_DIR = Path(__file__).parent / "prompts"
FACTORS = (
    "work: how many elements and FLOPs each kernel computes, and any redundant work",
    "memory access: bytes read and written, coalescing, reuse through registers, shared memory and L2",
    "arithmetic intensity: FLOPs per byte, hence whether the kernel is memory- or compute-bound",
    "divergence: branches and masked lanes within a warp",
    "occupancy: registers and shared memory per block, block size, resident warps per SM",
    "parallelism: number of blocks or programs against the SM count, waves and tail effects",
    "synchronization: barriers, atomics, reductions across threads and blocks",
    "launch overhead: number of kernel launches and host-side work per call",
    "vendor libraries: cuBLAS, cuDNN or fused PyTorch kernels the anchor may already use",
    "data types: precision of loads, stores and accumulation, vector widths, tensor cores",
)
# The answer the model must give; servers with schema-constrained decoding enforce it, in this
# property order (failure first). No numeric bounds: not every server's strict mode accepts them,
# and the parser checks the range.
ANSWER_SCHEMA = {
    "type": "object",
    "properties": {
        "failure": {"type": "number"},
        "probabilities": {"type": "array", "items": {"type": "number"}, "minItems": N_BINS, "maxItems": N_BINS},
    },
    "required": ["failure", "probabilities"],
    "additionalProperties": False,
}

# How a server is asked for schema-constrained output: OpenAI's ``json_schema`` (OpenAI, vLLM,
# llama.cpp's own server) or a ``json_object`` carrying the schema (llama-cpp-python's server).
SCHEMA_STYLES = {
    "json_schema": {"type": "json_schema",
                    "json_schema": {"name": "bin_probabilities", "strict": True, "schema": ANSWER_SCHEMA}},
    "json_object": {"type": "json_object", "schema": ANSWER_SCHEMA},
}


# A schema-constrained answer is about 100 characters; a longer one is runaway generation or a
# misbehaving server, and is refused before parsing so that its size cannot stall the batch.
MAX_ANSWER_CHARS = 20_000


class AnswerError(ValueError):
    """A model answer that does not hold 8 usable bin probabilities (and, if it says, a usable failure probability)."""


@dataclass(frozen=True)
class Answer:
    """A parsed model answer: P(failure) (NaN when the answer does not say), the 8 speed bins given
    that the candidate runs, renormalised, and their raw sum (a health signal)."""

    failure: float
    probabilities: tuple[float, ...]
    raw_sum: float


@lru_cache(maxsize=1)
def _templates():
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(PROMPT_DIR)), undefined=jinja2.StrictUndefined,
                             autoescape=False, keep_trailing_newline=True)
    return env.get_template("system.j2"), env.get_template("user.j2")


@lru_cache(maxsize=1)
def prompt_version() -> str:
    """A short hash of both templates: a changed prompt is a new surrogate version."""
    h = hashlib.sha256()
    for name in ("system.j2", "user.j2"):
        h.update((PROMPT_DIR / name).read_bytes())
    return "prompt-" + h.hexdigest()[:8]


def _bin_rows() -> list[dict]:
    lows = (0.0,) + UPPER_EDGES[:-1]
    return [{"number": i + 1, "low": lo, "high": "inf" if math.isinf(hi) else hi}
            for i, (lo, hi) in enumerate(zip(lows, UPPER_EDGES))]


def code_fence(*sources: str) -> str:
    """A Markdown fence longer than any run of backticks in ``sources``, so kernel text cannot
    close its code block and pose as prompt (comments planted in a kernel stay inside it)."""
    longest = max((len(run) for s in sources for run in re.findall(r"`+", s)), default=0)
    return "`" * max(3, longest + 1)


def build_messages(request: ForecastRequest, facts: str = "") -> list[dict[str, str]]:
    """The chat messages (system, user) that ask for ``request``'s bin probabilities.

    What varies least comes first (system prompt, task, anchor code, candidate code) and the
    launch parameters, case and hardware last, so that a server with prefix caching (vLLM,
    llama.cpp) reuses the encoded kernels across a template's variants, cases and GPUs.
    ``facts`` (``kernelcast.surrogate.physics.why``: what the candidate makes the device do, found on the
    CPU) go in a section of their own before the hardware; without them the prompt is as it was.
    """
    from kernelcast.kernels.ops import get_operation

    op = get_operation(request.op)
    system, user = _templates()
    case_names = list(request.case_names) or [c.name for c in op.cases]
    params = lambda c: canonical_params(c.params) if c.params else "none"  # noqa: E731
    prompt = user.render(
        op=op.name, summary=op.summary, case_names=case_names,
        anchor_runtime_us=[f"{t:.2f}" for t in request.anchor_runtime_us],
        anchor=request.anchor, anchor_params=params(request.anchor),
        candidate=request.candidate, candidate_params=params(request.candidate),
        fence=code_fence(request.anchor.source, request.candidate.source), hw=request.hardware)
    return [
        {"role": "system", "content": system.render(bins=_bin_rows(), factors=FACTORS)},
        {"role": "user", "content": _with_facts(prompt, facts)},
    ]


def _facts_of(request: ForecastRequest) -> str:
    """``kernelcast.surrogate.physics.why`` of the request's facts; what went wrong, where they cannot be found."""
    from kernelcast.surrogate.physics import request_facts, why

    try:
        return why(request_facts(request))
    except Exception as exc:  # noqa: BLE001 - the prompt stands without them
        return f"not found ({type(exc).__name__})"


def _with_facts(text: str, facts: str) -> str:
    """The user prompt with a facts section before its (last) hardware section: after the kernels' code, so
    that text planted in a kernel cannot pose as facts."""
    if not facts:
        return text
    head, mark, tail = text.rpartition("## Hardware\n")
    section = ("## What the candidate makes the device do (found on the CPU: its operators on meta tensors, its "
               f"kernels compiled for the target, timed by a model of the GPU)\n{facts}\n\n")
    return head + section + mark + tail if mark else text + "\n" + section


def _json_objects(text: str):
    """Every JSON object embedded in ``text``, in order (fences and chatter around them are skipped)."""
    decoder = json.JSONDecoder()
    start = text.find("{")
    while start != -1:
        try:
            value, _ = decoder.raw_decode(text, start)
        except (json.JSONDecodeError, RecursionError):  # RecursionError: nesting deeper than Python's stack
            start = text.find("{", start + 1)
            continue
        if isinstance(value, dict):
            yield value
        # From the next brace, not the object's end: an answer wrapped in another object is found too.
        start = text.find("{", start + 1)


def _number(value, what: str) -> float:
    """``value`` as a finite, non-negative float; ``AnswerError`` naming ``what`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise AnswerError(f"{what} is not a number: {value!r}")
    if not math.isfinite(value):
        raise AnswerError(f"{what} is not finite: {value!r}")
    if value < 0:
        raise AnswerError(f"{what} is negative: {value!r}")
    return float(value)


def parse_answer(text: str) -> Answer:
    """The ``Answer`` in a model's text; ``AnswerError`` naming what is wrong otherwise.

    ``failure`` is optional (NaN when absent), but one that is given must be a number in [0, 1]:
    a model that says 80 for 80% says something the parser cannot trust, and the forecast defers.
    """
    if not isinstance(text, str):
        raise AnswerError(f"the answer is not text: {type(text).__name__}")
    if not text.strip():
        raise AnswerError("the answer is empty")
    if len(text) > MAX_ANSWER_CHARS:
        raise AnswerError(f"the answer is huge: {len(text)} characters, more than {MAX_ANSWER_CHARS}")
    answer = next((obj for obj in _json_objects(text) if "probabilities" in obj), None)
    if answer is None:
        raise AnswerError(f"no JSON object with 'probabilities' in the answer: {text[:200]!r}")
    values = answer["probabilities"]
    if not isinstance(values, list) or len(values) != N_BINS:
        got = len(values) if isinstance(values, list) else type(values).__name__
        raise AnswerError(f"expected {N_BINS} probabilities, got {got}")
    values = [_number(p, f"probability of bin {i}") for i, p in enumerate(values, start=1)]
    if not sum(values) > 0:
        raise AnswerError("probabilities sum to zero")
    failure = math.nan
    if "failure" in answer:
        failure = _number(answer["failure"], "the failure probability")
        if failure > 1:
            raise AnswerError(f"the failure probability is above 1: {failure!r}")
    # Models rarely make their numbers sum to exactly 1; the raw sum is kept as a health signal.
    probabilities, raw_sum = normalise(values)
    return Answer(failure, probabilities, raw_sum)


def parse_probabilities(text: str) -> tuple[tuple[float, ...], float]:
    """(8 renormalised probabilities, their raw sum) from a model answer; ``AnswerError`` otherwise."""
    answer = parse_answer(text)
    return answer.probabilities, answer.raw_sum


def forecast_from_answer(request: ForecastRequest, answer: str, surrogate: str, version: str,
                         latency_s: float = 0.0, **extra: float) -> Forecast:
    """The forecast an answer gives, or an ``unparsed`` one that keeps the answer."""
    try:
        parsed = parse_answer(answer)
    except AnswerError:
        # A huge answer is kept only in part: the forecasts table is no place for megabytes.
        kept = answer[:MAX_ANSWER_CHARS] if isinstance(answer, str) else repr(answer)[:MAX_ANSWER_CHARS]
        return unparsed(request, surrogate, version, raw_response=kept, latency_s=latency_s)
    return Forecast(request.candidate.candidate_id, request.anchor.candidate_id, surrogate, version,
                    parsed.probabilities, raw_sum=parsed.raw_sum, latency_s=latency_s, raw_response=answer,
                    extra=extra, failure_probability=parsed.failure)


class _RetryableError(Exception):
    pass


class OpenAIChat:
    """A client of an OpenAI-compatible chat completions server: the base URL checked, retries, a call count.

    Connection errors, timeouts, 429 and 5xx are retried with exponential backoff. The
    forecaster below and the LLM mutation generator (``tasks/llm_generator.py``) share it.
    """

    def __init__(self, base_url: str, model: str, *, timeout_s: float = 60.0, retries: int = 3,
                 backoff_s: float = 0.5):
        parts = urlparse(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"malformed base_url {base_url!r}; expected http(s)://host[:port]/v1")
        try:
            parts.port
        except ValueError:
            raise ValueError(f"malformed base_url {base_url!r}; the port is not a number") from None
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.calls_ = 0  # HTTP requests sent, retries included
        self._lock = threading.Lock()

    def probe(self, timeout_s: float = 10.0) -> None:
        """Fail now, naming the URL, if the server does not answer ``GET /models``."""
        import httpx

        try:
            response = httpx.get(f"{self.base_url}/models", timeout=timeout_s)
            response.raise_for_status()
        except httpx.HTTPError as exc:
            raise ConnectionError(f"the LLM server at {self.base_url} is unreachable: {type(exc).__name__}: "
                                  f"{exc}") from None

    def chat(self, client, messages: list[dict[str, str]], **fields) -> str:
        """The assistant's text for ``messages`` (``fields``: temperature, max_tokens, response_format, ...),
        retrying transient failures with exponential backoff."""
        import httpx

        body = {"model": self.model, "messages": messages, **fields}
        for attempt in range(self.retries + 1):
            try:
                with self._lock:
                    self.calls_ += 1
                try:
                    response = client.post(f"{self.base_url}/chat/completions", json=body)
                except httpx.TransportError as e:  # refused, reset, timed out
                    raise _RetryableError(f"{type(e).__name__}: {e}") from e
                if response.status_code == 429 or response.status_code >= 500:
                    raise _RetryableError(f"HTTP {response.status_code}: {response.text[:200]}")
                response.raise_for_status()
                content = response.json()["choices"][0]["message"]["content"]
                return content if isinstance(content, str) else ""
            except _RetryableError:
                if attempt == self.retries:
                    raise
                time.sleep(self.backoff_s * 2 ** attempt)
        raise AssertionError("unreachable")


class OpenAIForecaster(OpenAIChat):
    """Forecasts from an OpenAI-compatible chat completions server (vLLM, llama.cpp, ...).

    Requests go out ``concurrency`` at a time; connection errors, timeouts, 429 and 5xx are
    retried with exponential backoff. Answers that parse are cached by sha256(model + prompt),
    in memory and, with ``cache_dir``, as JSON files, so a repeated request costs no call.
    """

    name = "llm"

    def __init__(self, base_url: str, model: str, *, concurrency: int = 8, timeout_s: float = 60.0,
                 retries: int = 3, backoff_s: float = 0.5, cache_dir: str | os.PathLike | None = None,
                 temperature: float = 0.0, max_tokens: int = 256, schema_style: str = "json_schema",
                 facts: bool = False):
        super().__init__(base_url, model, timeout_s=timeout_s, retries=retries, backoff_s=backoff_s)
        self.facts = facts  # put what each candidate makes the device do (found on the CPU) in its prompt
        if schema_style not in SCHEMA_STYLES:
            raise ValueError(f"unknown schema_style {schema_style!r}; known: {', '.join(SCHEMA_STYLES)}")
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")
        self.concurrency = concurrency
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.schema_style = schema_style
        self._cache: dict[str, str] = {}

    @property
    def version(self) -> str:
        return f"{self.model}/{prompt_version()}" + ("+facts" if self.facts else "")

    def forecast(self, requests: Sequence[ForecastRequest]) -> list[Forecast]:
        """One forecast per request, in order; failures become ``unparsed`` forecasts."""
        if not requests:
            return []
        import httpx

        prompts = [build_messages(r, _facts_of(r) if self.facts else "") for r in requests]
        with httpx.Client(timeout=self.timeout_s) as client:
            if self.concurrency == 1 or len(requests) == 1:
                return [self._forecast_one(client, r, m) for r, m in zip(requests, prompts)]
            with ThreadPoolExecutor(max_workers=min(self.concurrency, len(requests))) as pool:
                return list(pool.map(lambda rm: self._forecast_one(client, *rm), zip(requests, prompts)))

    def cache_key(self, messages: list[dict[str, str]]) -> str:
        prompt = json.dumps(messages, sort_keys=True, ensure_ascii=False)
        return hashlib.sha256(f"{self.model}\0{prompt}".encode()).hexdigest()

    def _forecast_one(self, client, request: ForecastRequest, messages: list[dict[str, str]]) -> Forecast:
        start = time.perf_counter()
        key = self.cache_key(messages)
        answer = self._cached(key)
        if answer is not None:
            return forecast_from_answer(request, answer, self.name, self.version,
                                        latency_s=time.perf_counter() - start, cached=1.0)
        try:
            answer = self._complete(client, messages)
        except Exception as e:  # noqa: BLE001 - a failed call defers this candidate, never the batch
            return unparsed(request, self.name, self.version, raw_response=f"error: {type(e).__name__}: {e}",
                            latency_s=time.perf_counter() - start)
        forecast = forecast_from_answer(request, answer, self.name, self.version,
                                        latency_s=time.perf_counter() - start, cached=0.0)
        if forecast.parsed:  # an answer that did not parse is asked again next time
            self._store(key, answer)
        return forecast

    def _complete(self, client, messages: list[dict[str, str]]) -> str:
        return self.chat(client, messages, temperature=self.temperature, max_tokens=self.max_tokens,
                         response_format=SCHEMA_STYLES[self.schema_style])

    def _cached(self, key: str) -> str | None:
        with self._lock:
            if key in self._cache:
                return self._cache[key]
        if self.cache_dir is None:
            return None
        path = self.cache_dir / f"{key}.json"
        try:
            answer = json.loads(path.read_text())["answer"]
        except (OSError, ValueError, KeyError):
            return None
        with self._lock:
            self._cache[key] = answer
        return answer

    def _store(self, key: str, answer: str) -> None:
        with self._lock:
            self._cache[key] = answer
        if self.cache_dir is None:
            return
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        # Written to a temporary file and renamed: a crash never leaves a half-written entry.
        fd, tmp = tempfile.mkstemp(dir=self.cache_dir, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump({"model": self.model, "answer": answer}, f)
        os.replace(tmp, self.cache_dir / f"{key}.json")


class VLLMForecaster:
    """Forecasts from an in-process vLLM engine: the whole batch in one ``generate``, JSON-guided."""

    name = "llm-vllm"

    def __init__(self, model_path: str, *, temperature: float = 0.0, max_tokens: int = 256, **engine_kwargs):
        try:
            import vllm
        except ImportError as e:
            raise ImportError("VLLMForecaster needs the 'vllm' package, which is not installed "
                              "(pip install vllm); OpenAIForecaster works with any running server") from e
        self.model_path = model_path
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.engine_ = vllm.LLM(model=model_path, **engine_kwargs)
        self.sampling_ = self._sampling_params(vllm)

    def _sampling_params(self, vllm):
        # Guided decoding moved from ``guided_decoding`` to ``structured_outputs`` across vLLM releases.
        try:
            from vllm.sampling_params import StructuredOutputsParams

            guide = {"structured_outputs": StructuredOutputsParams(json=ANSWER_SCHEMA)}
        except ImportError:
            from vllm.sampling_params import GuidedDecodingParams

            guide = {"guided_decoding": GuidedDecodingParams(json=ANSWER_SCHEMA)}
        return vllm.SamplingParams(temperature=self.temperature, max_tokens=self.max_tokens, **guide)

    @property
    def version(self) -> str:
        return f"{Path(self.model_path).name}/{prompt_version()}"

    def forecast(self, requests: Sequence[ForecastRequest]) -> list[Forecast]:
        """One forecast per request, in order, from a single batched generation."""
        if not requests:
            return []
        start = time.perf_counter()
        outputs = self.engine_.chat([build_messages(r) for r in requests], self.sampling_, use_tqdm=False)
        latency_s = (time.perf_counter() - start) / len(requests)  # the batch's time, shared evenly
        return [forecast_from_answer(r, out.outputs[0].text, self.name, self.version, latency_s=latency_s)
                for r, out in zip(requests, outputs)]
