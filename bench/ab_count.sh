#!/usr/bin/env bash
# Instruction-count A/B of two vlake builds on the simulator (no GPU): for each build, a vlaked on
# the simulated driver and `vlake_bench_alloc` under that build's hook, run under callgrind twice
# (FEW and MANY alloc/free pairs per size); the difference divided by the extra pairs is the
# instructions one hooked alloc/free pair costs in the tenant process (its hook, the simulated
# driver and the benchmark's own loop), warm (VLAKE_RESERVE=4GiB: served by the local reserve) and
# cold (VLAKE_RESERVE=0: a Grant and a Release message each). Deterministic where timing is not:
# the same build counts the same within a fraction of a percent. Prints one line per build and
# mode and the ratio B/A. Needs valgrind. Builds nothing (targets: vlaked vlake_hook vlake_sim
# vlake_bench_alloc). See docs/benchmarks.md.
#
#   bench/ab_count.sh BUILD_A BUILD_B        # e.g. build/before build/release
set -uo pipefail
[[ $# -ge 2 ]] || { sed -n '2,12p' "$0"; exit 2; }
command -v valgrind >/dev/null || { echo "ab_count.sh: needs valgrind (apt-get install valgrind)" >&2; exit 2; }
few=20 many=220 sizes=2MiB,20MiB
work="$(mktemp -d /tmp/vlake-abc-XXXXXX)"
chmod 755 "$work"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  rm -rf "$work"
  rm -f /dev/shm/vlake-abc-$$-* /dev/shm/vlake-sim-abc-$$* 2>/dev/null
}
trap cleanup EXIT
printf 'version: 1\ndefault:\n  limit: 8GiB\n' >"$work/vlake.yaml"
export VLAKE_SIM_NODE="abc-$$" VLAKE_SIM_DEVICE_MEMORY=16GiB VLAKE_SIM_DEVICE_COUNT=1

count() {  # $1 build dir, $2 reserve, $3 iterations -> instructions of the tenant
  local dir="$1" out="$work/cg.$RANDOM"
  env LD_LIBRARY_PATH="$dir/sim" LD_PRELOAD="$dir/hook/libvlake-hook.so" VLAKE_SOCKET="$work/sock" \
    VLAKE_RESERVE="$2" valgrind --tool=callgrind --callgrind-out-file="$out" \
    "$dir/bench/vlake_bench_alloc" --sizes "$sizes" --iterations "$3" --warmup 2 --label count \
    >/dev/null 2>"$out.log" || { echo "ab_count.sh: tenant failed under $dir" >&2; tail "$out.log" >&2; return 1; }
  awk '/^summary:|^totals:/ {print $2; exit}' "$out"
}

declare -A per
for x in a b; do
  dir="$1"; [[ "$x" == b ]] && dir="$2"
  dir="$(cd "$dir" && pwd)"
  rm -f "$work/sock"
  "$dir/pool/vlaked" --config "$work/vlake.yaml" --socket "$work/sock" --state "vlake-abc-$$-$x" \
    --metrics-address none --driver "$dir/sim/libcuda.so.1" --nvml none >>"$work/vlaked-$x.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 1 300); do [[ -S "$work/sock" ]] && break; sleep 0.1; done
  [[ -S "$work/sock" ]] || { echo "ab_count.sh: vlaked of $dir did not start" >&2; tail "$work/vlaked-$x.log" >&2; exit 1; }
  for mode in warm cold; do
    reserve=4GiB; [[ "$mode" == cold ]] && reserve=0
    lo="$(count "$dir" "$reserve" "$few")" || exit 1
    hi="$(count "$dir" "$reserve" "$many")" || exit 1
    n_sizes=$(($(tr -cd , <<<"$sizes" | wc -c) + 1))
    per[$x.$mode]=$(((hi - lo) / ((many - few) * n_sizes)))
    printf '%s %-4s %s: %d instructions per alloc/free pair (%d - %d over %d pairs)\n' "$x" "$mode" "$dir" \
      "${per[$x.$mode]}" "$hi" "$lo" $(((many - few) * n_sizes))
  done
  kill "${pids[-1]}"; wait "${pids[-1]}" 2>/dev/null
done
for mode in warm cold; do
  python3 -c "import sys; a,b=int(sys.argv[1]),int(sys.argv[2]); print(f'{sys.argv[3]}: B/A = {b/a:.3f} ({b} / {a} instructions per pair)')" \
    "${per[a.$mode]}" "${per[b.$mode]}" "$mode"
done
