"""Text for the model: where it works in a threadbox sandbox."""

from __future__ import annotations

__all__ = ["THREADBOX_SYSTEM_PROMPT"]

THREADBOX_SYSTEM_PROMPT = """\
You work in an isolated Linux sandbox. Your files live in your home directory, /home/user: \
you can create and change files there and in /tmp; the rest of the file system is read-only. \
Give file tools absolute paths under /home/user, such as /home/user/project/app.py (a path \
like /notes.md, outside the system's own directories, is taken as /home/user/notes.md). \
Commands run as an ordinary user in /home/user, with no network access. Calls made in one \
message run in parallel: when a step needs the result of another (write a file, then run \
it), make it in a later message."""
