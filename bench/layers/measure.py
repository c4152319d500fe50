#!/usr/bin/env python3
"""Candidates for checkpoints of a sandbox disk (ADR 0100). Run as root; needs
mkfs.xfs, mkfs.btrfs, mkfs.ext4. Prints the median of 5 trials per candidate."""

import fcntl
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

FICLONE = 0x40049409
MB = 1 << 20


def sh(*a):
    subprocess.run(a, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def fill(d, total_mb=200, n=200):
    os.makedirs(d, exist_ok=True)
    chunk = os.urandom(MB)
    for i in range(n):
        with open(f"{d}/f{i}", "wb") as f:
            f.writelines(chunk for _ in range(total_mb // n))


def ms(t0):
    return (time.perf_counter() - t0) * 1000


def reflink(src, dst):
    with open(src, "rb") as s, open(dst, "wb") as d:
        fcntl.ioctl(d.fileno(), FICLONE, s.fileno())


def store(kind, root):
    img = f"{root}/{kind}.img"
    with open(img, "wb") as f:
        f.truncate(64 << 30)
    if kind == "xfs":
        sh("mkfs.xfs", "-q", "-m", "reflink=1", img)
    else:
        sh("mkfs.btrfs", "-q", img)
    mnt = f"{root}/{kind}"
    os.makedirs(mnt)
    sh("mount", "-o", "loop", img, mnt)
    return mnt


def image_clone(mnt, trials=5):
    """ext4 disk image (ADR 0011) inside a reflink store; checkpoint = syncfs + FICLONE."""
    disk = f"{mnt}/disk.img"
    with open(disk, "wb") as f:
        f.truncate(10 << 30)
    sh("mkfs.ext4", "-q", "-m", "1", disk)
    inner = f"{mnt}/inner"
    os.makedirs(inner)
    sh("mount", "-o", "loop", disk, inner)
    fill(f"{inner}/upper")
    os.sync()
    out = []
    for i in range(trials):
        # a little fresh dirty data, as a live sandbox would have
        with open(f"{inner}/upper/dirty{i}", "wb") as f:
            f.write(os.urandom(MB))
        t0 = time.perf_counter()
        fd = os.open(inner, os.O_RDONLY)
        os.syncfs(fd) if hasattr(os, "syncfs") else os.sync()
        os.close(fd)
        reflink(disk, f"{mnt}/ck{i}.img")
        out.append(ms(t0))
    t0 = time.perf_counter()
    reflink(f"{mnt}/ck0.img", f"{mnt}/fork.img")
    fork = ms(t0)
    sh("umount", inner)
    return statistics.median(out), fork


def btrfs_subvol(mnt, trials=5):
    sub = f"{mnt}/upper"
    sh("btrfs", "subvolume", "create", sub)
    fill(sub)
    os.sync()
    out = []
    for i in range(trials):
        t0 = time.perf_counter()
        sh("btrfs", "subvolume", "snapshot", "-r", sub, f"{mnt}/snap{i}")
        out.append(ms(t0))
    return statistics.median(out)


def cp_a(root):
    src = f"{root}/cpsrc"
    fill(src)
    os.sync()
    t0 = time.perf_counter()
    shutil.copytree(src, f"{root}/cpdst")
    os.sync()
    return ms(t0)


def main():
    root = tempfile.mkdtemp(prefix="tb-layers-")
    try:
        for kind in ("xfs", "btrfs"):
            mnt = store(kind, root)
            try:
                ck, fork = image_clone(mnt)
                print(
                    f"{kind} store, ext4 image: checkpoint (syncfs+FICLONE) median {ck:.1f} ms; clone of a checkpoint {fork:.1f} ms"
                )
                if kind == "btrfs":
                    print(
                        f"btrfs subvolume snapshot (incl. exec of btrfs): median {btrfs_subvol(mnt):.1f} ms"
                    )
            finally:
                subprocess.run(["umount", "-l", mnt], check=False)
        print(f"cp -a of 200 MB on the host ext4 + sync: {cp_a(root):.0f} ms")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
