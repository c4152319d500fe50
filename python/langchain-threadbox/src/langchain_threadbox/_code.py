"""Formatting a stateful ``run_python`` result (an interpreter context's execution) for
the model: text, the last expression's value, the traceback, and images as standard
image content blocks. The artifact carries the metadata, never the image bytes
(artifacts are checkpointed)."""

from __future__ import annotations

import base64
from typing import Any, Literal

from threadbox import Execution

from ._output import cut_middle

ImagesMode = Literal["content", "none"]

_STATUS = {
    "ok": None,
    "exception": "the code raised an exception (the context keeps its variables)",
    "interrupted": "interrupted",
    "timed_out": "timed out after {t:g}s and was interrupted",
    "context_died": "the Python process died",
}


def format_execution(
    ex: Execution,
    *,
    max_chars: int,
    timeout: float,
    images: ImagesMode = "content",
    max_images: int = 4,
) -> tuple[str | list[dict[str, Any]], dict[str, Any]]:
    parts: list[str] = []
    if ex.stdout:
        parts.append(ex.stdout if ex.stdout.endswith("\n") else ex.stdout + "\n")
    if ex.stderr:
        parts.append("[stderr]\n" + ex.stderr + ("" if ex.stderr.endswith("\n") else "\n"))
    blocks: list[dict[str, Any]] = []
    outputs_meta: list[dict[str, Any]] = []
    for o in ex.results:
        outputs_meta.append({"mime_types": sorted(o.data), "is_main_result": o.is_main_result})
        png = o.data.get("image/png")
        if isinstance(png, str):
            size = len(base64.b64decode(png))
            if images == "content" and len(blocks) < max_images:
                blocks.append({"type": "image", "base64": png, "mime_type": "image/png"})
                parts.append(f"[image {len(blocks)}: image/png, {size} bytes, shown below]\n")
            else:
                parts.append(f"[image: image/png, {size} bytes, not shown]\n")
            continue
        text = o.text
        if text is not None:
            parts.append(("Out: " if o.is_main_result else "") + text + "\n")
    if ex.error is not None:
        parts.append(ex.error.traceback or f"{ex.error.name}: {ex.error.value}\n")
    note = _STATUS.get(ex.status)
    if note:
        parts.append(f"[{note.format(t=timeout)}]\n")
    if ex.context_recreated:
        parts.append(
            f"[the Python context was lost ({ex.lost_reason or 'no reason given'}) and made again for this call:"
            " every variable and import from earlier calls is gone]\n"
        )
    elif ex.context_restarted or (ex.status == "context_died"):
        parts.append("[the Python context was restarted: every variable and import from earlier calls is lost]\n")
    elif ex.context_created and ex.execution_count == 1:
        parts.append("[a new Python context was started for this call]\n")
    if ex.truncated:
        parts.append("[some output was cut]\n")
    text, _ = cut_middle("".join(parts) or "[no output]\n", max_chars)
    artifact: dict[str, Any] = {
        "status": ex.status,
        "execution_count": ex.execution_count,
        "context_id": ex.context_id,
        "context_created": ex.context_created,
        "context_restarted": ex.context_restarted,
        "context_recreated": ex.context_recreated,
        "truncated": ex.truncated,
        "outputs": outputs_meta,
    }
    if ex.error is not None:
        artifact["error"] = {"name": ex.error.name, "value": ex.error.value}
    if not blocks:
        return text, artifact
    return [{"type": "text", "text": text}, *blocks], artifact
