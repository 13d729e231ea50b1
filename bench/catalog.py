#!/usr/bin/env python3
"""Whole-process time and peak memory of `gangway optimize` over a large
`--catalog` directory: a generated 250,000-row SkyPilot-format one (AWS-,
GCP- and Azure-shaped `vms.csv` files), and the published catalogs in
../shared/catalogs/skypilot-format when they are there.

Usage: python3 bench/catalog.py [path/to/gangway]   (default target/release/gangway)
Environment: ROWS (default 250000), RUNS (default 30).

For each directory: the first run in a fresh GANGWAY_HOME (parses the CSV
and writes the binary cache), then RUNS runs with the cache in place
(median and p90 wall time), and the largest peak RSS of 5 cached runs
(GNU time). Build first: cargo build --release.
"""
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import ROOT  # noqa: E402

BIN = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "target/release/gangway")
ROWS = int(os.environ.get("ROWS", "250000"))
RUNS = int(os.environ.get("RUNS", "30"))
TASK = "examples/train-any-of.yaml"
SHARED = os.path.join(os.path.dirname(ROOT), "shared/catalogs/skypilot-format")
TIME = "/usr/bin/time"

AWS_GPUS = [("H100", 8, 80, "p5.48xlarge", 55.0), ("A100", 8, 40, "p4d.24xlarge", 22.0),
            ("A10G", 1, 24, "g5.xlarge", 1.0), ("L40S", 4, 48, "g6e.12xlarge", 10.5),
            ("H200", 8, 141, "p5en.48xlarge", 63.3), ("T4", 1, 16, "g4dn.xlarge", 0.53)]
GCP_GPUS = [("A100", 1, "a2-highgpu-1g", 3.67), ("A100", 8, "a2-highgpu-8g", 29.4),
            ("H100", 8, "a3-highgpu-8g", 88.5), ("L4", 1, "g2-standard-4", 0.71),
            ("A100-80GB", 8, "a2-ultragpu-8g", 40.5)]


