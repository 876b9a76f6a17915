"""What a child may say to its worker: JSON of a fixed schema, size-limited, validated; never pickle.

A child runs untrusted code, and that code can write to any file descriptor of its process, the
result pipe included. So the worker reads the pipe's bytes (``Connection.recv_bytes``, which unpickles
nothing) and believes only a message that parses as JSON and matches one of the kinds below, field
by field; anything else is a broken child (``ChannelError``), never an object built by the child. The
worker also keeps its own clock: a phase's time is the child's claim clamped between the previous
phase's time and the moment the worker read it.

What a well-formed message says is still the child's claim: the verdict's correctness comes from the
judge (``kernelcast.kernels.harness.judge``), which never shares a process with candidate code.
"""

from __future__ import annotations

import json
import math
import os

MAX_MESSAGE_BYTES = 1 << 20  # a result with every case's figures is a few KiB
MAX_TEXT = 20_000  # an error message or a check's text, characters
MAX_ITEMS = 4096  # entries of any one list or mapping
MAX_SEEDS = 256  # seeds one request may ask for (a case's rotation sets, budget.MAX_ROTATION_SETS, and more)

STATUSES = ("ok", "compile_error", "runtime_error", "incorrect", "timeout", "crashed", "rejected")
PHASES = frozenset({
    "ahead_done", "anchored", "call", "calling", "case_inputs", "check", "checked", "checks", "exclusive",
    "exclusive_wait", "first_inputs", "locked", "no_control", "not_anchored", "own_figure", "prebuilt", "recheck",
    "released", "releasing", "share_wait", "shared_again", "timed", "timing", "traced", "verified", "waiting",
    "warmed_checks", "seed"})

_NUMBERS = ("runtime_us_median", "runtime_us_iqr", "error_rel", "reference_error_rel", "host_us")
_TEXTS = ("error", "precision", "window_check", "memcheck", "reference_processes", "state")
_FLOATS = ("compile_seconds", "gpu_seconds")
_NAMES = ("case_names", "host_sensitive_cases", "anchored_cases", "unseen_control", "timed_outputs")
_PLAIN = ("prebuilt", "models_built", "anchored_slowed", "rotation_sets", "traced_busy_us", "fastest_call_us",
          "outputs")
RESULT_FIELDS = frozenset(("status", "out_of_memory", "repetitions") + _NUMBERS + _TEXTS + _FLOATS + _NAMES
                          + _PLAIN)


class ChannelError(Exception):
    """A message that is not one the harness sends: too long, not JSON, or not of the schema."""


def _plain(value):
    """JSON for what the harness's own results hold beyond JSON's types (tuples, numpy and torch scalars)."""
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    return str(value)


def encode(*message) -> bytes:
    """One message as the child sends it."""
    return json.dumps(message, default=_plain, separators=(",", ":")).encode()


def send(conn, *message) -> None:
    """Send ``message`` over ``conn`` (a ``multiprocessing`` connection) as bytes, not pickled."""
    conn.send_bytes(encode(*message))


def receive(conn) -> tuple:
    """The next message on ``conn``, validated; ``ChannelError`` when it is not one the harness sends."""
    try:
        data = conn.recv_bytes(MAX_MESSAGE_BYTES)
    except OSError as exc:
        if "bad message length" in str(exc):
            raise ChannelError(f"a message over {MAX_MESSAGE_BYTES} bytes") from None
        raise
    return decode(data)


