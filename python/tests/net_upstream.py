"""Egress test fixtures (issue 13), the Python twin of ``crates/threadbox/tests/common/upstream.rs``.

:class:`Upstream` makes a netns of its own joined to the host by a veth pair (host
``10.250.N.1/30``, netns ``10.250.N.2/30``) and runs ``crates/threadbox/tests/network/upstream.py``
in it: an HTTP server (8080), a TCP sink recording every byte (9000, held open) and a
stub DNS resolver recording every name asked (53). A sandbox's loopback is its own, so
upstreams cannot live on 127/8. Verdicts are judged by what reached these servers.

:func:`egress_daemon` starts a daemon whose resolver is that stub, with ``api.test`` in
its ``--egress-hosts`` and (``allow_private=True``) the /30 excepted from the floor.

Both clean up on every path. Fixtures: ``upstream`` (module scope) and
``egress_daemon_factory``.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import Daemon, _skip_reason, threadbox_bin

ROOT = Path(__file__).resolve().parents[2]
UPSTREAM_PY = ROOT / "crates" / "threadbox" / "tests" / "network" / "upstream.py"
DEADLINE = 30.0
_NEXT = itertools.count()


def _ip(*args: str) -> bool:
    return subprocess.run(["ip", *args], capture_output=True, check=False).returncode == 0


def _free_subnet(pid: int, k: int) -> int:
    """A ``10.250.N`` no host interface uses yet (several test runs share the host)."""
    used = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, check=False).stdout.decode()
    for i in range(250):
        # A different walk from upstream.rs's, so the two suites rarely race for one N.
        n = (pid * 37 + k * 11 + i + 125) % 250 + 1
        if f" 10.250.{n}." not in used:
            return n
    raise RuntimeError("no free 10.250.N/30 for a test upstream")


def wait_for(what: str, cond: Callable[[], bool], deadline: float = DEADLINE) -> None:
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


class Upstream:
    """The upstream netns, its veth and the servers in it."""

    def __init__(self) -> None:
        pid, k = os.getpid(), next(_NEXT)
        n = _free_subnet(pid, k)
        tag = f"{pid % 100000}{k}"
        self.ns = f"tbp-up-{tag}"
        self.host_if = f"tbph{tag}"
        peer = f"tbpp{tag}"
        self.net = f"10.250.{n}"
        self.dir = Path(tempfile.mkdtemp(prefix="tbp-up-"))
        self.proc: subprocess.Popen[bytes] | None = None
        try:
            for args in (
                ["netns", "add", self.ns],
                ["link", "add", self.host_if, "type", "veth", "peer", "name", peer],
                ["link", "set", peer, "netns", self.ns],
                ["addr", "add", f"{self.net}.1/30", "dev", self.host_if],
                ["link", "set", self.host_if, "up"],
                ["-n", self.ns, "addr", "add", f"{self.net}.2/30", "dev", peer],
                ["-n", self.ns, "link", "set", peer, "up"],
                ["-n", self.ns, "link", "set", "lo", "up"],
            ):
                if not _ip(*args):
                    raise RuntimeError(f"ip {' '.join(args)} failed")
            self.proc = subprocess.Popen(
                ["ip", "netns", "exec", self.ns, "python3", str(UPSTREAM_PY), self.addr, str(self.dir)],
                stdin=subprocess.DEVNULL,
            )
            wait_for("the upstream servers", lambda: (self.dir / "ready").exists())
        except BaseException:
            self.close()
            raise

    @property
    def addr(self) -> str:
        return f"{self.net}.2"

    def log(self, name: str) -> str:
        try:
            return (self.dir / name).read_bytes().decode("utf-8", "replace")
        except OSError:
            return ""

    def hosts_file(self) -> Path:
        p = self.dir / "hosts"
        p.write_text(f"{self.addr} api.test\n")
        return p

    def serve_args(self, *, allow_private: bool) -> list[str]:
        args = ["--egress-hosts", str(self.hosts_file()), "--egress-dns", f"{self.addr}:53"]
        if allow_private:
            args += ["--egress-allow-private", f"{self.net}.0/30"]
        return args

    def close(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None
        # Deleting the netns deletes its veth end and with it the host's; the host end
        # is deleted on its own too, in case the netns was never made.
        _ip("netns", "del", self.ns)
        _ip("link", "del", self.host_if)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    if shutil.which("ip") is None:
        pytest.skip("iproute2 (`ip`) is needed for the egress upstream")
    up = Upstream()
    try:
        yield up
    finally:
        up.close()


@pytest.fixture(scope="module")
def egress_daemon_factory(upstream: Upstream) -> Iterator[Callable[..., Daemon]]:
    """Starts daemons that reach ``upstream`` (stopped at the end of the module)."""
    started: list[Daemon] = []

    def start(*, allow_private: bool = True, extra: list[str] | None = None) -> Daemon:
        base = Path(tempfile.mkdtemp(prefix="threadbox-pytest-net-"))
        d = Daemon(threadbox_bin(), base)
        d.extra_args += upstream.serve_args(allow_private=allow_private) + list(extra or [])
        started.append(d)
        d.start()
        return d

    try:
        yield start
    finally:
        for d in started:
            _delete_all(d)
            d.stop()
            shutil.rmtree(d.base, ignore_errors=True)


def _delete_all(d: Daemon) -> None:
    """Sandboxes outlive the daemon by design: delete them so tests leave nothing."""
    import httpx

    try:
        r = httpx.get(d.url + "/v1/sandboxes", timeout=10)
        for sb in r.json().get("sandboxes", []):
            httpx.delete(f"{d.url}/v1/sandboxes/{sb['id']}", params={"force": "true"}, timeout=60)
    except (httpx.HTTPError, ValueError):
        pass
