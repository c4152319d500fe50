"""The SDK against a real daemon: every method, errors, streaming, files, concurrency."""

from __future__ import annotations

import asyncio
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import CountingTransport, Daemon, Names

import threadbox
from threadbox import (
    AsyncThreadbox,
    EndEvent,
    FileNotFound,
    OutputEvent,
    Sandbox,
    SandboxNotFound,
    SandboxNotRunning,
    StartEvent,
    Threadbox,
)

pytestmark = pytest.mark.daemon


def test_health(tb: Threadbox) -> None:
    h = tb.health()
    assert h.status and h.version


def test_unix_socket(daemon: Daemon) -> None:
    if not daemon.socket_path.exists():
        pytest.fail(f"the daemon has no unix socket at {daemon.socket_path} (INTERFACES.md says it keeps one)")
    with Threadbox(f"unix://{daemon.socket_path}") as client:
        assert client.health().status


def test_env_configuration(daemon: Daemon, monkeypatch: pytest.MonkeyPatch, names: Names) -> None:
    monkeypatch.setenv("THREADBOX_URL", daemon.url)
    with Threadbox() as client:
        assert client.url == daemon.url
        sb = client.create(names.new("env"))
        assert client.get(sb.id).name == sb.name


def test_create_get_list_delete(tb: Threadbox, names: Names) -> None:
    name = names.new("crud")
    label = {"pt-suite": name}
    sb = tb.create(name, labels={**label, "kind": "crud"}, memory="256M", cpus=0.5, pids=128)
    assert sb.created and sb.name == name and sb.state == "running"
    assert sb.labels == {**label, "kind": "crud"}
    assert sb.info.limits.memory_bytes == 256 << 20 and sb.info.limits.pids == 128
    assert sb.info.limits.cpus == pytest.approx(0.5)
    by_name, by_id = tb.get(name), tb.get(sb.id)
    assert by_name.id == by_id.id == sb.id
    assert [s.id for s in tb.list(label)] == [sb.id]
    assert [s.id for s in tb.list({**label, "kind": "crud"}, state="running")] == [sb.id]
    assert tb.list({**label, "kind": "other"}) == []
    assert [s.id for s in Sandbox.list(label, client=tb)] == [sb.id]
    sb.delete()
    with pytest.raises(SandboxNotFound) as ei:
        tb.get(name)
    assert ei.value.code == "not_found" and ei.value.status == 404
    with pytest.raises(SandboxNotFound):
        tb.delete(name)
    tb.delete(name, missing_ok=True)


def test_get_or_create_is_idempotent(tb: Threadbox, names: Names) -> None:
    name = names.new("goc")
    a = tb.get_or_create(name)
    b = tb.get_or_create(name)
    c = Sandbox.get_or_create(name, client=tb)
    assert a.created and not b.created and not c.created
    assert a.id == b.id == c.id


def test_exec_basics(tb: Threadbox, names: Names) -> None:
    sb = tb.create(names.new("exec"))
    r = sb.exec("echo out; echo err >&2; exit 3")
    assert (r.exit_code, r.stdout, r.stderr, r.timed_out, r.truncated) == (3, "out\n", "err\n", False, False)
    assert r.duration_ms >= 0
    r = sb.exec(["python3", "-c", "import os,sys; print(os.getuid(), os.getcwd(), os.environ['X'])"], env={"X": "y"})
    assert r.ok and r.stdout == "1000 /home/user y\n"
    assert sb.exec(["pwd"], cwd="/tmp").stdout == "/tmp\n"
    assert sb.exec(["id", "-u"], user="root").stdout.strip() == "0"
    assert sb.exec(["cat"], stdin="from stdin").stdout == "from stdin"
    assert sb.exec(["cat"], stdin=b"\xff\x00\x01").stdout_bytes == b"\xff\x00\x01"
    r = sb.exec("printf '\\377\\000abc'; printf '\\376' >&2")
    assert r.stdout_bytes == b"\xff\x00abc" and r.stderr_bytes == b"\xfe"
    assert sb.exec("no-such-binary-xyz").exit_code == 127
    # A missing program is a result (127, as a shell reports it), not an API error.
    r = sb.exec(["no-such-binary-xyz"])
    assert r.exit_code == 127 and "command not found" in r.stderr


