"""Test harness: starts a real ``threadbox serve`` for the session.

The binary comes from ``$THREADBOX_BIN`` (default ``<repo>/target/debug/threadbox``).
Tests that need the daemon skip with a reason when the binary is missing or the
session does not run as root. Unit tests (``tests/unit``) need neither.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import httpx
import pytest

from threadbox import AsyncThreadbox, Threadbox

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLES_DIR = REPO_ROOT / "examples"
START_DEADLINE = float(os.environ.get("THREADBOX_TEST_START_TIMEOUT", "60"))


def threadbox_bin() -> Path:
    return Path(os.environ.get("THREADBOX_BIN") or REPO_ROOT / "target" / "debug" / "threadbox")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _mounts_under(path: Path) -> list[str]:
    prefix = str(path.resolve()) + "/"
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return ["<unknown: cannot read mountinfo>"]
    out = []
    for line in lines:
        parts = line.split()
        if len(parts) > 4 and (parts[4] + "/").startswith(prefix):
            out.append(parts[4])
    return out


class Daemon:
    """A ``threadbox serve`` child process on a private root and port."""

    def __init__(self, binary: Path, base: Path) -> None:
        self.binary = binary
        self.base = base
        self.root = base / "root"
        self.root.mkdir(parents=True, exist_ok=True)
        self.log_path = base / "daemon.log"
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.extra_args = self._extra_args()
        self.starts = 0

    @property
    def socket_path(self) -> Path:
        return self.root / "threadbox.sock"

    def _extra_args(self) -> list[str]:
        extra = os.environ.get("THREADBOX_TEST_SERVE_ARGS", "").split()
        try:
            help_text = subprocess.run(
                [str(self.binary), "serve", "--help"], capture_output=True, timeout=20, check=False
            ).stdout.decode("utf-8", "replace")
        except (OSError, subprocess.TimeoutExpired):
            help_text = ""
        if "--insecure-no-auth" in help_text and "--insecure-no-auth" not in extra:
            extra.append("--insecure-no-auth")
        return extra

    def log_tail(self, n: int = 60) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(lines[-n:])

    def start(self) -> None:
        cmd = [
            str(self.binary),
            "serve",
            "--root",
            str(self.root),
            "--listen",
            f"127.0.0.1:{self.port}",
            *self.extra_args,
        ]
        env = dict(os.environ)
        env.setdefault("RUST_BACKTRACE", "1")
        env.pop("THREADBOX_API_KEY", None)
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child
        log.write(f"\n==== start #{self.starts + 1}: {' '.join(cmd)}\n".encode())
        log.flush()
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        log.close()
        self.starts += 1
        deadline = time.monotonic() + START_DEADLINE
        last_err: Exception | None = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"threadbox serve exited with {self.proc.returncode} during startup:\n{self.log_tail()}"
                )
            try:
                r = httpx.get(self.url + "/healthz", timeout=1.0)
                if r.status_code == 200:
                    return
                last_err = RuntimeError(f"/healthz returned {r.status_code}: {r.text[:200]}")
            except httpx.HTTPError as e:
                last_err = e
            time.sleep(0.05)
        self.kill9()
        raise RuntimeError(f"threadbox serve not healthy after {START_DEADLINE}s ({last_err!r}):\n{self.log_tail()}")

    def kill9(self) -> None:
        """SIGKILLs the daemon (not its sandboxes: they live in their own sessions)."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        self.proc = None

    def restart(self) -> None:
        """``kill -9`` then start again on the same root and port."""
        self.kill9()
        self.start()

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.kill9()


def _skip_reason() -> str | None:
    b = threadbox_bin()
    if not b.is_file():
        return f"threadbox binary not found at {b} (build it with `cargo build` or set THREADBOX_BIN)"
    if hasattr(os, "geteuid") and os.geteuid() != 0:
        return "the threadbox daemon needs root; run the integration tests as root"
    return None


@pytest.fixture(scope="session")
def daemon() -> Iterator[Daemon]:
    """The session's daemon (started on first use)."""
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    parent = os.environ.get("THREADBOX_TEST_TMPDIR") or None
    base = Path(tempfile.mkdtemp(prefix="threadbox-pytest-", dir=parent))
    d = Daemon(threadbox_bin(), base)
    try:
        d.start()
    except Exception as e:
        pytest.fail(f"could not start the daemon: {e}", pytrace=False)
    try:
        yield d
    finally:
        d.stop()
        # The reflink store (ADR 0101) stays mounted while sandboxes are left: detach it
        # (its loop device goes with the last sandbox) so the root can be removed.
        store = d.root / "sandboxes"
        if str(store.resolve()) in _mounts_under(d.root):
            subprocess.run(["umount", "-l", str(store)], capture_output=True, check=False)
        leftover = _mounts_under(base)
        if leftover:
            sys.stderr.write(f"\nthreadbox tests: not removing {base}: mounts remain under it: {leftover[:5]}\n")
        elif os.environ.get("THREADBOX_TEST_KEEP") != "1":
            shutil.rmtree(base, ignore_errors=True)


