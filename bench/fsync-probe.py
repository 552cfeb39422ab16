#!/usr/bin/env python3
"""How long this disk's fdatasync takes for a log that appends, against one written into
space prepared ahead (fallocate'd, or written with zeros and synced): the question behind
preallocating the control plane's log segments (docs/benchmarks/control-plane.md, step 17).

Several processes (the members of a local cluster) each write RECORD bytes and fdatasync,
COUNT times, in files of their own under DIR; prints p50/p90/p99 per way of preparing.

    python3 bench/fsync-probe.py [--dir run/fsync-probe] [--writers 3] [--count 800]
"""

import argparse
import os
import shutil
import statistics
import time
from multiprocessing import Pool

RECORD = 16 * 1024
MIB = 1024 * 1024


def prepare(fd: int, how: str, size: int) -> None:
    if how == "fallocate":
        os.posix_fallocate(fd, 0, size)
        os.fsync(fd)
    elif how == "zeroed":
        zeros = b"\0" * MIB
        for _ in range(size // MIB):
            os.write(fd, zeros)
        os.fsync(fd)
        os.lseek(fd, 0, os.SEEK_SET)


def one_writer(job: tuple) -> list:
    directory, how, writer, count = job
    path = os.path.join(directory, f"{how}-{writer}.log")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        prepare(fd, how, count * RECORD + MIB)
        record = os.urandom(RECORD)
        took = []
        for _ in range(count):
            os.write(fd, record)
            start = time.perf_counter()
            os.fdatasync(fd)
            took.append((time.perf_counter() - start) * 1e3)
        return took
    finally:
        os.close(fd)
        os.remove(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", default="run/fsync-probe", help="where the files go")
    parser.add_argument("--writers", type=int, default=3, help="processes writing at once")
    parser.add_argument("--count", type=int, default=800, help="records per writer")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.writers < 1 or args.count < 100:
        parser.error("--writers must be at least 1 and --count at least 100")
    os.makedirs(args.dir, exist_ok=True)
    try:
        for round_ in range(1, args.rounds + 1):
            for how in ("append", "fallocate", "zeroed"):
                jobs = [(args.dir, how, w, args.count) for w in range(args.writers)]
                with Pool(args.writers) as pool:
                    took = sorted(t for each in pool.map(one_writer, jobs) for t in each)
                n = len(took)
                print(
                    f"round {round_} {how:9s} fdatasync p50 {took[n // 2]:.2f} "
                    f"p90 {took[int(n * 0.9)]:.2f} p99 {took[int(n * 0.99)]:.2f} "
                    f"mean {statistics.mean(took):.2f} ms"
                )
    finally:
        shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