def test_exec_no_network(tb: Threadbox, names: Names) -> None:
    sb = tb.create(names.new("net"))
    code = (
        "import socket\n"
        "try:\n socket.create_connection(('1.1.1.1', 53), timeout=2); print('online')\n"
        "except OSError as e: print('offline', e)"
    )
    assert sb.exec(["python3", "-c", code], timeout=20).stdout.startswith("offline")


def test_exec_timeout_kills_tree(tb: Threadbox, names: Names) -> None:
    sb = tb.create(names.new("timeout"))
    t0 = time.monotonic()
    r = sb.exec("echo before; (sleep 60 &) ; setsid sleep 61 & sleep 62", timeout=1.5)
    assert time.monotonic() - t0 < 20
    assert r.timed_out and r.exit_code is None and "before" in r.stdout
    ps = sb.exec(["sh", "-c", "ps -eo args 2>/dev/null || ls /proc"]).stdout
    assert "sleep 6" not in ps


def test_exec_background_child_does_not_hang(tb: Threadbox, names: Names) -> None:
    sb = tb.create(names.new("bg"))
    t0 = time.monotonic()
    r = sb.exec("nohup sleep 30 >/dev/null 2>&1 & echo started", timeout=20)
    assert r.exit_code == 0 and "started" in r.stdout and time.monotonic() - t0 < 10
    r = sb.exec("sleep 30 & echo held-open", timeout=20)  # child keeps stdout open
    assert r.exit_code == 0 and "held-open" in r.stdout and time.monotonic() - t0 < 20


def test_exec_output_bound(tb: Threadbox, names: Names) -> None:
    sb = tb.create(names.new("trunc"))
    r = sb.exec("head -c 100000 /dev/zero | tr '\\0' x; echo; echo SUMMARY", max_output_bytes=1000)
    assert r.truncated and r.stdout_truncated and not r.stderr_truncated
    # The bound keeps the head and the tail (the last lines are where summaries are),
    # with one marker line between them.
    assert len(r.stdout_bytes) <= 1000 and r.exit_code == 0  # the marker fits inside the bound
    assert r.stdout.startswith("xxxx") and r.stdout.endswith("xxx\nSUMMARY\n")
    assert "bytes of output cut here by the sandbox" in r.stdout


def test_exec_stream_keeps_the_tail(tb: Threadbox, names: Names) -> None:
    sb = tb.create(names.new("trunc-stream"))
    r = sb.exec_stream("head -c 100000 /dev/zero | tr '\\0' y; echo; echo END", max_output_bytes=1000).collect()
    assert r.truncated and r.exit_code == 0
    assert r.stdout.startswith("yyyy") and r.stdout.endswith("yyy\nEND\n")
    assert "bytes of output cut here by the sandbox" in r.stdout and len(r.stdout_bytes) <= 1000


def test_oom_kill_is_named(tb: Threadbox, names: Names) -> None:
    sb = tb.create(names.new("oom"), memory="256M")
    r = sb.exec(["python3", "-c", "x = bytearray(1 << 30)"], timeout=60)
    assert r.oom_killed and r.memory_limit_bytes == 256 << 20, r
    assert r.signal == 9
    ok = sb.exec("echo fine")
    assert ok.ok and not ok.oom_killed and ok.memory_limit_bytes is None
    with sb.exec_stream("python3 -c 'x = bytearray(1 << 30)'", timeout=60) as events:
        end = events.collect()
    assert end.oom_killed and end.memory_limit_bytes == 256 << 20


