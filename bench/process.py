#!/usr/bin/env python3
"""Whole-process figures for the gangway binary: wall time and peak memory.

Usage: python3 bench/process.py [path/to/gangway]   (default target/release/gangway)

Runs each command many times, reports the median and p90 wall time and the
largest peak RSS (from GNU time, /usr/bin/time). Build first: cargo build --release.
"""
import os
import statistics
import subprocess
import sys
import time

RUNS = 50
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "target/release/gangway")

COMMANDS = [
    ["--help"],
    ["optimize", "examples/train-any-of.yaml"],
    ["optimize", "examples/train-any-of.yaml", "--output", "json"],
    ["show-gpus"],
]


TIME = "/usr/bin/time"  # GNU time: execs the child from a small process


def run_once(args):
    start = time.perf_counter()
    p = subprocess.run([BIN] + args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    elapsed = time.perf_counter() - start
    if p.returncode != 0:
        sys.exit(f"{' '.join(args)} exited {p.returncode}")
    return elapsed


def peak_rss_kib(args):
    """Peak RSS of the command itself. Python's own wait4 rusage would count
    the forked copy of this interpreter before exec, so GNU time measures."""
    if not os.path.exists(TIME):
        return float("nan")
    p = subprocess.run([TIME, "-f", "%M", BIN] + args, cwd=ROOT, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, text=True)
    return int(p.stderr.strip().splitlines()[-1])


def main():
    if not os.path.exists(BIN):
        sys.exit(f"{BIN} not found: run `cargo build --release` first")
    print(f"binary: {BIN} ({os.path.getsize(BIN) / 1e6:.1f} MB), {RUNS} runs each")
    print(f"{'command':60} {'median ms':>10} {'p90 ms':>8} {'peak RSS MiB':>13}")
    for args in COMMANDS:
        run_once(args)  # warm the page cache
        times = [run_once(args) * 1000 for _ in range(RUNS)]
        rss = [peak_rss_kib(args) / 1024 for _ in range(5)]
        times.sort()
        p90 = times[int(len(times) * 0.9) - 1]
        print(f"{'gangway ' + ' '.join(args):60} {statistics.median(times):10.2f} {p90:8.2f} {max(rss):13.1f}")


if __name__ == "__main__":
    main()
