#!/usr/bin/env python3
"""Checkpoint, fork and rewind figures of the daemon (issue 14, ADR 0100).

Starts `threadbox serve` on a root on an xfs loop image (reflink; `--ext4` for the
host's file system, where the daemon mounts its own xfs store image, ADR 0101, or with
`--store-off` clones are sparse copies), makes a sandbox holding 200 MB of
files, and prints the medians of: a checkpoint (frozen, cloned, thawed), a fork of 3 to
running sandboxes, and a rewind to running. Needs root, mkfs.xfs (xfsprogs), and the SDK
on PYTHONPATH (python/threadbox/src). Usage:
  bench/layers/bench.py [--bin target/debug/threadbox] [--ext4] [--trials 5]
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
        with open(work / "daemon.log", "wb") as log:
            daemon = subprocess.Popen(
                [a.bin, "serve", "--root", str(root), "--listen", "127.0.0.1:0"]
                + (["--store-image", "off"] if a.store_off else []),
                stdout=log,
                stderr=log,
            )
        sock = root / "threadbox.sock"
        deadline = time.monotonic() + 60
        while not sock.exists():
            if time.monotonic() > deadline or daemon.poll() is not None:
                raise SystemExit(
                    f"daemon did not start: {(work / 'daemon.log').read_text()[-2000:]}"
                )
            time.sleep(0.05)
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


if __name__ == "__main__":
    os.environ.pop("THREADBOX_URL", None)
    main()