def test_exec_stream(tb: Threadbox, names: Names) -> None:
    sb = tb.create(names.new("stream"))
    seen: list[tuple[float, object]] = []
    t0 = time.monotonic()
    with sb.exec_stream("for i in 1 2 3; do echo $i; sleep 0.4; done; echo bad >&2; exit 4") as events:
        for ev in events:
            seen.append((time.monotonic() - t0, ev))
    evs = [e for _, e in seen]
    assert isinstance(evs[0], StartEvent) and evs[0].pid > 0
    assert isinstance(evs[-1], EndEvent) and evs[-1].exit_code == 4
    out = b"".join(e.data for e in evs if isinstance(e, OutputEvent) and e.stream == "stdout")
    err = b"".join(e.data for e in evs if isinstance(e, OutputEvent) and e.stream == "stderr")
    assert out == b"1\n2\n3\n" and err == b"bad\n"
    first_out = next(t for t, e in seen if isinstance(e, OutputEvent))
    assert first_out < seen[-1][0] - 0.5, "output was not streamed as it happened"


def test_exec_stream_timeout_and_binary(tb: Threadbox, names: Names) -> None:
    sb = tb.create(names.new("stream2"))
    r = sb.exec_stream("printf '\\377'; sleep 30", timeout=1).collect()
    assert r.timed_out and r.stdout_bytes == b"\xff"


def test_processes(tb: Threadbox, names: Names) -> None:
    sb = tb.create(names.new("proc"))
    p = sb.processes.start("echo started; echo oops >&2; sleep 60", env={"A": "b"})
    assert p.running and p.pid > 0 and p.id in [q.id for q in sb.processes.list()]
    deadline = time.monotonic() + 10
    while "started" not in p.logs().stdout:
        assert time.monotonic() < deadline, "no output from the background process"
        time.sleep(0.1)
    assert "oops" in p.logs().stderr
    assert sb.exec("echo still here").ok  # exec works alongside
    p.kill()
    info = p.wait(timeout=10)
    assert not info.running
    q = sb.processes.start(["sh", "-c", "exit 7"])
    assert q.wait(timeout=10).exit_code == 7


def test_files(tb: Threadbox, names: Names) -> None:
    sb = tb.create(names.new("files"))
    blob = bytes(range(256)) * 1000
    sb.files.write("/home/user/data/blob.bin", blob)
    assert sb.files.read("data/blob.bin") == blob
    assert sb.exec(["sha256sum", "data/blob.bin"]).ok
    sb.files.write("deep/er/note.txt", "héllo\n")  # parents created, relative to /home/user
    assert sb.files.read_text("/home/user/deep/er/note.txt") == "héllo\n"
    assert sb.exec(["cat", "deep/er/note.txt"]).stdout == "héllo\n"
    st = sb.files.stat("deep/er/note.txt")
    assert st.kind == "file" and st.size == len("héllo\n".encode()) and st.uid == 1000
    entries = {e.name: e for e in sb.files.list("/home/user")}
    assert entries["data"].kind == "dir" and entries["deep"].is_dir
    sb.exec("ln -s data/blob.bin link")
    link = {e.name: e for e in sb.files.list(".")}["link"]
    assert link.kind == "symlink" and link.symlink_target == "data/blob.bin"
    sb.files.mkdir("a/b/c", parents=True)
    assert sb.files.stat("a/b/c").is_dir
    sb.files.write("a/b/c/x", b"1")
    with pytest.raises(threadbox.ThreadboxError):
        sb.files.remove("a")  # not empty, not recursive
    sb.files.remove("a", recursive=True)
    assert not sb.files.exists("a")
    sb.files.remove("deep/er/note.txt")
    with pytest.raises(FileNotFound) as ei:
        sb.files.read("deep/er/note.txt")
    assert ei.value.code == "not_found"
    sb.files.remove("nope", missing_ok=True)
    sb.files.write("empty", b"")
    assert sb.files.read("empty") == b""


