#!/usr/bin/env python3
"""Checkpoint, fork and rewind figures of the daemon (issue 14, ADR 0100).

Superseded by `threadbox-bench layers` (bench/src/layers.rs, ADR 0211), which measures
all of this and the pull against skopeo in one run; kept because earlier figures in
docs/layers.md and the ADRs name this script and its options.

Starts `threadbox serve` on a root on an xfs loop image (reflink; `--ext4` for the
host's file system, where the daemon mounts its own xfs store image, ADR 0101, or with
`--store-off` clones are sparse copies), makes a sandbox holding 200 MB of
files, and prints the medians of: a checkpoint (frozen, cloned, thawed), a fork of 3 to
running sandboxes, and a rewind to running. Needs root, mkfs.xfs (xfsprogs), and the SDK
on PYTHONPATH (python/threadbox/src). With `--staged`, it prints instead the fork of 3
booted cold against the fork of 3 served by staged slots (ADR 0180) in the same run: the
daemon is restarted on the same root (the parent keeps running) alternately without and
with `--staged-pool 3`, each staged fork waiting for the pool to be full again. Usage:
  bench/layers/bench.py [--bin target/debug/threadbox] [--ext4] [--trials 5] [--staged]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import threadbox


def ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/debug/threadbox")
    ap.add_argument(
        "--ext4", action="store_true", help="root on the host fs (no reflink)"
    )
    ap.add_argument(
        "--store-off",
        action="store_true",
        help="with --ext4: serve --store-image off (clones copy; ADR 0101)",
    )
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument(
        "--log", help="copy the daemon's log here (RUST_LOG=debug shows the phases)"
    )
    ap.add_argument(
        "--staged",
        action="store_true",
        help="fork of 3 cold against staged slots (ADR 0180), same run",
    )
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tb-bench-layers-"))
    root = work / "root"
    root.mkdir()
    mounted = False
    daemon = None
    try:
        if not a.ext4:
            img = work / "store.img"
            with open(img, "wb") as f:
                f.truncate(64 << 30)
            subprocess.run(["mkfs.xfs", "-q", "-m", "reflink=1", str(img)], check=True)
            subprocess.run(["mount", "-o", "loop", str(img), str(root)], check=True)
            mounted = True
        sock = root / "threadbox.sock"

        def start(extra: list[str]) -> subprocess.Popen[bytes]:
            sock.unlink(missing_ok=True)
            with open(work / "daemon.log", "ab") as log:
                d = subprocess.Popen(
                    [a.bin, "serve", "--root", str(root), "--listen", "127.0.0.1:0"]
                    + (["--store-image", "off"] if a.store_off else [])
                    + extra,
                    stdout=log,
                    stderr=log,
                )
            deadline = time.monotonic() + 60
            while not sock.exists():
                if time.monotonic() > deadline or d.poll() is not None:
                    raise SystemExit(
                        f"daemon did not start: {(work / 'daemon.log').read_text()[-2000:]}"
                    )
                time.sleep(0.05)
            return d

        daemon = start([])
        if a.staged:
            daemon = staged_vs_cold(a, work, sock, daemon, start)
            return
        with threadbox.Threadbox(f"unix://{sock}") as tb:
            time.sleep(0.2)
            sb = tb.create("bench-parent")
            sb.exec(
                "for i in $(seq 200); do head -c 1048576 /dev/urandom > ~/f$i; done; sync"
            )
            sb.checkpoint("base")
            ck, fork, rewind = [], [], []
            for i in range(a.trials):
                sb.exec(f"echo {i} > ~/marker")
                t0 = time.perf_counter()
                sb.checkpoint(f"t{i}")
                ck.append(ms(t0))
            for _ in range(max(1, a.trials // 2)):
                t0 = time.perf_counter()
                kids = sb.fork(count=3)
                fork.append(ms(t0))
                for k in kids:
                    k.delete()
            for _ in range(a.trials):
                t0 = time.perf_counter()
                sb.rewind("base")
                rewind.append(ms(t0))
            method = sb.checkpoints()[0].method
            sb.delete()
        plain = re.sub(
            r"\x1b\[[0-9;]*m", "", (work / "daemon.log").read_text(errors="replace")
        )
        frozen = [int(m) / 1000 for m in re.findall(r"frozen_us=(\d+)", plain)]
        where = (
            "xfs loop image (reflink)"
            if not a.ext4
            else "host ext4, store off (sparse copy)"
            if a.store_off
            else "host ext4, the daemon's store image (ADR 0101)"
        )
        print(
            f"root on {where}; method={method}; 200 MB of files; medians of {a.trials}:"
        )
        print(f"  checkpoint          {statistics.median(ck):8.1f} ms")
        if frozen:
            print(
                f"  of which frozen     {statistics.median(frozen):8.1f} ms (syncfs + clone)"
            )
        print(f"  fork of 3 (running) {statistics.median(fork):8.1f} ms")
        print(f"  rewind (running)    {statistics.median(rewind):8.1f} ms")
    finally:
        if daemon is not None:
            daemon.terminate()
            daemon.wait(timeout=30)
        if a.log and (work / "daemon.log").exists():
            shutil.copy(work / "daemon.log", a.log)
        # The daemon's store, when it left it mounted (ADR 0101).
        subprocess.run(["umount", "-l", str(root / "sandboxes")], capture_output=True)
        if mounted:
            subprocess.run(["umount", "-l", str(root)], check=False)
        shutil.rmtree(work, ignore_errors=True)


def staged_vs_cold(a, work: Path, sock: Path, daemon, start):  # type: ignore[no-untyped-def]
    """Fork of 3, cold and from staged slots, alternating daemons on one root."""
    log = work / "daemon.log"

    def waiting() -> int:
        text = re.sub(r"\x1b\[[0-9;]*m", "", log.read_text(errors="replace"))
        ready = len(re.findall(r"staged pool: slot ready", text))
        gone = len(
            re.findall(r"staged pool: slot taken|removed a pooled sandbox", text)
        )
        return ready - gone

    with threadbox.Threadbox(f"unix://{sock}") as tb:
        sb = tb.create("bench-parent")
        sb.exec(
            "for i in $(seq 200); do head -c 1048576 /dev/urandom > ~/f$i; done; sync"
        )
    times: dict[str, list[float]] = {"cold": [], "staged": []}
    per_round = max(1, a.trials // 2)
    for rnd in range(2):
        for mode in ("cold", "staged"):
            if not (rnd == 0 and mode == "cold"):
                daemon.terminate()
                daemon.wait(timeout=30)
                daemon = start(["--staged-pool", "3"] if mode == "staged" else [])
            with threadbox.Threadbox(f"unix://{sock}") as tb:
                sb = tb.get("bench-parent")
                for _ in range(per_round):
                    if mode == "staged":
                        deadline = time.monotonic() + 120
                        while waiting() < 3:
                            if time.monotonic() > deadline:
                                raise SystemExit("the staged pool did not fill")
                            time.sleep(0.05)
                    t0 = time.perf_counter()
                    kids = sb.fork(count=3)
                    times[mode].append(ms(t0))
                    for k in kids:
                        k.delete()
    text = re.sub(r"\x1b\[[0-9;]*m", "", log.read_text(errors="replace"))
    served = len(re.findall(r"staged slot attached", text))
    cold, staged = statistics.median(times["cold"]), statistics.median(times["staged"])
    print(
        f"fork of 3 to running sandboxes, 200 MB parent, medians of {len(times['cold'])} "
        f"each, alternating daemons; load {os.getloadavg()[0]:.1f}:"
    )
    print(
        f"  cold                {cold:8.1f} ms  {sorted(round(t, 1) for t in times['cold'])}"
    )
    print(
        f"  staged slots        {staged:8.1f} ms  {sorted(round(t, 1) for t in times['staged'])}"
        f"  ({served} forks served by an attach)"
    )
    print(f"  ratio staged/cold   {staged / cold:8.2f}")
    with threadbox.Threadbox(f"unix://{sock}") as tb:
        tb.get("bench-parent").delete()
    return daemon


if __name__ == "__main__":
    os.environ.pop("THREADBOX_URL", None)
    main()
