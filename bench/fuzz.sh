#!/usr/bin/env bash
# Fuzzes gangway's parsers with cargo-fuzz (libFuzzer) on a stable toolchain.
#
#   bench/fuzz.sh [SECONDS_PER_TARGET] [TARGETS...]
#
# SECONDS_PER_TARGET defaults to 60; TARGETS to all of them: task (task
# files, bytes -> gangway::spec::parse_bytes), catalog (SkyPilot v8 vms.csv
# -> offerings), ssh_pools (ssh_pools.yaml), slurm_clusters (slurm.yaml),
# manifest (a checkpoint rank manifest as a restore reads it from a bucket).
# It builds the targets (fuzz/target), seeds fuzz/corpus/<target>/ from the
# repository's files (and ../shared, or $GANGWAY_SHARED, when there), runs the targets one
# after another under `nice -n 19`, and prints per target the seconds run,
# executions, executions per second, corpus size and crashes, with the paths
# of their inputs under fuzz/artifacts/<target>/. The whole libFuzzer output
# of a target is kept in fuzz/artifacts/<target>.log.
#
# Exit status: 0 no crash, 1 a crash (panic, abort, timeout, out of memory)
# in some target, 2 cargo-fuzz or a C/C++ compiler missing, 3 build failed.
#
# Extra libFuzzer flags go in FUZZ_ARGS (e.g. FUZZ_ARGS=-jobs=2). A crash
# input replays with `cargo fuzz run -s none TARGET fuzz/artifacts/TARGET/crash-...`
# (from the repository root, CARGO_TARGET_DIR unset).
set -uo pipefail

cd "$(dirname "$0")/.."
root=$(pwd)
all=(task catalog ssh_pools slurm_clusters manifest)

secs=${1:-60}
if ! [[ $secs =~ ^[0-9]+$ ]] || ((secs < 1)); then
    echo "usage: bench/fuzz.sh [SECONDS_PER_TARGET] [TARGETS...]  (targets: ${all[*]})" >&2
    exit 2
