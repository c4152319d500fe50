"""Shaping sandbox output for a model's context window."""

from __future__ import annotations

import re
from typing import Any

from threadbox import ExecResult

DEFAULT_MAX_OUTPUT_CHARS = 20_000
# Beyond this share of escaped characters a stream is called binary and not shown.
_BINARY_SHARE = 0.3
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


NEW_SANDBOX_NOTE = (
    "[new sandbox: this conversation's sandbox no longer existed (deleted or expired), so a new, "
    "empty one was created; files and processes from earlier calls are gone]\n"
)
"""The first result after a thread's sandbox was created again starts with this (ADR 0022)."""


def cut_marker(removed: int) -> str:
    """The line put in place of text that was cut."""
    return f"\n[... {removed} characters cut here: output too long for the context ...]\n"


def cut_middle(text: str, limit: int) -> tuple[str, int]:
    """Keeps the head and tail of ``text`` within ``limit`` characters.

    Returns the new text and how many characters were removed (0 when none). The
    removed middle is replaced by a clear marker line, so a model knows that it does
    not see everything (errors usually show up at the end, headers at the start).
    """
    if limit <= 0:
        return ("", 0) if not text else (cut_marker(len(text)).strip(), len(text))
    if len(text) <= limit:
        return text, 0
    head = (limit * 2) // 5
    tail = limit - head
    removed = len(text) - head - tail
    return text[:head] + cut_marker(removed) + text[len(text) - tail :], removed


def safe_text(data: bytes) -> tuple[str, bool]:
    """Text a model (and every provider API) can take: ``(text, binary)``.

    Valid UTF-8 is kept; bytes that are not are shown as ``\\xNN``, and control
    characters other than tab, newline and carriage return (NUL among them) as
    ``\\xNN`` too, so no raw NUL or U+FFFD ever reaches a message. When most of it
    would be escapes, the data is binary: ``binary`` is True and the text is a
    one-line summary instead.
    """
    text = data.decode("utf-8", "backslashreplace")
    escaped = len(data) - len(data.decode("utf-8", "ignore").encode("utf-8"))  # bytes that are not UTF-8
    text, controls = _CONTROL.subn(lambda m: f"\\x{ord(m.group()):02x}", text)
    if data and (escaped + controls) > _BINARY_SHARE * max(len(data), 1):
        return (
            f"[binary output: {len(data)} bytes, not shown; write it to a file and inspect it "
            "with a program, e.g. `xxd file | head`]",
            True,
        )
    return text, False


def human_bytes(n: int) -> str:
    """``256 MiB``, ``1.5 GiB``, ``512 KiB`` or bytes."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n // size} {unit}" if n % size == 0 else f"{n / size:.1f} {unit}"
    return f"{n} bytes"


def status_line(result: ExecResult, timeout: float | None) -> str:
    """The last line of an exec's text: how the call ended."""
    if result.timed_out:
        limit = f" after {timeout:g}s" if timeout is not None else ""
        return (
            f"[timed out{limit}: the process and its children were killed. "
            "Make the program faster or do less per call.]"
        )
    if result.oom_killed:
        limit = f" (limit {human_bytes(result.memory_limit_bytes)})" if result.memory_limit_bytes else ""
        return f"[killed: out of memory{limit}. Use less memory per call: process the data in chunks.]"
    if result.exit_code is None and result.signal is not None:
        return f"[killed by signal {result.signal}]"
    return f"[exit code {result.exit_code}]"


def _split_budget(out_len: int, err_len: int, limit: int) -> tuple[int, int]:
    if out_len + err_len <= limit:
        return out_len, err_len
    err_budget = min(err_len, max(limit // 3, limit - out_len))
    return limit - err_budget, err_budget


def format_exec(
    result: ExecResult,
    *,
    max_chars: int = DEFAULT_MAX_OUTPUT_CHARS,
    timeout: float | None = None,
    sandbox_id: str | None = None,
    sandbox_name: str | None = None,
) -> tuple[str, dict[str, Any]]:
    """Formats an exec result as ``(text for the model, artifact)``.

    The text holds stdout, then stderr under a ``[stderr]`` header, then one status
    line (exit code, timeout, out-of-memory kill or signal). Output that is not
    UTF-8 text is escaped (see :func:`safe_text`). The artifact is plain JSON-able
    data: ``exit_code``, ``timed_out``, ``oom_killed``, ``truncated`` (output
    incomplete for any reason), ``signal``, ``duration_ms``, ``cut_chars``,
    ``sandbox_truncated``, ``binary_output`` and the sandbox.
    """
    out, out_bin = safe_text(result.stdout_bytes)
    err, err_bin = safe_text(result.stderr_bytes)
    out_budget, err_budget = _split_budget(len(out), len(err), max_chars)
    out, out_cut = cut_middle(out, out_budget)
    err, err_cut = cut_middle(err, err_budget)
    parts: list[str] = []
    if out:
        parts.append(out if out.endswith("\n") else out + "\n")
    if err:
        parts.append("[stderr]\n" + (err if err.endswith("\n") else err + "\n"))
    if not parts:
        parts.append("(no output)\n")
    parts.append(status_line(result, timeout))
    artifact: dict[str, Any] = {
        "exit_code": result.exit_code,
        "timed_out": result.timed_out,
        "oom_killed": result.oom_killed,
        "truncated": bool(result.truncated or out_cut or err_cut),
        "sandbox_truncated": result.truncated,
        "cut_chars": out_cut + err_cut,
        "signal": result.signal,
        "duration_ms": result.duration_ms,
        "binary_output": out_bin or err_bin,
    }
    if result.memory_limit_bytes is not None:
        artifact["memory_limit_bytes"] = result.memory_limit_bytes
    if sandbox_id is not None:
        artifact["sandbox_id"] = sandbox_id
    if sandbox_name is not None:
        artifact["sandbox_name"] = sandbox_name
    return "".join(parts), artifact
