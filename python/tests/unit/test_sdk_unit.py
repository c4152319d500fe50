"""Offline SDK tests against ``httpx.MockTransport``: wire format and error mapping."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

import threadbox
from threadbox import (
    AsyncThreadbox,
    DaemonUnreachable,
    EndEvent,
    FileNotFound,
    OutputEvent,
    ProcessNotFound,
    QuotaExceeded,
    SandboxNotFound,
    SandboxNotRunning,
    StartEvent,
    Threadbox,
    ThreadboxError,
)
from threadbox._common import parse_size, resolve_config

SANDBOX = {
    "id": "sb_1",
    "name": "demo",
    "state": "running",
    "labels": {"a": "b"},
    "image": "host",
    "created_at": "2026-01-01T00:00:00Z",
    "last_active_at": "2026-01-01T00:00:00Z",
    "limits": {"memory_bytes": 1 << 30, "cpus": 1.0, "pids": 512},
    "idle_pause_secs": None,
    "ttl_secs": None,
    "ttl_action": "stop",
    "agent_pid": 42,
}

Handler = Callable[[httpx.Request], httpx.Response]


def err(status: int, code: str, message: str = "boom") -> httpx.Response:
    return httpx.Response(status, json={"error": {"code": code, "message": message}})


def client(handler: Handler, **kw: Any) -> Threadbox:
    return Threadbox("http://daemon.test", transport=httpx.MockTransport(handler), **kw)


def test_config_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("THREADBOX_URL", "unix:///run/tb/threadbox.sock")
    monkeypatch.setenv("THREADBOX_API_KEY", "k1")
    cfg = resolve_config(None, None)
    assert cfg.uds == "/run/tb/threadbox.sock"
    assert cfg.base_url == "http://localhost"
    assert cfg.headers()["Authorization"] == "Bearer k1"
    monkeypatch.delenv("THREADBOX_URL")
    monkeypatch.delenv("THREADBOX_API_KEY")
    cfg = resolve_config(None, None)
    assert cfg.base_url == "http://127.0.0.1:7420" and cfg.uds is None
    assert "Authorization" not in cfg.headers()
    assert resolve_config("localhost:9", "x").base_url == "http://localhost:9"


def test_parse_size() -> None:
    assert parse_size("512M") == 512 << 20
    assert parse_size("1GiB") == 1 << 30
    assert parse_size(1234) == 1234
    with pytest.raises(threadbox.InvalidArgument):
        parse_size("lots")


def test_auth_header_and_create_body() -> None:
    seen: dict[str, Any] = {}

    def handler(req: httpx.Request) -> httpx.Response:
        seen["auth"] = req.headers.get("authorization")
        seen["body"] = json.loads(req.content)
        return httpx.Response(201, json=SANDBOX)

    with client(handler, api_key="secret") as tb:
        sb = tb.create("demo", labels={"a": "b"}, memory="256M", cpus=0.5, ttl_secs=60, ttl_action="delete")
    assert seen["auth"] == "Bearer secret"
    assert seen["body"] == {
        "name": "demo",
        "labels": {"a": "b"},
        "limits": {"memory_bytes": 256 << 20, "cpus": 0.5},
        "ttl_secs": 60,
        "ttl_action": "delete",
    }
    assert sb.created and sb.id == "sb_1" and sb.info.limits.pids == 512 and sb.info.agent_pid == 42


def test_get_or_create_existing_is_not_created() -> None:
    with client(lambda req: httpx.Response(200, json=SANDBOX)) as tb:
        sb = tb.get_or_create("demo")
    assert not sb.created


@pytest.mark.parametrize(
    ("status", "code", "path", "exc"),
    [
        (404, "not_found", "/v1/sandboxes/x", SandboxNotFound),
        (404, "not_found", "/v1/sandboxes/x/files", FileNotFound),
        (404, "not_found", "/v1/sandboxes/x/processes/3/logs", ProcessNotFound),
        (404, "not_found", "/v1/sandboxes/x/exec", SandboxNotFound),
        (404, "not_found", "/v1/sandboxes/x/exec/stream", SandboxNotFound),
        (429, "quota_exceeded", "/v1/sandboxes", QuotaExceeded),
        (409, "sandbox_not_running", "/v1/sandboxes/x/exec", SandboxNotRunning),
        (401, "unauthenticated", "/v1/sandboxes", threadbox.Unauthenticated),
        (403, "permission_denied", "/v1/sandboxes", threadbox.PermissionDenied),
        (413, "payload_too_large", "/v1/sandboxes/x/files", threadbox.PayloadTooLarge),
        (503, "unavailable", "/v1/sandboxes", threadbox.Unavailable),
        (500, "internal", "/v1/sandboxes", threadbox.InternalError),
        (400, "invalid_argument", "/v1/sandboxes", threadbox.InvalidArgument),
        (409, "conflict", "/v1/sandboxes", threadbox.Conflict),
    ],
)
def test_error_mapping(status: int, code: str, path: str, exc: type[ThreadboxError]) -> None:
    body = json.dumps({"error": {"code": code, "message": "m"}}).encode()
    e = threadbox._errors.error_from_response(status, body, path)
    assert type(e) is exc
    assert e.code == code and e.status == status and e.message == "m"


def test_error_mapping_non_json_and_unknown_code() -> None:
    e = threadbox._errors.error_from_response(502, b"<html>bad gateway</html>")
    assert e.code == "internal" and "bad gateway" in e.message
    e = threadbox._errors.error_from_response(418, b'{"error":{"code":"teapot","message":"short and stout"}}')
    assert type(e) is ThreadboxError and e.code == "teapot"


def test_errors_raised_by_client() -> None:
    def handler(req: httpx.Request) -> httpx.Response:
        if "/files" in req.url.path:
            return err(404, "not_found", "no such file")
        return err(404, "not_found", "no such sandbox")

    with client(handler) as tb:
        with pytest.raises(SandboxNotFound) as ei:
            tb.get("nope")
        assert "no such sandbox" in str(ei.value)
        sb = threadbox.Sandbox(tb, threadbox.SandboxInfo.from_dict(SANDBOX))
        with pytest.raises(FileNotFound):
            sb.files.read("missing.txt")
        assert not sb.files.exists("missing.txt")


def test_unreachable() -> None:
    def handler(req: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=req)

    with client(handler) as tb, pytest.raises(DaemonUnreachable) as ei:
        tb.health()
    assert ei.value.code == "unavailable"


def test_exec_body_and_binary_result() -> None:
    seen: dict[str, Any] = {}

    def handler(req: httpx.Request) -> httpx.Response:
        seen["body"] = json.loads(req.content)
        seen["timeout"] = req.extensions["timeout"]
        return httpx.Response(
            200,
            json={
                "exit_code": 3,
                "signal": None,
                "stdout": base64.b64encode(b"\xff\x00ok").decode(),
                "stderr": base64.b64encode(b"warn").decode(),
                "encoding": "base64",
                "timed_out": False,
                "truncated": False,
                "stdout_truncated": False,
                "stderr_truncated": False,
                "duration_ms": 12,
            },
        )

    with client(handler) as tb:
        sb = threadbox.Sandbox(tb, threadbox.SandboxInfo.from_dict(SANDBOX))
        r = sb.exec(["cat"], stdin=b"\xff\xfe", timeout=5, env={"A": "1"}, cwd="/tmp", user="root")
    assert seen["body"] == {
        "command": ["cat"],
        "env": {"A": "1"},
        "cwd": "/tmp",
        "user": "root",
        "stdin": base64.b64encode(b"\xff\xfe").decode(),
        "stdin_encoding": "base64",
        "timeout_secs": 5.0,
    }
    assert seen["timeout"]["read"] == 35.0
    assert r.exit_code == 3 and r.stdout_bytes == b"\xff\x00ok" and r.stderr == "warn" and not r.ok


def test_shell_string_and_no_timeout_means_unbounded_read() -> None:
    seen: dict[str, Any] = {}

    def handler(req: httpx.Request) -> httpx.Response:
        seen["body"] = json.loads(req.content)
        seen["timeout"] = req.extensions["timeout"]
        return httpx.Response(200, json={"exit_code": 0, "stdout": "hi\n", "stderr": "", "encoding": "utf8"})

    with client(handler) as tb:
        sb = threadbox.Sandbox(tb, threadbox.SandboxInfo.from_dict(SANDBOX))
        assert sb.exec("echo hi").stdout == "hi\n"
    assert seen["body"] == {"shell": "echo hi"}
    assert seen["timeout"]["read"] is None


def _ndjson(*events: dict[str, Any]) -> bytes:
    return b"".join(json.dumps(e).encode() + b"\n" for e in events)


STREAM = _ndjson(
    {"type": "start", "pid": 7},
    {"type": "stdout", "data": "a", "encoding": "utf8"},
    {"type": "stderr", "data": base64.b64encode(b"\xff").decode(), "encoding": "base64"},
    {"type": "future_event"},
    {"type": "end", "exit_code": 0, "signal": None, "timed_out": False, "truncated": False, "duration_ms": 5},
)


def test_exec_stream_events() -> None:
    with client(lambda req: httpx.Response(200, content=STREAM)) as tb:
        sb = threadbox.Sandbox(tb, threadbox.SandboxInfo.from_dict(SANDBOX))
        with sb.exec_stream("x") as events:
            evs = list(events)
    assert isinstance(evs[0], StartEvent) and evs[0].pid == 7
    assert evs[1] == OutputEvent("stdout", b"a") and evs[2] == OutputEvent("stderr", b"\xff")
    assert isinstance(evs[3], EndEvent) and evs[3].exit_code == 0
    assert len(evs) == 4


def test_exec_stream_collect_and_error_event() -> None:
    with client(lambda req: httpx.Response(200, content=STREAM)) as tb:
        sb = threadbox.Sandbox(tb, threadbox.SandboxInfo.from_dict(SANDBOX))
        r = sb.exec_stream("x").collect()
    assert r.stdout == "a" and r.stderr_bytes == b"\xff" and r.exit_code == 0

    bad = _ndjson({"type": "start", "pid": 1}, {"type": "error", "code": "quota_exceeded", "message": "too many"})
    with client(lambda req: httpx.Response(200, content=bad)) as tb:
        sb = threadbox.Sandbox(tb, threadbox.SandboxInfo.from_dict(SANDBOX))
        it = sb.exec_stream("x")
        assert isinstance(next(it), StartEvent)
        with pytest.raises(QuotaExceeded):
            next(it)

    cut = _ndjson({"type": "start", "pid": 1})
    with client(lambda req: httpx.Response(200, content=cut)) as tb:
        sb = threadbox.Sandbox(tb, threadbox.SandboxInfo.from_dict(SANDBOX))
        with pytest.raises(threadbox.ProtocolError):
            list(sb.exec_stream("x"))


def test_exec_stream_http_error() -> None:
    with client(lambda req: err(409, "sandbox_not_running")) as tb:
        sb = threadbox.Sandbox(tb, threadbox.SandboxInfo.from_dict(SANDBOX))
        with pytest.raises(SandboxNotRunning):
            list(sb.exec_stream("x"))


async def test_async_stream_and_errors() -> None:
    def handler(req: httpx.Request) -> httpx.Response:
        if req.url.path.endswith("/exec/stream"):
            return httpx.Response(200, content=STREAM)
        return err(429, "quota_exceeded")

    tb = AsyncThreadbox("http://daemon.test", transport=httpx.MockTransport(handler))
    sb = threadbox.AsyncSandbox(tb, threadbox.SandboxInfo.from_dict(SANDBOX))
    evs = [ev async for ev in sb.exec_stream("x")]
    assert [type(e).__name__ for e in evs] == ["StartEvent", "OutputEvent", "OutputEvent", "EndEvent"]
    with pytest.raises(QuotaExceeded):
        await tb.create("x")
    await tb.aclose()


def test_list_params_and_files_wire() -> None:
    calls: list[httpx.Request] = []

    def handler(req: httpx.Request) -> httpx.Response:
        calls.append(req)
        p = req.url.path
        if p == "/v1/sandboxes" and req.method == "GET":
            return httpx.Response(200, json={"sandboxes": [SANDBOX]})
        if p.endswith("/files") and req.method == "PUT":
            if len([c for c in calls if c.method == "PUT"]) == 1:
                return err(404, "not_found", "parent directory does not exist")
            return httpx.Response(204)
        if p.endswith("/files/mkdir"):
            return httpx.Response(204)
        if p.endswith("/files/list"):
            return httpx.Response(
                200,
                json={
                    "entries": [
                        {
                            "name": "a",
                            "path": "/home/user/a",
                            "kind": "dir",
                            "size": 0,
                            "mode": 0o755,
                            "uid": 1000,
                            "gid": 1000,
                            "modified_at": "t",
                            "symlink_target": None,
                        }
                    ]
                },
            )
        return httpx.Response(500)

    with client(handler) as tb:
        sbs = tb.list({"team": "x", "env": "dev"}, state="running")
        assert [s.id for s in sbs] == ["sb_1"]
        sb = sbs[0]
        sb.files.write("d/e/f.bin", b"\x00\x01")
        entries = sb.files.list("/home/user")
    q = calls[0].url.params
    assert q.get_list("label") == ["team=x", "env=dev"] and q["state"] == "running"
    put1, mkdir, put2 = calls[1], calls[2], calls[3]
    assert put1.url.params["path"] == "d/e/f.bin" and put1.content == b"\x00\x01"
    assert mkdir.url.params["path"] == "d/e" and mkdir.url.params["parents"] == "true"
    assert put2.content == b"\x00\x01"
    assert entries[0].is_dir and entries[0].mode == 0o755


def test_context_manager_deletes() -> None:
    calls: list[tuple[str, str]] = []

    def handler(req: httpx.Request) -> httpx.Response:
        calls.append((req.method, str(req.url)))
        if req.method == "POST":
            return httpx.Response(201, json=SANDBOX)
        return httpx.Response(204)

    with client(handler) as tb, tb.create("demo") as sb:
        assert sb.id == "sb_1"
    assert calls[-1] == ("DELETE", "http://daemon.test/v1/sandboxes/sb_1?force=true")
