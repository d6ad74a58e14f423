#!/usr/bin/env bash
# Builds the libFuzzer targets (preset `fuzz`: clang-14, ASan + UBSan; tests/fuzz), replays
# each over its seed corpus (ctest -L fuzz), then fuzzes each for SECONDS (default 60), niced,
# as many targets at once as there are cores. Prints per target the executions, executions per
# second, corpus size and coverage; exits non-zero if the build, a replay or any fuzzing run
# fails (a crash, a sanitizer report, a broken invariant, a timeout of one input, memory over the
# limit).
#
#   ./scripts/fuzz.sh              # 60 s per target
#   ./scripts/fuzz.sh 600          # 10 minutes per target
#   ./scripts/fuzz.sh 0            # build and replay the seeds only
#   VLAKE_BUILD_DIR=build/my-fuzz ./scripts/fuzz.sh 30
#   VLAKE_FUZZ_TARGETS=quota ./scripts/fuzz.sh   # only these targets (codec, quota)
#
# Inputs that found new coverage are kept in <build>/corpus/<target> and reused by the next run
# (the seeds themselves are never written). A failing input is written to
# <build>/artifacts/<target>/ (crash-*, timeout-*, oom-*); replay it with
# `<build>/tests/fuzz/vlake_fuzz_<target> FILE`, and once fixed add it to the seeds.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${1:-60}"
if ! [[ "$seconds" =~ ^[0-9]+$ ]]; then
  echo "usage: scripts/fuzz.sh [SECONDS]" >&2
  exit 2
fi
dir="${VLAKE_BUILD_DIR:-build/fuzz}"
cuda_root="${VLAKE_CUDA_ROOT:-/usr/local/cuda}"
read -r -a targets <<<"${VLAKE_FUZZ_TARGETS:-codec quota}"
start=$SECONDS

# Like scripts/sanitizers.sh: without address-space randomization where the kernel needs it.
# shellcheck source=scripts/no_aslr.sh
. scripts/no_aslr.sh
no_aslr_runner fuzz.sh "the targets"
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:strict_string_checks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"

echo "fuzz.sh: configure and build $dir"
cmake --preset fuzz -B "$dir" -DVLAKE_CUDA_ROOT="$cuda_root" >/dev/null
nice cmake --build "$dir" -j "$(nproc)"
echo "fuzz.sh: replay the seed corpora"
"${runner[@]}" ctest --test-dir "$dir" -L '^fuzz$' --output-on-failure
build_took=$((SECONDS - start))

# Per target: its extra libFuzzer flags and its seed directory.
declare -A flags=(
  [codec]="-max_len=4096"
  [quota]="-max_len=16384 -dict=tests/fuzz/quota.dict"
)
declare -A seeds=(
  [codec]="$dir/seeds/codec"
  [quota]="tests/fuzz/seeds/quota"
)

summary=()
failed=()
# The targets fuzz side by side, as many at once as there are cores (each libFuzzer run is one
# process on one core), so SECONDS is the wall time of each round, not of each target.
fuzz_one() {  # fuzz_one <target>: one libFuzzer run; its exit status
  local t="$1"
  # shellcheck disable=SC2086  # flags are words
  nice -n 15 "${runner[@]}" "$dir/tests/fuzz/vlake_fuzz_$t" ${flags[$t]} -max_total_time="$seconds" \
    -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$dir/artifacts/$t/" \
    "$dir/corpus/$t" "${seeds[$t]}" >"$dir/fuzz-$t.log" 2>&1
}
report_one() {  # report_one <target> <exit status>: its summary line; its log's end when it failed
  local t="$1" rc="$2" log="$dir/fuzz-$1.log"
  local execs rate last cov corp status=ok
  execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)"
  rate="$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)"
  last="$(grep -a -E '^#[0-9]+' "$log" | tail -1 || true)"
  cov="$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")"
  corp="$(sed -n 's/.* corp: \([0-9]*\/[0-9a-zA-Z]*\).*/\1/p' <<<"$last")"
  if ((rc != 0)); then
    status="FAILED (exit $rc)"
    failed+=("$t")
    echo "fuzz.sh: $t failed; the end of its log:" >&2
    tail -n 40 "$log" >&2
    ls "$dir/artifacts/$t" >&2
  fi
  summary+=("$(printf '%-6s %6ss %12s execs %9s/s  corpus %-12s cov %-6s %s' "$t" "$seconds" "${execs:-?}" \
    "${rate:-?}" "${corp:-?}" "${cov:-?}" "$status")")
}
if ((seconds > 0)); then
  for t in "${targets[@]}"; do
    if [[ -z "${seeds[$t]:-}" ]]; then
      echo "fuzz.sh: unknown target '$t' (codec, quota)" >&2
      exit 2
    fi
    mkdir -p "$dir/corpus/$t" "$dir/artifacts/$t"
  done
  at_once="$(nproc)"
  for ((i = 0; i < ${#targets[@]}; i += at_once)); do
    round=("${targets[@]:i:at_once}")
    declare -A pids=()
    for t in "${round[@]}"; do
      echo "fuzz.sh: $t for ${seconds}s (log: $dir/fuzz-$t.log)"
      fuzz_one "$t" &
      pids[$t]=$!
    done
    for t in "${round[@]}"; do
      rc=0
      wait "${pids[$t]}" || rc=$?
      report_one "$t" "$rc"
    done
    unset pids
  done
fi

took=$((SECONDS - start))
echo "fuzz.sh: summary (build and seed replay $((build_took / 60))m$((build_took % 60))s," \
  "total $((took / 60))m$((took % 60))s)"
((${#summary[@]})) && printf '  %s\n' "${summary[@]}"
if ((${#failed[@]})); then
  echo "fuzz.sh: failed: ${failed[*]}" >&2
  exit 1
fi
