#!/usr/bin/env bash
# Cold-path A/B of two vlake builds on one GPU: each round starts build X's vlaked and runs
# `vlake_bench_alloc` with VLAKE_RESERVE=0 (every allocation reaches the daemon) under build X's
# hook, for both builds, the order alternating between rounds. Prints one JSON line per run
# (label cold_<a|b>_<round>) and, at the end, the median cold alloc p50 per size and build.
# Builds nothing (targets: vlaked vlake_hook vlake_bench_alloc). See docs/benchmarks.md.
#
#   bench/ab_cold.sh BUILD_A BUILD_B [ROUNDS]      # e.g. build/before build/gpu 8
set -uo pipefail
[[ $# -ge 2 ]] || { sed -n '2,8p' "$0"; exit 2; }
a="$(cd "$1" && pwd)" b="$(cd "$2" && pwd)" rounds="${3:-8}"
work="$(mktemp -d /tmp/vlake-ab-XXXXXX)"
chmod 755 "$work"
trap 'rm -rf "$work"; rm -f /dev/shm/vlake-ab-$$-*' EXIT
printf 'version: 1\ndefault:\n  limit: 64GiB\n' >"$work/vlake.yaml"
for ((round = 1; round <= rounds; round++)); do
  order="a b"
  ((round % 2 == 0)) && order="b a"
  for x in $order; do
    dir="$a"
    [[ "$x" == b ]] && dir="$b"
    sock="$work/$x.sock" state="vlake-ab-$$-$x-$round"
    "$dir/pool/vlaked" --config "$work/vlake.yaml" --socket "$sock" --state "$state" \
      --metrics-address none >>"$work/vlaked-$x.log" 2>&1 &
    pid=$!
    for _ in $(seq 1 300); do [[ -S "$sock" ]] && break; sleep 0.1; done
    [[ -S "$sock" ]] || { echo "ab_cold.sh: vlaked of $dir did not start" >&2; tail "$work/vlaked-$x.log" >&2; exit 1; }
    env LD_PRELOAD="$dir/hook/libvlake-hook.so" VLAKE_SOCKET="$sock" VLAKE_RESERVE=0 \
      "$dir/bench/vlake_bench_alloc" --sizes 2MiB,20MiB,256MiB,1GiB --iterations 200 \
      --label "cold_${x}_$round" | grep '^{' | tail -n 1 | tee -a "$work/runs.jsonl"
    kill "$pid"
    wait "$pid" 2>/dev/null
    rm -f "$sock" "/dev/shm/$state"
  done
done
python3 - "$work/runs.jsonl" <<'PY'
import json, statistics, sys
by = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    x = r["label"].split("_")[1]
    for s in r["sizes"]:
        by.setdefault((s["size"], x), []).append(s["alloc"]["p50_us"])
print("size     A median (range)        B median (range)        B/A")
for size in dict.fromkeys(k[0] for k in by):
    a, b = by[(size, "a")], by[(size, "b")]
    ma, mb = statistics.median(a), statistics.median(b)
    print(f"{size:<8} {ma:7.1f} ({min(a):.1f}-{max(a):.1f})  {mb:7.1f} ({min(b):.1f}-{max(b):.1f})  {mb / ma:.2f}x")
PY