def test_files_streams(tb: Threadbox, names: Names, tmp_path: Path) -> None:
    sb = tb.create(names.new("fstream"))
    src = tmp_path / "src.bin"
    src.write_bytes(os.urandom(5 << 20))
    sb.files.upload(src, "up/src.bin")
    dst = tmp_path / "dst.bin"
    assert sb.files.download("up/src.bin", dst) == 5 << 20
    assert dst.read_bytes() == src.read_bytes()
    sb.files.write("chunks.txt", (f"{i}\n".encode() for i in range(10000)))
    assert sb.files.read("chunks.txt") == b"".join(f"{i}\n".encode() for i in range(10000))
    assert b"".join(sb.files.read_stream("up/src.bin", chunk_size=4096)) == src.read_bytes()


def test_file_permissions_are_enforced(tb: Threadbox, names: Names) -> None:
    sb = tb.create(names.new("perm"))
    sb.exec("echo secret > /tmp/s && chmod 000 /tmp/s", user="root")
    with pytest.raises(threadbox.PermissionDenied):
        sb.files.read("/tmp/s")
    assert sb.files.read("/tmp/s", user="root") == b"secret\n"


def test_lifecycle(tb: Threadbox, names: Names) -> None:
    sb = tb.create(names.new("life"))
    sb.files.write("keep.txt", b"kept")
    assert sb.pause().state == "paused"
    assert sb.refresh().state == "paused"
    assert sb.resume().state == "running"
    assert sb.exec("cat keep.txt").stdout == "kept"
    assert sb.stop().state == "stopped"
    with pytest.raises(SandboxNotRunning) as ei:
        sb.exec("true")
    assert ei.value.code == "sandbox_not_running"
    assert [s.id for s in tb.list(state="stopped") if s.id == sb.id] == [sb.id]
    assert sb.start().state == "running"
    assert sb.exec("cat keep.txt").stdout == "kept"


def test_get_or_create_block_keeps_an_existing_sandbox(tb: Threadbox, names: Names) -> None:
    """P0: a ``with`` block deletes only a sandbox its own call created."""
    name = names.new("keep")
    first = tb.create(name, on_exit="none")
    assert first.created
    first.files.write("p.txt", b"precious\n")
    with tb.get_or_create(name) as sb:
        assert not sb.created and sb.on_exit == "none"
        assert sb.files.read("p.txt") == b"precious\n"
    assert tb.get(name).files.read("p.txt") == b"precious\n"
    with tb.create(name, on_exit="stop") as again:  # create() of an existing name: same rule
        assert not again.created
    assert tb.get(name).state == "running"
    # A sandbox the block did create is still deleted at its end.
    fresh = names.new("fresh")
    with tb.get_or_create(fresh) as sb2:
        assert sb2.created and sb2.on_exit == "delete"
    with pytest.raises(SandboxNotFound):
        tb.get(fresh)


def test_create_answer_says_created(tb: Threadbox, names: Names) -> None:
    name = names.new("flag")
    r1 = tb._send("POST", "/v1/sandboxes", json_body={"name": name})
    r2 = tb._send("POST", "/v1/sandboxes", json_body={"name": name})
    assert (r1.status_code, r1.json()["created"]) == (201, True)
    assert (r2.status_code, r2.json()["created"]) == (200, False)
    assert r1.json()["id"] == r2.json()["id"]


async def test_async_get_or_create_block_keeps_an_existing_sandbox(atb: AsyncThreadbox, names: Names) -> None:
    name = names.new("akeep")
    first = await atb.create(name, on_exit="none")
    await first.files.write("p.txt", b"precious\n")
    async with await atb.get_or_create(name) as sb:
        assert not sb.created
        assert await sb.files.read("p.txt") == b"precious\n"
    assert await (await atb.get(name)).files.read("p.txt") == b"precious\n"
    fresh = names.new("afresh")
    async with await atb.get_or_create(fresh) as sb2:
        assert sb2.created
    with pytest.raises(SandboxNotFound):
        await atb.get(fresh)


