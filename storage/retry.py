"""How the data root rides out a storage outage: which failures are transient, and how long to retry them.

An S3 endpoint restarting, a dropped connection or a throttled request must not end an
overnight search. Every call the data root makes is idempotent (keyed writes, whole-file
puts, listings, reads), so repeating it is safe; only the waiting needs a policy.
"""

from __future__ import annotations

from dataclasses import dataclass


class StorageError(OSError):
    """An I/O failure at the data root, naming the URI that failed."""


@dataclass(frozen=True)
class RetryPolicy:
    """How long a data root keeps retrying a transient failure: waits of ``backoff_s``, doubling up
    to ``max_backoff_s``, until ``budget_s`` seconds have passed since the first failure."""

    budget_s: float = 120.0
    backoff_s: float = 0.5
    max_backoff_s: float = 8.0

    def __post_init__(self) -> None:
        for name in ("budget_s", "backoff_s", "max_backoff_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not value >= 0:
                raise ValueError(f"retry {name} must be zero or more seconds, got {value!r}")
        if self.backoff_s == 0 and self.budget_s > 0:
            raise ValueError("retry backoff_s must be positive when there is a retry budget")

    def delay(self, attempt: int) -> float:
        """The wait after failed attempt number ``attempt`` (0 for the first)."""
        return min(self.max_backoff_s, self.backoff_s * 2 ** min(attempt, 60))


# Failures that say "the service is not answering right now", by class name so that a local-only
# install (no botocore, aiohttp) classifies the same way. Anything else (a missing file, denied
# access, a corrupt Parquet file) is not retried: waiting would not change the answer.
_TRANSIENT_NAMES = frozenset({
    "EndpointConnectionError", "ConnectionClosedError", "ConnectTimeoutError", "ReadTimeoutError",
    "ProxyConnectionError", "ClientConnectorError", "ClientConnectionError", "ServerDisconnectedError",
    "ClientOSError", "ServerTimeoutError", "ClientPayloadError", "FSTimeoutError", "IncompleteRead",
    "ResponseStreamingError", "RemoteDisconnected"})
_TRANSIENT_CODES = frozenset({"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout",
                              "ServiceUnavailable", "InternalError", "503", "500"})


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc``, or any error that caused it, is a connection failure, timeout, 5xx or throttle."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, (FileNotFoundError, PermissionError)):
            return False
        if isinstance(exc, (ConnectionError, TimeoutError)) or type(exc).__name__ in _TRANSIENT_NAMES:
            return True
        response = getattr(exc, "response", None)
        if isinstance(response, dict):  # botocore's ClientError
            code = str(response.get("Error", {}).get("Code", ""))
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
            if code in _TRANSIENT_CODES or status >= 500:
                return True
        exc = exc.__cause__ or exc.__context__
    return False