def generate(root, rows):
    """Writes aws/, gcp/ and azure/vms.csv with `rows` rows in all
    (40% Azure, 35% AWS, 25% GCP, as in SkyPilot's published catalogs)."""
    rnd = random.Random(7)
    n_aws, n_gcp = int(rows * 0.35), int(rows * 0.25)
    n_az = rows - n_aws - n_gcp
    os.makedirs(f"{root}/aws")
    with open(f"{root}/aws/vms.csv", "w") as f:
        f.write("InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,GpuInfo,Price,SpotPrice,Region,AvailabilityZone,Arch\n")
        for i in range(n_aws):
            region = f"aws-region-{i % 30}"
            zone = f"{region}-az{(i // 30) % 6}"
            if i % 3 == 0:
                name, cnt, mem, ty, base = AWS_GPUS[(i // 180) % len(AWS_GPUS)]
                info = f"\"{{'Gpus': [{{'Name': '{name}', 'Count': {cnt}, 'MemoryInfo': {{'SizeInMiB': {mem * 1024}}}}}]}}\""
                p = base * rnd.uniform(0.9, 1.4)
                f.write(f"{ty}.v{i // 1080},{name},{cnt}.0,{cnt * 12}.0,{cnt * 96}.0,{info},{p:.4f},{p * rnd.uniform(0.3, 0.6):.4f},{region},{zone},x86_64\n")
            else:
                v = 2 ** (1 + i % 7)
                p = 0.048 * v * rnd.uniform(0.9, 1.4)
                f.write(f"m{i % 9}i.s{i // 1080}x{v},,,{v}.0,{v * 4}.0,,{p:.4f},{p * 0.4:.4f},{region},{zone},x86_64\n")
    os.makedirs(f"{root}/gcp")
    with open(f"{root}/gcp/vms.csv", "w") as f:
        f.write("InstanceType,vCPUs,MemoryGiB,AcceleratorName,AcceleratorCount,GpuInfo,Region,AvailabilityZone,Price,SpotPrice\n")
        i = 0
        while i < n_gcp:
            region = f"gcp-region-{(i // 50) % 40}"
            zone = f"{region}-{'abcd'[(i // 2000) % 4]}"
            name, cnt, host, base = GCP_GPUS[i % len(GCP_GPUS)]
            p = base * rnd.uniform(0.9, 1.4)
            f.write(f"{host},{12 * cnt}.0,{85 * cnt}.0,,,,{region},{zone},{p * 0.2:.4f},{p * 0.08:.4f}\n")
            f.write(f",,,{name},{cnt},,{region},{zone},{p * 0.8:.4f},{p * 0.3:.4f}\n")
            v = 2 ** (1 + i % 6)
            f.write(f"n2-standard-{v}-x{i // 1000},{v}.0,{v * 4}.0,,,,{region},{zone},{0.05 * v:.4f},{0.02 * v:.4f}\n")
            i += 3
    os.makedirs(f"{root}/azure")
    with open(f"{root}/azure/vms.csv", "w") as f:
        f.write("InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,GpuInfo,Price,SpotPrice,Region,Generation\n")
        for i in range(n_az):
            region = f"azregion{i % 60}"
            if i % 4 == 0:
                name, cnt = [("A100-80GB", 8), ("H100", 8), ("T4", 1), ("V100", 4)][(i // 240) % 4]
                p = {"A100-80GB": 32.8, "H100": 98.3, "T4": 0.53, "V100": 12.2}[name] * rnd.uniform(0.9, 1.4)
                f.write(f"Standard_ND{i // 240}_{name},{name},{cnt},{cnt * 12},{cnt * 110},,{p:.4f},{p * 0.35:.4f},{region},V2\n")
            else:
                v = 2 ** (i % 7)
                p = 0.05 * v * rnd.uniform(0.9, 1.4)
                f.write(f"Standard_D{v}_v{i // 240},,,{v},{v * 4},,{p:.4f},{p * 0.2:.4f},{region},V2\n")


def run(home, catalog):
    env = dict(os.environ, GANGWAY_HOME=home)
    env.pop("GANGWAY_CATALOG_DIR", None)
    start = time.perf_counter()
    p = subprocess.run([BIN, "optimize", TASK, "--catalog", catalog], cwd=ROOT, env=env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    elapsed = (time.perf_counter() - start) * 1000
    if p.returncode != 0:
        sys.exit(f"optimize --catalog {catalog} exited {p.returncode}: {p.stderr}")
    return elapsed


def peak_rss_mib(home, catalog):
    if not os.path.exists(TIME):
        return float("nan")
    env = dict(os.environ, GANGWAY_HOME=home)
    env.pop("GANGWAY_CATALOG_DIR", None)
    p = subprocess.run([TIME, "-f", "%M", BIN, "optimize", TASK, "--catalog", catalog], cwd=ROOT,
                       env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    return int(p.stderr.strip().splitlines()[-1]) / 1024


def measure(label, catalog):
    rows = sum(max(0, sum(1 for _ in open(os.path.join(d, "vms.csv"))) - 1)
               for d in (os.path.join(catalog, c) for c in sorted(os.listdir(catalog)))
               if os.path.isfile(os.path.join(d, "vms.csv")))
    size = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(catalog) for f in fs)
    with tempfile.TemporaryDirectory() as home:
        first = run(home, catalog)
        first_rss = float("nan")
        with tempfile.TemporaryDirectory() as other:
            first_rss = peak_rss_mib(other, catalog)
        times = sorted(run(home, catalog) for _ in range(RUNS))
        rss = max(peak_rss_mib(home, catalog) for _ in range(5))
    p90 = times[int(len(times) * 0.9) - 1]
    print(f"{label}: {rows} rows, {size / 1e6:.1f} MB of CSV")
    print(f"  first run (parse, write cache): {first:.1f} ms, {first_rss:.1f} MiB peak")
    print(f"  cached: median {statistics.median(times):.1f} ms, p90 {p90:.1f} ms, {rss:.1f} MiB peak")


def main():
    if not os.path.exists(BIN):
        sys.exit(f"{BIN} not found: run `cargo build --release` first")
    print(f"binary: {BIN}; `gangway optimize {TASK} --catalog DIR`, {RUNS} cached runs")
    if os.path.isdir(SHARED):
        measure("published SkyPilot catalogs (../shared)", SHARED)
    with tempfile.TemporaryDirectory() as d:
        generate(d, ROWS)
        measure(f"generated ({ROWS} rows: AWS-, GCP-, Azure-shaped)", d)


if __name__ == "__main__":
    main()