def test_context_managers(tb: Threadbox, names: Names) -> None:
    with tb.create(names.new("cm")) as sb:
        assert sb.exec("true").ok
    with pytest.raises(SandboxNotFound):
        tb.get(sb.id)
    with tb.create(names.new("cm2"), on_exit="stop") as sb2:
        sb2.files.write("x", b"1")
    assert tb.get(sb2.id).state == "stopped"


def test_invalid_argument(tb: Threadbox, names: Names) -> None:
    sb = tb.create(names.new("inval"))
    with pytest.raises(threadbox.InvalidArgument):
        tb._send("POST", f"/v1/sandboxes/{sb.id}/exec", json_body={"shell": "true", "bogus": 1})
    with pytest.raises(threadbox.InvalidArgument):
        tb._send("POST", f"/v1/sandboxes/{sb.id}/exec", json_body={})


def test_selftest(tb: Threadbox, names: Names) -> None:
    sb = tb.create(names.new("self"))
    report = sb.selftest()
    assert report.checks, "selftest returned no checks"
    assert report.ok, [c for c in report.checks if not c.ok]


def test_two_sandboxes_do_not_share_files(tb: Threadbox, names: Names) -> None:
    a, b = tb.create(names.new("iso-a")), tb.create(names.new("iso-b"))
    a.files.write("/tmp/mine", b"a")
    a.files.write("mine", b"a")
    assert not b.files.exists("mine")
    assert b.exec("cat /tmp/mine").exit_code != 0


def test_concurrency_threads(tb: Threadbox, names: Names) -> None:
    sbs = [tb.create(names.new(f"thr{i}")) for i in range(3)]

    def work(i: int) -> str:
        sb = sbs[i % 3]
        sb.files.write(f"f{i}.txt", str(i).encode())
        return sb.exec(["cat", f"f{i}.txt"]).stdout

    with ThreadPoolExecutor(max_workers=12) as pool:
        results = list(pool.map(work, range(24)))
    assert results == [str(i) for i in range(24)]


async def test_async_client(atb: AsyncThreadbox, names: Names) -> None:
    sb = await atb.create(names.new("async"))
    assert sb.created
    assert (await atb.get_or_create(sb.name or "")).id == sb.id
    r = await sb.exec("echo hi")
    assert r.stdout == "hi\n"
    await sb.files.write("x/y.bin", bytes(range(256)))
    assert await sb.files.read("x/y.bin") == bytes(range(256))
    assert [e.name for e in await sb.files.list("x")] == ["y.bin"]
    evs = [e async for e in sb.exec_stream("echo a; echo b >&2")]
    assert isinstance(evs[-1], EndEvent) and evs[-1].exit_code == 0
    p = await sb.processes.start("sleep 30")
    await p.kill()
    assert not (await p.wait(timeout=10)).running
    assert (await sb.pause()).state == "paused"
    assert (await sb.resume()).state == "running"
    results = await asyncio.gather(*(sb.exec(["sh", "-c", f"sleep 0.5; echo {i}"]) for i in range(8)))
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(8)]
    async with await atb.create(names.new("async-cm")) as sb2:
        assert (await sb2.exec("true")).ok
    with pytest.raises(SandboxNotFound):
        await atb.get(sb2.id)
    await sb.delete()


async def test_concurrency_asyncio_many_sandboxes(atb: AsyncThreadbox, names: Names) -> None:
    sbs = await asyncio.gather(*(atb.create(names.new(f"par{i}")) for i in range(4)))
    t0 = time.monotonic()
    results = await asyncio.gather(*(s.exec("sleep 1; echo done") for s in sbs))
    assert all(r.stdout == "done\n" for r in results)
    assert time.monotonic() - t0 < 4, "execs in different sandboxes did not run concurrently"


def test_a_url_with_v1_gets_a_hint(daemon: Daemon) -> None:
    """P12: THREADBOX_URL=http://host:port/v1 is a URL mistake, and the error says so."""
    with Threadbox(daemon.url + "/v1") as bad, pytest.raises(threadbox.NotFound) as ei:
        bad.list()
    assert "no such route" in str(ei.value) and "without /v1" in str(ei.value)
    assert f"for example {daemon.url}," in str(ei.value)


