#!/usr/bin/env python3
"""GCP figures for the gangway binary against the Compute Engine fake
(tests/emulators/gce, which also serves the Cloud Billing catalog).

Usage: python3 bench/gcp.py [path/to/gangway]   (default target/release/gangway)

Needs the fake's venv: GANGWAY_TEST_GCE_PYTHON (what .ci/run sets), else
target/gce-venv/bin/python (tests/emulators/gce/setup.sh makes it).

Measures `gangway catalog refresh --cloud gcp` over every GCP region of the
catalog (two aggregated lists and the SKU pages, each read once): wall time
(median, p90) and peak RSS. The fake answers from a small world (10 zones,
~400 SKUs, one page); the real API returns tens of thousands of SKUs over
several pages, so this is gangway's own cost plus three loopback round
trips, not what a refresh against Google takes.

Build first: cargo build --release.
"""
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "target/release/gangway")
RUNS = int(os.environ.get("RUNS", "30"))


def fake_python():
    p = os.environ.get("GANGWAY_TEST_GCE_PYTHON") or os.path.join(ROOT, "target/gce-venv/bin/python")
    if not os.path.exists(p):
        sys.exit("no venv for the GCE fake: run tests/emulators/gce/setup.sh or set GANGWAY_TEST_GCE_PYTHON")
    return p


def main():
    fake = subprocess.Popen(
        [fake_python(), os.path.join(ROOT, "tests/emulators/gce/server.py"),
         "--host", "127.0.0.1", "--port", "0", "--watch-stdin"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = fake.stdout.readline().strip()
        if not line.startswith("READY "):
            sys.exit(f"the GCE fake said {line!r}")
        url = line.split(" ", 1)[1]
        with tempfile.TemporaryDirectory() as home:
            env = dict(os.environ, GANGWAY_HOME=home, GANGWAY_GCP_ENDPOINT=url,
                       GANGWAY_GCP_BILLING_ENDPOINT=url, GOOGLE_CLOUD_PROJECT="gangway-bench")
            cmd = [BIN, "catalog", "refresh", "--cloud", "gcp"]
            times = []
            for _ in range(RUNS):
                start = time.perf_counter()
                subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
                times.append((time.perf_counter() - start) * 1000)
            out = subprocess.run(["/usr/bin/time", "-f", "%M"] + cmd, env=env, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, text=True, check=True)
            rss_mib = int(out.stderr.strip().splitlines()[-1]) / 1024
            rows = sum(1 for l in open(os.path.join(home, "catalog", "gcp.csv"))
                       if l[:1].isalpha() and not l.startswith("instance_type"))
        times.sort()
        p90 = times[int(len(times) * 0.9) - 1]
        print(f"binary: {BIN}, {RUNS} runs against the GCE fake")
        print(f"gangway catalog refresh --cloud gcp: {statistics.median(times):.1f} ms median, "
              f"{p90:.1f} ms p90, peak RSS {rss_mib:.1f} MiB; {rows} offerings written")
    finally:
        fake.kill()
        fake.wait()


if __name__ == "__main__":
    main()
