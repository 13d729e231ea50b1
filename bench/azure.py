#!/usr/bin/env python3
"""`gangway catalog refresh --cloud azure` against the Azure fake's Retail
Prices API: how long the whole process takes and its peak memory.

Usage:
    python3 bench/azure.py [path/to/gangway]   (default target/release/gangway)

Needs the fake's schema file (tests/emulators/azure/setup.sh writes it):
GANGWAY_TEST_AZURE_SCHEMA, else target/azure-venv/arm-schema.json.

The fake's price sheet gives every Azure size of the embedded catalog a
Linux, Windows, Spot, Low Priority, Dev/Test and reservation meter in each
of its regions (58), plus FILLER (default 4,000) meters of other sizes per
region, of which two thirds are pay-as-you-go, so that a region's
`priceType eq 'Consumption'` answer is about 2,700 meters: three pages of
1,000, as a large real region's is (the real API lists some 4,000 VM
meters of all price types in a large region). About 175 pages in all, over
loopback: the time is gangway's own plus the fake's (Python, which builds
each region's pages on the first one's request), not Azure's network.
"""
import csv
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import ROOT  # noqa: E402

BIN = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "target/release/gangway"))
RUNS = int(os.environ.get("RUNS", "3"))
FILLER = int(os.environ.get("FILLER", "4000"))


def schema():
    p = os.environ.get("GANGWAY_TEST_AZURE_SCHEMA") or os.path.join(ROOT, "target/azure-venv/arm-schema.json")
    if not os.path.isfile(p):
        sys.exit(f"no schema file for the Azure fake at {p} (run tests/emulators/azure/setup.sh)")
    return p


def sheet():
    """Prices for every (size, region) of the embedded Azure catalog."""
    text = open(os.path.join(ROOT, "src/core/catalog/data/azure.csv")).read()
    rows = csv.DictReader(io.StringIO("\n".join(l for l in text.splitlines() if not l.startswith("#"))))
    out = []
    for r in rows:
        linux = float(r["price"] or r["spot_price"])
        p = {"sku": r["instance_type"], "region": r["region"], "linux": linux}
        if r["spot_price"]:
            p["spot"] = float(r["spot_price"])
        out.append(p)
    return out


def call(url, method, path, body):
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), method=method,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.load(r)


def main():
    if not os.path.isfile(BIN):
        sys.exit(f"no gangway binary at {BIN}: cargo build --release first")
    fake = subprocess.Popen(
        [sys.executable, os.path.join(ROOT, "tests/emulators/azure/server.py"),
         "--host", "127.0.0.1", "--port", "0", "--watch-stdin", "--schema", schema()],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = fake.stdout.readline().strip()
        if not line.startswith("READY "):
            sys.exit(f"the Azure fake said {line!r}")
        url = line.split(" ", 1)[1]
        prices = sheet()
        call(url, "POST", "/_fake/retail", {"prices": prices, "filler_per_region": FILLER})
        with tempfile.TemporaryDirectory() as home:
            env = dict(os.environ, GANGWAY_HOME=home, GANGWAY_AZURE_PRICES_ENDPOINT=url)
            env.pop("GANGWAY_CATALOG_DIR", None)
            cmd = ["/usr/bin/time", "-f", "%e %M", BIN, "catalog", "refresh", "--cloud", "azure"]
            secs, rss = [], []
            for _ in range(RUNS):
                start = time.perf_counter()
                p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True)
                if p.returncode != 0:
                    sys.exit(f"refresh failed: {p.stdout}\n{p.stderr}")
                secs.append(time.perf_counter() - start)
                rss.append(int(p.stderr.strip().splitlines()[-1].split()[1]) / 1024)
            with urllib.request.urlopen(url + "/_fake/retail", timeout=30) as r:
                pages = json.load(r)["requests"] // RUNS
            written = sum(1 for l in open(os.path.join(home, "catalog", "azure.csv"))
                          if l[:1].isalpha() and not l.startswith("instance_type"))
        print(f"binary: {BIN}, {RUNS} runs against the Azure fake; {len(prices)} priced "
              f"(size, region) pairs, {FILLER} other meters per region, {pages} pages a run")
        print(f"gangway catalog refresh --cloud azure: {statistics.median(secs):.2f} s median "
              f"(min {min(secs):.2f}), peak RSS {max(rss):.1f} MiB; {written} offerings written")
    finally:
        fake.kill()
        fake.wait()


if __name__ == "__main__":
    main()
