"""File names that are not UTF-8: shown escaped (``caf\\xe9.txt``), accepted back.

The daemon's files API carries paths as UTF-8 text, so a name with other bytes is
listed with U+FFFD and cannot be named in a request. The tools show such a name
with Python's ``backslashreplace`` escapes, and a path whose ``\\xNN`` escapes stand
for bytes that are not UTF-8 is handled through a small program in the sandbox.
"""

from __future__ import annotations

import re

__all__ = ["RAW_READ", "RAW_WRITE", "escape_name", "raw_path"]

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


# Programs run in the sandbox for such paths (argv[1] is the path in hex).
_ERRORS = (
    "except FileNotFoundError: sys.exit(3)\n"
    "except PermissionError: sys.exit(4)\n"
    "except IsADirectoryError: sys.exit(5)\n"
)
RAW_READ = (
    "import os, sys\n"
    "try:\n"
    "    p = os.path.join(b'/home/user', bytes.fromhex(sys.argv[1]))\n"
    "    with open(p, 'rb') as f: sys.stdout.buffer.write(f.read(int(sys.argv[2])))\n" + _ERRORS
)
RAW_WRITE = (
    "import os, sys\n"
    "try:\n"
    "    p = os.path.join(b'/home/user', bytes.fromhex(sys.argv[1]))\n"
    "    os.makedirs(os.path.dirname(p), exist_ok=True)\n"
    "    with open(p, 'wb') as f: f.write(sys.stdin.buffer.read())\n" + _ERRORS
)
RAW_EXIT_CODES = {3: "not_found", 4: "permission_denied", 5: "is_directory"}
