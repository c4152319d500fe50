"""``tb.templates`` against a mock transport: the request bodies (from a sandbox, a build
with a policy and limits), the answers parsed, the paths of get and delete, and
``create(template=)``."""

from __future__ import annotations

import json

import httpx
import pytest

from threadbox import BuildStep, TemplateInfo, Threadbox

TEMPLATE = {
    "id": "tp-1",
    "name": "base",
    "source": "sandbox sb-1:clean",
    "image": "host",
    "tier": "jail",
    "memory_bytes": 1 << 30,
    "cpus": 1.0,
    "pids": 512,
    "disk_bytes": 10 << 30,
    "labels": {"team": "a"},
    "size_bytes": 4096,
    "method": "reflink",
    "sandboxes": 2,
    "created_at": "2026-01-01T00:00:00Z",
}

SANDBOX = {
    "id": "sb-2",
    "name": None,
    "state": "running",
    "labels": {},
    "image": "host",
    "created_at": "2026-01-01T00:00:00Z",
    "last_active_at": "2026-01-01T00:00:00Z",
    "limits": {"memory_bytes": 1 << 30, "cpus": 1.0, "pids": 512, "disk_bytes": 10 << 30},
    "idle_pause_secs": None,
    "idle_stop_secs": None,
    "ttl_secs": None,
    "ttl_action": "stop",
    "tier": "jail",
    "created": True,
}


def _client(seen: list[httpx.Request]) -> Threadbox:
    def handler(req: httpx.Request) -> httpx.Response:
        seen.append(req)
        if req.url.path == "/v1/templates" and req.method == "POST":
            steps = [
                {"run": r, "exit_code": 0, "stdout": "ok\n", "stderr": ""}
                for r in json.loads(req.content).get("run", [])
            ]
            return httpx.Response(201, json={"template": TEMPLATE, "steps": steps})
        if req.url.path == "/v1/templates":
            return httpx.Response(200, json={"templates": [TEMPLATE]})
        if req.url.path.startswith("/v1/templates/") and req.method == "GET":
            return httpx.Response(200, json=TEMPLATE)
        if req.url.path == "/v1/sandboxes":
            return httpx.Response(201, json=SANDBOX)
        return httpx.Response(204)

    return Threadbox("http://127.0.0.1:1", transport=httpx.MockTransport(handler))


def test_create_from_a_sandbox_and_a_build() -> None:
    seen: list[httpx.Request] = []
    tb = _client(seen)
    t = tb.templates.create("base", from_sandbox="src", checkpoint="clean")
    assert isinstance(t, TemplateInfo) and t.sandboxes == 2 and t.labels == {"team": "a"}
    assert json.loads(seen[-1].content) == {"name": "base", "from": "src", "checkpoint": "clean"}
    t, steps = tb.templates.build("b", run=["pip install x"], network=["pypi.org"], memory="512M")
    assert steps == [BuildStep(run="pip install x", exit_code=0, stdout="ok\n", stderr="")]
    body = json.loads(seen[-1].content)
    assert body["run"] == ["pip install x"] and body["limits"] == {"memory_bytes": 512 << 20}
    assert "pypi.org" in json.dumps(body["network"])
    with pytest.raises(TypeError):
        tb.templates.create("x", run="echo one string")


def test_list_get_delete_and_create_from_a_template() -> None:
    seen: list[httpx.Request] = []
    tb = _client(seen)
    assert [t.name for t in tb.templates.list()] == ["base"]
    assert tb.templates.get("a b").id == "tp-1"
    assert seen[-1].url.raw_path == b"/v1/templates/a%20b"
    tb.templates.delete("base")
    assert seen[-1].method == "DELETE" and seen[-1].url.path == "/v1/templates/base"
    tb.create(template="base", on_exit="none")
    assert json.loads(seen[-1].content)["template"] == "base"
