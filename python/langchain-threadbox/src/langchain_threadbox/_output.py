"""Shaping sandbox output for a model's context window."""

from __future__ import annotations

from typing import Any

from threadbox import ExecResult

DEFAULT_MAX_OUTPUT_CHARS = 20_000


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
    line (exit code, timeout or signal). The artifact is plain JSON-able data:
    ``exit_code``, ``timed_out``, ``truncated`` (output incomplete for any reason),
    ``signal``, ``duration_ms``, ``cut_chars``, ``sandbox_truncated`` and the sandbox.
    """
    out, err = result.stdout, result.stderr
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
    if result.truncated:
        parts.append("[the sandbox captured only the first part of the output]\n")
    if result.timed_out:
        limit = f" after {timeout:g}s" if timeout is not None else ""
        parts.append(
            f"[timed out{limit}: the process and its children were killed. "
            "Make the program faster or do less per call.]"
        )
    elif result.exit_code is None and result.signal is not None:
        parts.append(f"[killed by signal {result.signal}]")
    else:
        parts.append(f"[exit code {result.exit_code}]")
    artifact: dict[str, Any] = {
        "exit_code": result.exit_code,
        "timed_out": result.timed_out,
        "truncated": bool(result.truncated or out_cut or err_cut),
        "sandbox_truncated": result.truncated,
        "cut_chars": out_cut + err_cut,
        "signal": result.signal,
        "duration_ms": result.duration_ms,
    }
    if sandbox_id is not None:
        artifact["sandbox_id"] = sandbox_id
    if sandbox_name is not None:
        artifact["sandbox_name"] = sandbox_name
    return "".join(parts), artifact