fi
shift $(($# > 0 ? 1 : 0))
targets=("$@")
((${#targets[@]})) || targets=("${all[@]}")
for t in "${targets[@]}"; do
    if [[ " ${all[*]} " != *" $t "* ]]; then
        echo "fuzz.sh: unknown target '$t' (targets: ${all[*]})" >&2
        exit 2
    fi
done

# --- tools ------------------------------------------------------------------
missing=0
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz.sh: cargo-fuzz is not installed." >&2
    echo "  install it with: cargo install cargo-fuzz --locked" >&2
    missing=1
fi
# libfuzzer-sys compiles libFuzzer (C++) with the cc crate, which runs $CXX
# or `c++`; rusqlite's bundled SQLite needs a C compiler (`cc`).
if [[ -n ${CXX:-} ]]; then
    if ! command -v "${CXX%% *}" >/dev/null 2>&1; then
        echo "fuzz.sh: CXX=$CXX is not found." >&2
        echo "  unset CXX, or install a C++ compiler: sudo apt-get install g++   (Debian/Ubuntu)" >&2
        missing=1
    fi
elif ! command -v c++ >/dev/null 2>&1; then
    for cxx in clang++ g++; do
        if command -v $cxx >/dev/null 2>&1; then
            export CXX=$cxx
            break
        fi
    done
    if [[ -z ${CXX:-} ]]; then
        echo "fuzz.sh: no C++ compiler (c++, clang++ or g++); libFuzzer is C++." >&2
        echo "  install one with: sudo apt-get install g++   (Debian/Ubuntu; or clang)" >&2
        missing=1
    fi
fi
if ! command -v "${CC:-cc}" >/dev/null 2>&1; then
    echo "fuzz.sh: no C compiler (${CC:-cc}); the bundled SQLite needs one." >&2
    echo "  install one with: sudo apt-get install gcc   (Debian/Ubuntu; or clang)" >&2
    missing=1
fi
((missing)) && exit 2

# cargo-fuzz looks for its binaries under fuzz/target; the flags differ from
# the main build's, so never share a target dir with it.
unset CARGO_TARGET_DIR
# `-s none`: no sanitizer. AddressSanitizer needs -Zsanitizer (nightly);
# everything else cargo-fuzz passes (sancov instrumentation through
# -Cllvm-args, --cfg fuzzing, debug assertions and overflow checks) works on
# stable. Safe Rust needs no ASan to find panics, overflows, hangs and OOMs.
fuzz_flags=(-s none)

echo "== building the fuzz targets (cargo fuzz build ${fuzz_flags[*]}, release + debug assertions)"
if ! nice -n 19 cargo fuzz build "${fuzz_flags[@]}"; then
    echo "fuzz.sh: the build failed (see above)" >&2
    exit 3
fi

# --- seeds ------------------------------------------------------------------
seed() { # seed TARGET FILE [NAME]
    local dir=fuzz/corpus/$1 name=${3:-$(basename "$2")}
    [[ -f $2 ]] && cp -n "$2" "$dir/seed-$name" 2>/dev/null
    return 0
}
excerpt() { # excerpt TARGET CSV NAME [ROWS-FILTER-REGEX]: header + some rows
    local csv=$2 out=fuzz/corpus/$1/seed-$3
    [[ -f $csv && ! -f $out ]] || return 0
    {
        head -n 1 "$csv"
        if [[ -n ${4:-} ]]; then
            tail -n +2 "$csv" | grep -E -- "$4" | head -n 40
        else
            tail -n +2 "$csv" | head -n 30
            tail -n +2 "$csv" | awk -v n="$(wc -l <"$csv")" 'NR > n / 2' | head -n 30
        fi
    } >"$out"
}
shared=${GANGWAY_SHARED:-../shared}
for t in "${targets[@]}"; do
    mkdir -p "fuzz/corpus/$t" "fuzz/artifacts/$t"
    for f in fuzz/seeds/"$t"/*; do seed "$t" "$f"; done
    case $t in
    task)
        for f in examples/*.yaml; do seed task "$f" "examples-$(basename "$f")"; done
        for f in tests/bad_specs/*.yaml; do seed task "$f" "bad-$(basename "$f")"; done
        for f in "$shared"/compat/skypilot-tasks/*.yaml; do seed task "$f" "sky-$(basename "$f")"; done
        ;;
    catalog)
        for f in tests/fixtures/catalog/*/vms.csv; do
            seed catalog "$f" "fixture-$(basename "$(dirname "$f")").csv"
        done
        for f in src/core/catalog/data/*.csv; do seed catalog "$f" "own-$(basename "$f")"; done
        for cloud in aws azure gcp lambda; do
            excerpt catalog "$shared/catalogs/skypilot-format/$cloud/vms.csv" "shared-$cloud.csv"
        done
        # GCP's GPU rows (no InstanceType) with the hosts they join in one zone.
        excerpt catalog "$shared/catalogs/skypilot-format/gcp/vms.csv" shared-gcp-join.csv \
            '^(,|n1-standard-(4|8|16|96),|a2-highgpu-|g2-standard-(4|24),).*,us-central1-a,'
        ;;
    esac
done

# --- runs -------------------------------------------------------------------
dict_of() {
    case $1 in catalog) echo fuzz/dict/csv.dict ;; manifest) echo fuzz/dict/manifest.dict ;; *) echo fuzz/dict/yaml.dict ;; esac
}
# Real task files are a few KiB, catalogs excerpts up to 16 KiB here.
max_len_of() { [[ $1 == catalog ]] && echo 16384 || echo 8192; }

declare -A R_SECS R_EXECS R_RATE R_CORPUS R_CRASHES R_FILES
failed=0
for t in "${targets[@]}"; do
    log=fuzz/artifacts/$t.log
    before=$(ls "fuzz/artifacts/$t" | sort)
    echo "== fuzzing $t for ${secs}s (log: $log)"
    start=$(date +%s)
    # shellcheck disable=SC2086 # FUZZ_ARGS is split on purpose
    nice -n 19 cargo fuzz run "${fuzz_flags[@]}" "$t" "fuzz/corpus/$t" -- \
        -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
        -max_len="$(max_len_of "$t")" -dict="$(dict_of "$t")" \
        -print_final_stats=1 ${FUZZ_ARGS:-} >"$log" 2>&1
    rc=$?
    end=$(date +%s)
    new=$(comm -13 <(echo "$before") <(ls "fuzz/artifacts/$t" | sort) | grep -v '^$' || true)
    final() { grep -a "^stat::$1:" "$log" | tail -n 1 | awk '{print $2}'; }
    R_SECS[$t]=$((end - start))
    R_EXECS[$t]=$(final number_of_executed_units)
    R_RATE[$t]=$(final average_exec_per_sec)
    R_CORPUS[$t]=$(find "fuzz/corpus/$t" -type f | wc -l)
    R_CRASHES[$t]=$(echo -n "$new" | grep -c . || true)
    R_FILES[$t]=$(echo -n "$new" | sed "s|^|  fuzz/artifacts/$t/|")
    if ((rc != 0)) && ((R_CRASHES[$t] == 0)); then
        # libFuzzer stopped without an input to show (e.g. the harness broke).
        R_CRASHES[$t]=1
        R_FILES[$t]="  (no artifact; libFuzzer exited $rc, see $log)"
    fi
    if ((R_CRASHES[$t] > 0)); then
        failed=1
        grep -a -m 3 -E "panicked at|ERROR: libFuzzer|ALARM|out-of-memory|stack overflow" "$log" | sed 's/^/  /'
    fi
done

echo
printf '%-15s %8s %12s %8s %8s %8s\n' target seconds executions exec/s corpus crashes
for t in "${targets[@]}"; do
    printf '%-15s %8s %12s %8s %8s %8s\n' "$t" "${R_SECS[$t]}" "${R_EXECS[$t]:-?}" \
        "${R_RATE[$t]:-?}" "${R_CORPUS[$t]}" "${R_CRASHES[$t]}"
done
for t in "${targets[@]}"; do
    if ((R_CRASHES[$t] > 0)); then
        echo "crashes in $t (replay: cargo fuzz run ${fuzz_flags[*]} $t FILE):"
        echo "${R_FILES[$t]}"
    fi
done
((failed)) && exit 1
exit 0
