"""File names that are not UTF-8: shown escaped (``caf\\xe9.txt``), accepted back.

The daemon's files API lists such a name with its bytes (``name_b64``), which the SDK
decodes with ``surrogateescape``. The tools show it with Python's ``backslashreplace``
escapes (text a model can copy), and a path whose ``\\xNN`` escapes stand for bytes
that are not UTF-8 is turned back into those bytes for the SDK (ADR 0026).
"""

from __future__ import annotations

import re

__all__ = ["escape_name", "raw_path", "sdk_path"]

_ESCAPE = re.compile(rb"\\x([0-9a-fA-F]{2})")


def escape_name(raw: bytes) -> str:
    """``b"caf\\xe9.txt"`` -> ``"caf\\\\xe9.txt"`` (valid UTF-8 is kept as it is)."""
    return raw.decode("utf-8", "backslashreplace")


def raw_path(path: str) -> bytes | None:
    """The bytes an escaped path stands for, or None when it is a plain path.

    Only escapes that make the name invalid UTF-8 count, which is exactly what
    :func:`escape_name` produces; a real name such as ``a\\x41`` (valid once
    unescaped) is left alone.
    """
    if "\\x" not in path:
        return None
    raw = _ESCAPE.sub(lambda m: bytes([int(m.group(1), 16)]), path.encode("utf-8"))
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw
    return None


def sdk_path(path: str) -> str:
    """The path to give the SDK: an escaped name becomes the ``surrogateescape`` text
    the SDK sends as bytes (``path_b64``); a plain path stays as it is."""
    raw = raw_path(path)
    return path if raw is None else raw.decode("utf-8", "surrogateescape")
