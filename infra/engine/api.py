"""The OpenAI chat request as the engine reads it: the fields it refuses, a request's sampling, and
the job a request becomes (and is answered from once the worker has generated it)."""

from __future__ import annotations

import secrets
import threading
from dataclasses import dataclass, field
from typing import Callable

# OpenAI fields this engine cannot honour; a request that asks for them is refused, never half-served.
UNSUPPORTED = {"stream": False, "logprobs": False, "tools": None, "tool_choice": None}


class RequestError(ValueError):
    """A request the engine refuses; the message says what is wrong and ``status`` is the HTTP status."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Sampling:
    """How one request is decoded. ``temperature`` 0 is greedy; ``seed`` fixes its random stream."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0
    stop: tuple[str, ...] = ()


@dataclass(eq=False)
class Job:
    """One request in flight: its prompt and sampling, then its result, filled in by the worker."""

    prompt_ids: list[int]
    sampling: Sampling
    token_ids: list[int] = field(default_factory=list)
    text: str | None = None  # set once the job is finished
    finish_reason: str | None = None
    error: str | None = None
    batch_id: int = -1
    batch_size: int = 0
    done: threading.Event = field(default_factory=threading.Event)


def read_request(body, prompt_ids: Callable[[list[dict]], list[int]], *, context: int, max_batch_tokens: int,
                 default_max_tokens: int, ignore_response_format: bool = False) -> Job:
    """The job for a chat completions request body; ``RequestError`` naming the field when it is bad.
    ``prompt_ids`` tokenizes the messages; the limits are the engine's (``Engine.job`` passes them)."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    for key, default in UNSUPPORTED.items():
        if body.get(key, default) not in (default, None, False, []):
            raise RequestError(f"{key!r} is not supported by this engine")
    if body.get("n", 1) != 1:
        raise RequestError(f"'n' must be 1 (one choice per request), got {body['n']!r}")
    fmt = body.get("response_format")
    if fmt not in (None, {"type": "text"}) and not ignore_response_format:
        raise RequestError("'response_format' cannot be enforced by this engine (no constrained decoding); "
                           "send none, serve the model with vLLM or llama.cpp, or start the engine with "
                           "--ignore-response-format to answer unconstrained")
    ids = prompt_ids(_messages(body.get("messages")))
    room = min(context, max_batch_tokens) - len(ids)
    if room < 1:
        raise RequestError(f"the prompt is {len(ids)} tokens; this engine takes at most "
                           f"{min(context, max_batch_tokens) - 1} (context {context} tokens)")
    max_tokens = next((body[k] for k in ("max_completion_tokens", "max_tokens") if body.get(k) is not None), None)
    if max_tokens is None:
        max_tokens = min(default_max_tokens, room)
    _check_number("max_tokens", max_tokens, integer=True, low=1)
    if max_tokens > room:
        raise RequestError(f"the prompt is {len(ids)} tokens and max_tokens is {max_tokens}: "
                           f"{len(ids) + max_tokens} tokens, more than this engine's "
                           f"{min(context, max_batch_tokens)} (context {context} tokens)")
    # OpenAI's defaults; a client may also send null for "the default".
    temperature = 1.0 if body.get("temperature") is None else body["temperature"]
    top_p = 1.0 if body.get("top_p") is None else body["top_p"]
    seed = body.get("seed")
    _check_number("temperature", temperature, low=0.0, high=2.0)
    _check_number("top_p", top_p, low=0.0, high=1.0, open_low=True)
    if seed is None:
        seed = secrets.randbits(63)
    _check_number("seed", seed, integer=True)
    stop = body.get("stop") or ()
    stop = (stop,) if isinstance(stop, str) else stop
    if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) and s for s in stop):
        raise RequestError("'stop' must be a non-empty string or a list of them")
    return Job(ids, Sampling(max_tokens=max_tokens, temperature=float(temperature), top_p=float(top_p),
                             seed=seed, stop=tuple(stop)))


def _check_number(name: str, value, *, integer: bool = False, low=None, high=None, open_low: bool = False):
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise RequestError(f"{name!r} must be {'an integer' if integer else 'a number'}, got {value!r}")
    if low is not None and (value <= low if open_low else value < low) or high is not None and value > high:
        raise RequestError(f"{name!r} is {value!r}, outside {'(' if open_low else '['}{low}, {high}]")


def _messages(messages) -> list[dict]:
    """Chat messages with text content (OpenAI's list-of-parts content is joined into text)."""
    if not isinstance(messages, list) or not messages:
        raise RequestError("'messages' must be a non-empty list of {role, content} objects")
    clean = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise RequestError(f"messages[{i}] must be an object with a 'role' string")
        content = m.get("content")
        if isinstance(content, list):
            if not all(isinstance(p, dict) and p.get("type") == "text" for p in content):
                raise RequestError(f"messages[{i}].content: only text parts are supported")
            content = "".join(str(p.get("text", "")) for p in content)
        if not isinstance(content, str):
            raise RequestError(f"messages[{i}].content must be a string")
        clean.append({"role": m["role"], "content": content})
    return clean
