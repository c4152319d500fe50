"""Typed exceptions for the daemon's stable error codes."""

from __future__ import annotations

from typing import Any

__all__ = [
    "Conflict",
    "DaemonUnreachable",
    "FileNotFound",
    "InternalError",
    "InvalidArgument",
    "NotFound",
    "PayloadTooLarge",
    "PermissionDenied",
    "ProcessNotFound",
    "ProtocolError",
    "QuotaExceeded",
    "SandboxNotFound",
    "SandboxNotRunning",
    "ThreadboxError",
    "Unauthenticated",
    "Unavailable",
    "error_from_response",
]


class ThreadboxError(Exception):
    """Base class of every error raised by the SDK.

    Attributes:
        code: The daemon's stable error code (``"not_found"``, ``"quota_exceeded"``,
            ...). SDK-side failures use ``"unavailable"`` (daemon unreachable) or
            ``"protocol"`` (unexpected response).
        message: Human-readable message from the daemon.
        status: HTTP status of the response, when there was one.
    """

    code: str = "unknown"

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        status: int | None = None,
        body: Any = None,
    ) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
        self.message = message
        self.status = status
        self.body = body

    def __str__(self) -> str:
        return f"[{self.code}] {self.message}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, message={self.message!r}, status={self.status!r})"


class NotFound(ThreadboxError):
    """The sandbox, process or file does not exist (``not_found``)."""

    code = "not_found"


class SandboxNotFound(NotFound):
    """The named sandbox does not exist."""


class FileNotFound(NotFound):
    """The file or directory does not exist inside the sandbox."""


class ProcessNotFound(NotFound):
    """The background process does not exist."""


class InvalidArgument(ThreadboxError):
    """The request was malformed or a value was out of range (``invalid_argument``)."""

    code = "invalid_argument"


class Conflict(ThreadboxError):
    """The request conflicts with the current state (``conflict``)."""

    code = "conflict"


class PreconditionFailed(ThreadboxError):
    """``If-Match`` named a generation that is no longer current; nothing changed
    (``precondition_failed``)."""

    code = "precondition_failed"


class Unauthenticated(ThreadboxError):
    """Missing or invalid API key (``unauthenticated``)."""

    code = "unauthenticated"


class PermissionDenied(ThreadboxError):
    """The key or the sandbox user may not do this (``permission_denied``)."""

    code = "permission_denied"


class QuotaExceeded(ThreadboxError):
    """A tenant or daemon quota would be exceeded (``quota_exceeded``)."""

    code = "quota_exceeded"


class SandboxNotRunning(ThreadboxError):
    """The sandbox is paused or stopped (``sandbox_not_running``)."""

    code = "sandbox_not_running"


class PayloadTooLarge(ThreadboxError):
    """The request body is too large (``payload_too_large``)."""

    code = "payload_too_large"


class Unavailable(ThreadboxError):
    """The daemon cannot serve the request now (``unavailable``)."""

    code = "unavailable"


class DaemonUnreachable(Unavailable):
    """The SDK could not reach the daemon at all (connection refused, timeout, ...)."""


class InternalError(ThreadboxError):
    """The daemon failed unexpectedly (``internal``)."""

    code = "internal"


class ProtocolError(ThreadboxError):
    """The daemon answered something the SDK did not understand."""

    code = "protocol"


_BY_CODE: dict[str, type[ThreadboxError]] = {
    "not_found": NotFound,
    "invalid_argument": InvalidArgument,
    "conflict": Conflict,
    "precondition_failed": PreconditionFailed,
    "unauthenticated": Unauthenticated,
    "permission_denied": PermissionDenied,
    "quota_exceeded": QuotaExceeded,
    "sandbox_not_running": SandboxNotRunning,
    "payload_too_large": PayloadTooLarge,
    "unavailable": Unavailable,
    "internal": InternalError,
}

_BY_STATUS: dict[int, str] = {
    400: "invalid_argument",
    401: "unauthenticated",
    403: "permission_denied",
    404: "not_found",
    409: "conflict",
    412: "precondition_failed",
    413: "payload_too_large",
    429: "quota_exceeded",
    503: "unavailable",
}


def _not_found_class(path: str, message: str) -> type[ThreadboxError]:
    """Picks the most specific ``NotFound`` subclass from the request path and message."""
    parts = [p for p in path.split("/") if p]
    if parts[:2] != ["v1", "sandboxes"] or len(parts) < 3:
        return NotFound
    if len(parts) == 3:  # /v1/sandboxes/{sandbox}
        return SandboxNotFound
    # /v1/sandboxes/{sandbox}/<resource>...: the daemon says "sandbox X not found"
    # when the sandbox itself is missing.
    lowered = message.lower()
    if lowered.startswith("sandbox ") or "no such sandbox" in lowered:
        return SandboxNotFound
    resource = parts[3]
    if resource == "files":
        return FileNotFound
    if resource == "processes" and len(parts) > 4:
        return ProcessNotFound
    # A program missing inside the sandbox is an exec *result* (exit code 127), so
    # not_found on exec can only mean the sandbox itself.
    if resource in ("exec", "pause", "resume", "stop", "start", "selftest"):
        return SandboxNotFound
    return NotFound


def error_from_code(
    code: str,
    message: str,
    *,
    status: int | None = None,
    path: str = "",
    body: Any = None,
) -> ThreadboxError:
    """Builds the typed exception for a daemon error code."""
    cls = _BY_CODE.get(code, ThreadboxError)
    if cls is NotFound:
        cls = _not_found_class(path, message)
    return cls(message, code=code, status=status, body=body)


def error_from_response(status: int, content: bytes, path: str = "") -> ThreadboxError:
    """Maps an HTTP error response (status and body) to a typed exception.

    The daemon sends ``{"error": {"code": ..., "message": ...}}``; anything else is
    mapped from the HTTP status so that a proxy's error page still gives a useful type.
    """
    import json

    code: str | None = None
    message = ""
    body: Any = None
    try:
        body = json.loads(content) if content else None
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        err = body["error"]
        code = str(err.get("code") or "") or None
        message = str(err.get("message") or "")
    if code is None:
        code = _BY_STATUS.get(status, "internal" if status >= 500 else "unknown")
        text = content[:500].decode("utf-8", "replace").strip()
        message = f"HTTP {status}" + (f": {text}" if text else "")
    return error_from_code(code, message or f"HTTP {status}", status=status, path=path, body=body)
