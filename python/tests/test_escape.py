"""The first escape of the adversarial review (issue 10), through the Python SDK and MCP.

A symlink planted in the sandbox, ``/tmp/h -> /proc/self/fd/4/../../../../../../../..``,
once led an exec's working directory and the file API to the host's ``/`` (the agent's
cgroup fd was a host-namespace handle). Judged from the host: a UNIX socket in the
host's ``/tmp`` must see no connection, a host directory must stay unlisted and unread,
and no directory may appear on the host.
"""

from __future__ import annotations

import os
import socket
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Daemon, Names
from test_mcp import mcp_session, text_of

from threadbox import Threadbox, ThreadboxError

pytestmark = pytest.mark.daemon

LINK = "/proc/self/fd/4/../../../../../../../.."


class HostSocket:
    """A world-connectable UNIX socket in the host's /tmp that counts connections."""

    def __init__(self) -> None:
        self.path = Path(f"/tmp/tb-py-sock-{uuid.uuid4().hex[:12]}")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(self.path))
        os.chmod(self.path, 0o777)
        self.sock.listen(16)
        self.hits = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.hits += 1
            conn.close()

    def probe(self) -> str:
        return (
            f"import socket; s = socket.socket(socket.AF_UNIX); s.connect('tmp/{self.path.name}'); print('CONNECTED')"
        )

    def close(self) -> None:
        self.sock.close()
        self.path.unlink(missing_ok=True)


@pytest.fixture
def host_socket() -> Iterator[HostSocket]:
    s = HostSocket()
    yield s
    s.close()


@pytest.fixture
def host_dir() -> Iterator[Path]:
    d = Path(f"/tmp/tb-py-host-{uuid.uuid4().hex[:12]}")
    d.mkdir(mode=0o777)
    os.chmod(d, 0o777)
    (d / "f").write_text("host-secret\n")
    yield d
    for p in sorted(d.parent.glob(d.name + "*"), reverse=True):
        if p.is_dir():
            for q in p.rglob("*"):
                if q.is_file():
                    q.unlink()
            for q in sorted(p.rglob("*"), reverse=True):
                q.rmdir()
            p.rmdir()


def on_host(path: str) -> bool:
    return Path(path).exists()


def test_the_reproduction_fails_through_the_sdk(
    tb: Threadbox, names: Names, host_socket: HostSocket, host_dir: Path
) -> None:
    sb = tb.create(names.new("escape-sdk"))
    assert sb.exec(["sh", "-c", f"ln -s {LINK} /tmp/h && echo planted"]).stdout == "planted\n"
    # Positive control: the same probe reaches the socket from a host process.
    ctl = socket.socket(socket.AF_UNIX)
    ctl.connect(str(host_socket.path))
    ctl.close()
    for user in ("user", "root"):
        r = None
        try:
            r = sb.exec(["python3", "-I", "-c", host_socket.probe()], cwd="/tmp/h", user=user)
        except ThreadboxError as e:
            assert "magic link" in str(e) or "not accessible" in str(e), e
        assert r is None or "CONNECTED" not in r.stdout
    for op in (
        lambda: sb.files.list("/tmp/h/tmp"),
        lambda: sb.files.stat(f"/tmp/h/tmp/{host_dir.name}/f"),
        lambda: sb.files.read(f"/tmp/h/tmp/{host_dir.name}/f"),
        lambda: sb.files.mkdir(f"/tmp/h/tmp/{host_dir.name}-made", parents=False),
        lambda: sb.files.write(f"/tmp/h/tmp/{host_dir.name}-w/sub/f", b"x"),
    ):
        with pytest.raises(ThreadboxError):
            op()
    assert host_socket.hits == 1, "only the host's own control connection may arrive"
    assert not Path(f"/tmp/{host_dir.name}-made").exists()
    assert not Path(f"/tmp/{host_dir.name}-w").exists()


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_the_reproduction_fails_through_mcp(
    daemon: Daemon, names: Names, transport: str, host_socket: HostSocket, host_dir: Path
) -> None:
    name = names.new(f"escape-mcp-{transport}")
    async with mcp_session(daemon, transport) as session:
        r = await session.call_tool("sandbox_create", {"name": name})
        assert not r.isError, text_of(r)
        r = await session.call_tool("exec", {"sandbox": name, "command": f"ln -s {LINK} /tmp/h"})
        assert not r.isError, text_of(r)
        for user in ("user", "root"):
            r = await session.call_tool(
                "exec",
                {
                    "sandbox": name,
                    "command": f'python3 -I -c "{host_socket.probe()}"',
                    "cwd": "/tmp/h",
                    "user": user,
                },
            )
            assert r.isError or "CONNECTED" not in text_of(r), text_of(r)
            r = await session.call_tool("list_files", {"sandbox": name, "path": "/tmp/h/tmp", "user": user})
            assert r.isError and host_dir.name not in text_of(r), text_of(r)
            r = await session.call_tool(
                "read_file", {"sandbox": name, "path": f"/tmp/h/tmp/{host_dir.name}/f", "user": user}
            )
            assert r.isError and "host-secret" not in text_of(r), text_of(r)
            r = await session.call_tool(
                "write_file",
                {"sandbox": name, "path": f"/tmp/h/tmp/{host_dir.name}-mcp/sub/f", "content": "x", "user": user},
            )
            assert r.isError, text_of(r)
    assert host_socket.hits == 0
    assert not on_host(f"/tmp/{host_dir.name}-mcp")