# The isolation tiers the tier-parameterised suites run on (issue 16):
# ``THREADBOX_TEST_TIERS=jail,gvisor`` (the default) picks them.
TIERS = [t.strip() for t in os.environ.get("THREADBOX_TEST_TIERS", "jail,gvisor").split(",") if t.strip()]


def tier_or_skip(tiers: dict[str, dict[str, object]], name: str) -> dict[str, object]:
    """The daemon's entry for tier ``name``. A tier the daemon lists as unavailable fails
    under CI (scripts/test.sh installs runsc) and is skipped with its reason elsewhere, so
    nothing passes quietly."""
    assert name in tiers, f"the daemon has no tier {name!r}: {sorted(tiers)}"
    t = tiers[name]
    if not t["available"]:
        if os.environ.get("CI"):
            pytest.fail(f"tier {name} is unavailable under CI: {t.get('reason')}")
        pytest.skip(f"tier {name} unavailable: {t.get('reason')}")
    return t


def require_tier(daemon: Daemon, name: str) -> dict[str, object]:
    """[`tier_or_skip`] on the daemon's ``GET /v1/tiers``."""
    r = httpx.get(daemon.url + "/v1/tiers", timeout=30)
    r.raise_for_status()
    return tier_or_skip({t["name"]: t for t in r.json()["tiers"]}, name)


@pytest.fixture(params=TIERS)
def tier(request: pytest.FixtureRequest, daemon: Daemon) -> str:
    """Each isolation tier under test, in turn (see [`require_tier`])."""
    require_tier(daemon, str(request.param))
    return str(request.param)


@pytest.fixture
def daemon_url(daemon: Daemon) -> str:
    return daemon.url


@pytest.fixture
def restart_daemon(daemon: Daemon) -> Callable[[], None]:
    """Call it to ``kill -9`` the daemon and start it again on the same root."""
    return daemon.restart


@pytest.fixture
def tb(daemon: Daemon) -> Iterator[Threadbox]:
    with Threadbox(daemon.url) as client:
        yield client


@pytest.fixture
async def atb(daemon: Daemon) -> AsyncIterator[AsyncThreadbox]:
    client = AsyncThreadbox(daemon.url)
    try:
        yield client
    finally:
        await client.aclose()


class Names:
    """Unique sandbox names for one test; every one is deleted afterwards."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.names: list[str] = []

    def new(self, hint: str = "sb") -> str:
        name = f"pt-{hint}-{uuid.uuid4().hex[:10]}"
        self.names.append(name)
        return name

    def thread(self, hint: str = "t") -> str:
        """A unique thread id whose ``thread-<id>`` sandbox is cleaned up."""
        from langchain_threadbox import thread_sandbox_name

        tid = f"pt-{hint}-{uuid.uuid4().hex[:10]}"
        self.names.append(thread_sandbox_name(tid))
        return tid

    def add(self, name: str) -> str:
        self.names.append(name)
        return name


@pytest.fixture
def names(request: pytest.FixtureRequest) -> Iterator[Names]:
    n = Names(request.node.name)
    yield n
    if not n.names:
        return
    d: Daemon | None = request.getfixturevalue("daemon") if "daemon" in request.fixturenames else None
    if d is None:
        return
    with Threadbox(d.url) as client:
        for name in n.names:
            try:
                client.delete(name, force=True, missing_ok=True)
            except Exception as e:  # cleanup must not hide the test's own result
                sys.stderr.write(f"cleanup of sandbox {name} failed: {e}\n")


class CountingTransport(httpx.BaseTransport):
    """Counts the response body bytes the SDK takes in (what crossed the wire to it)."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.received = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        resp = self.inner.handle_request(request)
        outer = self
        assert isinstance(resp.stream, httpx.SyncByteStream)
        stream: httpx.SyncByteStream = resp.stream  # declared, so the closures below see its type

        class Counted(httpx.SyncByteStream):
            def __iter__(self) -> Iterator[bytes]:
                for chunk in stream:
                    outer.received += len(chunk)
                    yield chunk

            def close(self) -> None:
                stream.close()

        return httpx.Response(resp.status_code, headers=resp.headers, stream=Counted(), extensions=resp.extensions)

    def close(self) -> None:
        self.inner.close()
