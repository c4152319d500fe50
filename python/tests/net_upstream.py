"""A test upstream for egress tests, the Python twin of ``crates/threadbox/tests/common/upstream.rs``.

Its own netns ``tbp-up-<pid><k>`` joined to the host by a veth pair (host ``10.251.N.1/30``,
netns ``10.251.N.2/30``) runs ``crates/threadbox/tests/network/upstream.py``: HTTP on 8080
(also a local package index: PEP 503 pages, a wheel and an npm registry for ``tbdemo``), a
TCP sink on 9000 and a stub DNS resolver on 53 that answers every A question with the
upstream's address. Verdicts are judged by what reached it (``log(name)``). Everything is
removed on ``close()``.

``egress_daemon(upstream, base)`` starts a daemon whose egress goes to that upstream: DNS
from the stub, the upstream's /30 excepted from the floor (``--egress-allow-private``).
"""

from __future__ import annotations

import itertools
import os
import subprocess
import time
from pathlib import Path

from conftest import REPO_ROOT, Daemon, threadbox_bin

SCRIPT = REPO_ROOT / "crates" / "threadbox" / "tests" / "network" / "upstream.py"
DEADLINE = 30.0
_NEXT = itertools.count()


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


def _free_subnet(seed: int) -> int:
    used = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, check=False).stdout
    for i in range(250):
        n = (seed * 31 + i) % 250 + 1
        if f" 10.251.{n}." not in used:
            return n
    raise RuntimeError("no free 10.251.N/30 for a test upstream")


class Upstream:
    def __init__(self, base: Path) -> None:
        k = next(_NEXT)
        tag = f"{os.getpid()}{k}"
        self.ns = f"tbp-up-{tag}"
        self.host_if = f"tbph{tag}"[:15]
        peer = f"tbpp{tag}"[:15]
        self.net = f"10.251.{_free_subnet(os.getpid() + k * 7)}"
        self.dir = base / f"upstream-{tag}"
        self.dir.mkdir(parents=True)
        self.proc: subprocess.Popen[bytes] | None = None
        try:
            _ip("netns", "add", self.ns)
            _ip("link", "add", self.host_if, "type", "veth", "peer", "name", peer)
            _ip("link", "set", peer, "netns", self.ns)
            _ip("addr", "add", f"{self.net}.1/30", "dev", self.host_if)
            _ip("link", "set", self.host_if, "up")
            _ip("-n", self.ns, "addr", "add", f"{self.addr}/30", "dev", peer)
            _ip("-n", self.ns, "link", "set", peer, "up")
            _ip("-n", self.ns, "link", "set", "lo", "up")
            self.proc = subprocess.Popen(
                ["ip", "netns", "exec", self.ns, "python3", str(SCRIPT), self.addr, str(self.dir)],
                stdin=subprocess.DEVNULL,
            )
            deadline = time.monotonic() + DEADLINE
            while not (self.dir / "ready").exists():
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError("the upstream servers did not start")
                time.sleep(0.05)
        except BaseException:
            self.close()
            raise

    @property
    def addr(self) -> str:
        return f"{self.net}.2"

    def log(self, name: str) -> str:
        try:
            return (self.dir / name).read_text(errors="replace")
        except OSError:
            return ""

    def close(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=30)
            self.proc = None
        # Deleting the netns deletes its veth end and with it the host's.
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True, check=False)
        subprocess.run(["ip", "link", "del", self.host_if], capture_output=True, check=False)


def egress_daemon(up: Upstream, base: Path) -> Daemon:
    """A started daemon whose egress reaches ``up`` (call ``stop()`` when done)."""
    d = Daemon(threadbox_bin(), base)
    d.extra_args += [
        "--egress-dns",
        f"{up.addr}:53",
        "--egress-allow-private",
        f"{up.net}.0/30",
    ]
    d.start()
    return d


def cli(d: Daemon, *args: str) -> subprocess.CompletedProcess[str]:
    """``threadbox ARGS`` over the daemon's operator socket."""
    return subprocess.run(
        [str(d.binary), "--url", f"unix://{d.socket_path}", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
