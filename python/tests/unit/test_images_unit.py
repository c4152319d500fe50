"""``tb.images`` against a mock transport: the pull's NDJSON stream (progress heard,
``done`` returned, ``error`` raised), listing and removal paths."""

from __future__ import annotations

import json

import httpx
import pytest

from threadbox import ImageInfo, Threadbox, ThreadboxError

IMAGE = {
    "name": "localhost:5000/app:1",
    "kind": "oci",
    "path": "/r/oci/images/x.json",
    "created_at": "2026-01-01T00:00:00Z",
    "reference": "localhost:5000/app:1",
    "digest": "sha256:" + "a" * 64,
    "layers": 2,
    "size_bytes": 1234,
    "sandboxes": 0,
}


def _client(lines: list[dict[str, object]], seen: list[httpx.Request]) -> Threadbox:
    def handler(req: httpx.Request) -> httpx.Response:
        seen.append(req)
        if req.url.path == "/v1/images/pull":
            body = "".join(json.dumps(x) + "\n" for x in lines)
            return httpx.Response(200, content=body.encode(), headers={"content-type": "application/x-ndjson"})
        if req.url.path == "/v1/images" and req.method == "GET":
            return httpx.Response(200, json={"images": [IMAGE]})
        return httpx.Response(204)

    return Threadbox("http://127.0.0.1:1", transport=httpx.MockTransport(handler))


def test_pull_reports_progress_and_returns_the_image() -> None:
    seen: list[httpx.Request] = []
    events: list[dict[str, object]] = [
        {"event": "resolved", "digest": IMAGE["digest"], "layers": 2, "bytes": 1234},
        {"event": "progress", "bytes": 1234, "total": 1234},
        {"event": "layer", "index": 0, "cached": False},
        {"event": "done", "image": IMAGE},
    ]
    heard: list[dict[str, object]] = []
    with _client(events, seen) as tb:
        img = tb.images.pull("localhost:5000/app:1", platform="linux/amd64", on_progress=heard.append)
        assert isinstance(img, ImageInfo) and img.layers == 2 and img.kind == "oci"
        assert [e["event"] for e in heard] == ["resolved", "progress", "layer", "done"]
        body = json.loads(seen[0].content)
        assert body["reference"] == "localhost:5000/app:1" and body["platform"] == "linux/amd64"
        assert "password" not in body
        assert [i.name for i in tb.images.list()] == [IMAGE["name"]]
        tb.images.remove("localhost:5000/app:1")
        assert seen[-1].method == "DELETE"
        assert seen[-1].url.raw_path == b"/v1/images/localhost%3A5000%2Fapp%3A1"


def test_an_error_line_raises_its_typed_error() -> None:
    seen: list[httpx.Request] = []
    events: list[dict[str, object]] = [
        {"event": "resolved", "digest": IMAGE["digest"], "layers": 1, "bytes": 10},
        {"event": "error", "code": "unavailable", "message": "refused: blob sha256:… arrived with digest"},
    ]
    with _client(events, seen) as tb, pytest.raises(ThreadboxError, match="arrived with digest"):
        tb.images.pull("localhost:5000/app:1")
