"""Offline: ``secrets=`` on create goes out as the REST body's ``secrets`` list (issue 13)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from threadbox import AsyncThreadbox, Threadbox
from threadbox._common import create_body

SANDBOX = {
    "id": "sb_1",
    "name": None,
    "state": "running",
    "labels": {},
    "image": "host",
    "created_at": "2026-01-01T00:00:00Z",
    "last_active_at": "2026-01-01T00:00:00Z",
    "limits": {"memory_bytes": 1 << 30, "cpus": 1.0, "pids": 512},
    "idle_pause_secs": None,
    "ttl_secs": None,
    "ttl_action": "stop",
    "agent_pid": None,
}


def test_create_sends_secret_names() -> None:
    seen: dict[str, Any] = {}

    def handler(req: httpx.Request) -> httpx.Response:
        seen["body"] = json.loads(req.content)
        return httpx.Response(201, json=SANDBOX)

    tb = Threadbox("http://127.0.0.1:9", transport=httpx.MockTransport(handler))
    with tb:
        tb.create(secrets=["OPENAI_API_KEY"], on_exit="none")
    assert seen["body"]["secrets"] == ["OPENAI_API_KEY"]


async def test_async_create_sends_secret_names() -> None:
    seen: dict[str, Any] = {}

    def handler(req: httpx.Request) -> httpx.Response:
        seen["body"] = json.loads(req.content)
        return httpx.Response(201, json=SANDBOX)

    async with AsyncThreadbox("http://127.0.0.1:9", transport=httpx.MockTransport(handler)) as tb:
        await tb.create(secrets=("A", "B"), on_exit="none")
    assert seen["body"]["secrets"] == ["A", "B"]


def test_no_secrets_no_field_and_one_string_is_refused() -> None:
    common: dict[str, Any] = dict(
        name=None,
        labels=None,
        image=None,
        memory=None,
        cpus=None,
        pids=None,
        idle_pause_secs=None,
        idle_stop_secs=None,
        ttl_secs=None,
        ttl_action=None,
    )
    assert "secrets" not in create_body(**common)
    with pytest.raises(TypeError):
        create_body(**common, secrets="OPENAI_API_KEY")