def decode(data: bytes) -> tuple:
    """A message from its bytes, checked against the schema of its kind."""
    if len(data) > MAX_MESSAGE_BYTES:
        raise ChannelError(f"a message over {MAX_MESSAGE_BYTES} bytes")
    try:
        message = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ChannelError(f"not a JSON message ({exc.__class__.__name__}): {data[:60]!r}") from None
    if not isinstance(message, list) or not message or not isinstance(message[0], str):
        raise ChannelError("a message is a list that starts with its kind")
    kind, args = message[0], message[1:]
    if kind == "phase":
        if len(args) != 3 or args[0] not in PHASES or not _number(args[2]):
            raise ChannelError(f"a phase is [name, detail, time]; got {str(args)[:120]}")
        _check_plain(args[1], "phase detail")
        return ("phase", args[0], args[1], float(args[2]))
    if kind == "seed":  # a request: the worker answers with the seeds it draws (``answer_seeds``)
        if len(args) != 1 or not isinstance(args[0], dict) or set(args[0]) != {"case", "keys"} \
                or not isinstance(args[0]["case"], str) or len(args[0]["case"]) > 200 \
                or not isinstance(args[0]["keys"], list) or not 1 <= len(args[0]["keys"]) <= MAX_SEEDS \
                or not all(isinstance(k, int) and not isinstance(k, bool) for k in args[0]["keys"]):
            raise ChannelError(f"a seed request is {{case, keys}}, 1 to {MAX_SEEDS} keys")
        return ("seed", args[0]["case"], args[0]["keys"])
    if kind in ("sandbox",):
        if len(args) != 1 or not isinstance(args[0], str) or len(args[0]) > MAX_TEXT:
            raise ChannelError("a sandbox report is one string")
        return (kind, args[0])
    if kind in ("result", "probe"):
        if len(args) != 1 or not isinstance(args[0], dict):
            raise ChannelError(f"a {kind} is one mapping")
        return (kind, check_probe(args[0]) if kind == "probe" else check_result(args[0]))
    raise ChannelError(f"unknown message kind {kind[:40]!r}")


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _check_plain(value, where: str, depth: int = 0) -> None:
    """JSON's own types, nested at most four deep, no list or mapping over ``MAX_ITEMS``, no text over ``MAX_TEXT``."""
    if depth > 4:
        raise ChannelError(f"{where}: nested too deep")
    if isinstance(value, str):
        if len(value) > MAX_TEXT:
            raise ChannelError(f"{where}: text over {MAX_TEXT} characters")
    elif isinstance(value, list):
        if len(value) > MAX_ITEMS:
            raise ChannelError(f"{where}: over {MAX_ITEMS} items")
        for v in value:
            _check_plain(v, where, depth + 1)
    elif isinstance(value, dict):
        if len(value) > MAX_ITEMS:
            raise ChannelError(f"{where}: over {MAX_ITEMS} items")
        for k, v in value.items():
            _check_plain(k, where, depth + 1)
            _check_plain(v, where, depth + 1)
    elif value is not None and not isinstance(value, (bool, int, float)):
        raise ChannelError(f"{where}: {type(value).__name__} is not plain data")


def check_result(result: dict) -> dict:
    """A child's result, its fields each of the type the worker reads; ``ChannelError`` otherwise."""
    unknown = sorted(set(result) - RESULT_FIELDS)
    if unknown:
        raise ChannelError(f"result fields the harness does not send: {unknown[:5]}")
    _check_plain(result, "result")
    if result.get("status") not in STATUSES:
        raise ChannelError(f"result status {str(result.get('status'))[:40]!r} is not one of {', '.join(STATUSES)}")
    for name in _TEXTS:
        if name in result and not isinstance(result[name], str):
            raise ChannelError(f"result field {name} must be text")
    for name in _FLOATS:
        if name in result and not (_number(result[name]) and math.isfinite(result[name]) and result[name] >= 0):
            raise ChannelError(f"result field {name} must be a number of seconds")
    for name in _NUMBERS:
        if name in result and not (isinstance(result[name], list)
                                   and all(v is None or _number(v) for v in result[name])):
            raise ChannelError(f"result field {name} must be a list of numbers")
    for name in _NAMES:
        if name in result and not (isinstance(result[name], list) and all(isinstance(v, str) for v in result[name])):
            raise ChannelError(f"result field {name} must be a list of names")
    if "repetitions" in result and not (isinstance(result["repetitions"], list)
                                        and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                                                for v in result["repetitions"])):
        raise ChannelError("result field repetitions must be a list of counts")
    if "out_of_memory" in result and not isinstance(result["out_of_memory"], bool):
        raise ChannelError("result field out_of_memory must be true or false")
    for name in ("runtime_us_median", "runtime_us_iqr"):
        values = [v for v in result.get(name, ()) if v is not None]
        if any(not math.isfinite(v) or v < 0 for v in values):
            raise ChannelError(f"result field {name} holds a runtime that is negative or not finite")
    return result


def check_probe(answer: dict) -> dict:
    """The sandbox probe's answer: ok, the sandbox's summary, an error."""
    if set(answer) - {"ok", "sandbox", "error"} or not isinstance(answer.get("ok"), bool):
        raise ChannelError("a probe answer is {ok, sandbox, error}")
    for name in ("sandbox", "error"):
        if not isinstance(answer.get(name, ""), str) or len(answer.get(name, "")) > MAX_TEXT:
            raise ChannelError(f"probe field {name} must be text")
    return answer


def draw_seed() -> int:
    """A seed from the operating system (63 bits: torch's generators take it as it is)."""
    return int.from_bytes(os.urandom(8), "little") >> 1


def request_seeds(conn, case: str, keys) -> list[int]:
    """The child's side: ask the worker for the seeds of ``case``'s input sets ``keys`` (made together, at once: one
    round trip, not one a set) and wait for them."""
    keys = [int(k) for k in keys]
    send(conn, "seed", {"case": case, "keys": keys})
    seeds = json.loads(conn.recv_bytes(32 * MAX_SEEDS).decode())
    if not isinstance(seeds, list) or len(seeds) != len(keys) or not all(isinstance(s, int) for s in seeds):
        raise ChannelError("the worker's answer to a seed request is not one seed a key")
    return seeds


def answer_seeds(conn, seeds: list[int]) -> None:
    """The worker's side of ``request_seeds``."""
    conn.send_bytes(json.dumps([int(s) for s in seeds]).encode())