def test_read_a_range_transfers_only_the_range(daemon: Daemon, names: Names) -> None:
    """P13: a 20 000-byte window of a 50 MB file moves 20 000 bytes, not 50 MB."""
    counter = CountingTransport()
    with Threadbox(daemon.url, transport=counter) as tb:
        sb = tb.create(names.new("range"))
        sb.exec("seq 1 6500000 > big.txt")  # ~50 MB
        size = sb.files.stat("big.txt").size
        assert size > 50_000_000
        expected = sb.exec(["sh", "-c", "tail -c +30000001 big.txt | head -c 20000"]).stdout.encode()
        counter.received = 0
        assert sb.files.read("big.txt", offset=30_000_000, length=20_000) == expected
        assert counter.received == 20_000
        tail = sb.exec(["tail", "-c", "5", "big.txt"]).stdout.encode()
        counter.received = 0
        assert b"".join(sb.files.read_stream("big.txt", offset=size - 5, length=100)) == tail
        assert counter.received == 5
        assert sb.files.read("big.txt", offset=size) == b""
        assert sb.files.read("big.txt", offset=size + 1000, length=10) == b""
        with pytest.raises(threadbox.InvalidArgument, match="length must be at least 1"):
            sb.files.read("big.txt", length=0)
        with pytest.raises(threadbox.InvalidArgument):
            sb.files.read("big.txt", offset=-1)


async def test_async_read_a_range(atb: AsyncThreadbox, names: Names) -> None:
    sb = await atb.create(names.new("arange"))
    await sb.files.write("r.bin", bytes(range(256)) * 100)
    assert await sb.files.read("r.bin", offset=300, length=10) == bytes(range(44, 54))
    chunks = [c async for c in sb.files.read_stream("r.bin", offset=25_590, length=1000)]
    assert b"".join(chunks) == bytes(range(246, 256))
    assert await sb.files.read("r.bin", offset=1 << 40) == b""
    with pytest.raises(threadbox.InvalidArgument):
        await sb.files.read("r.bin", length=0)


def test_names_that_are_not_utf8_round_trip(tb: Threadbox, names: Names) -> None:
    """ADR 0026: a listed name is a str (surrogateescape, as os.fsdecode makes it) that names the file."""
    sb = tb.create(names.new("rawnames"))
    sb.exec(["python3", "-c", "import os; os.mkdir(b'd\\xff'); open(b'd\\xff/caf\\xe9.txt', 'wb').write(b'bonjour')"])
    (d,) = [e for e in sb.files.list(".") if e.name_b64]
    assert d.name == "d\udcff" and os.fsencode(d.name) == b"d\xff" and d.raw_name == b"d\xff" and d.is_dir
    (f,) = sb.files.list(d.name)
    assert f.name == "caf\udce9.txt" and f.path == "/home/user/d\udcff/caf\udce9.txt"
    assert sb.files.read(f.path) == b"bonjour"
    assert sb.files.read(os.fsdecode(b"d\xff/caf\xe9.txt"), offset=3) == b"jour"
    assert sb.files.stat(f.path).size == 7
    sb.files.write(os.fsdecode(b"d\xff/new\xfe"), b"x")
    assert sb.exec(["python3", "-c", "print(open(b'd\\xff/new\\xfe').read())"]).stdout == "x\n"
    sb.files.remove(f.path)
    assert not sb.files.exists(f.path)
    plain = sb.files.stat(".")
    assert plain.name_b64 is None and plain.path_b64 is None


async def test_async_names_that_are_not_utf8(atb: AsyncThreadbox, names: Names) -> None:
    sb = await atb.create(names.new("arawnames"))
    await sb.exec(["python3", "-c", "open(b'x\\xe9', 'wb').write(b'ok')"])
    (e,) = [e for e in await sb.files.list(".") if e.name_b64]
    assert e.name == "x\udce9" and await sb.files.read(e.name) == b"ok"
