#!/usr/bin/env bash
# A/B of two vlake builds' allocation paths on one GPU: each round starts build X's vlaked and
# runs `vlake_bench_alloc` under build X's hook, for both builds, the order alternating between
# rounds, once per mode: `cold` (VLAKE_RESERVE=0: every allocation reaches the daemon) and/or
# `warm` (VLAKE_RESERVE=4GiB: served by the hook's local reserve). Prints one JSON line per run
# (label <mode>_<a|b>_<round>) and, at the end, per mode and size: the median alloc p50 of each
# build with its range, and the paired ratio B/A (median of the rounds' ratios, its range and a
# bootstrap 95% interval of that median). Builds nothing (targets: vlaked vlake_hook
# vlake_bench_alloc). See docs/benchmarks.md.
#
#   bench/ab.sh BUILD_A BUILD_B [ROUNDS] [MODES]   # e.g. build/before build/gpu 10 warm,cold
set -uo pipefail
[[ $# -ge 2 ]] || { sed -n '2,11p' "$0"; exit 2; }
a="$(cd "$1" && pwd)" b="$(cd "$2" && pwd)" rounds="${3:-10}" modes="${4:-cold}"
work="$(mktemp -d /tmp/vlake-ab-XXXXXX)"
chmod 755 "$work"
trap 'rm -rf "$work"' EXIT
printf 'version: 1\ndefault:\n  limit: 64GiB\n' >"$work/vlake.yaml"
for ((round = 1; round <= rounds; round++)); do
  order="a b"
  ((round % 2 == 0)) && order="b a"
  for x in $order; do
    dir="$a"
    [[ "$x" == b ]] && dir="$b"
    sock="$work/$x.sock" state="$work/state-$x-$round"  # a file in the private work directory
    "$dir/pool/vlaked" --config "$work/vlake.yaml" --socket "$sock" --state "$state" \
      --metrics-address none >>"$work/vlaked-$x.log" 2>&1 &
    pid=$!
    for _ in $(seq 1 300); do [[ -S "$sock" ]] && break; sleep 0.1; done
    [[ -S "$sock" ]] || { echo "ab.sh: vlaked of $dir did not start" >&2; tail "$work/vlaked-$x.log" >&2; exit 1; }
    for mode in ${modes//,/ }; do
      reserve=0
      [[ "$mode" == warm ]] && reserve=4GiB
      env LD_PRELOAD="$dir/hook/libvlake-hook.so" VLAKE_SOCKET="$sock" VLAKE_RESERVE="$reserve" \
        "$dir/bench/vlake_bench_alloc" --sizes 2MiB,20MiB,256MiB,1GiB --iterations 200 \
        --label "${mode}_${x}_$round" | grep '^{' | tail -n 1 | tee -a "$work/runs.jsonl"
    done
    kill "$pid"
    wait "$pid" 2>/dev/null
    rm -f "$sock" "$state"
  done
done
python3 - "$work/runs.jsonl" <<'PY'
import json, random, statistics, sys
by = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    mode, x, rnd = r["label"].split("_")
    for s in r["sizes"]:
        by.setdefault((mode, s["size"]), {}).setdefault(x, {})[int(rnd)] = s["alloc"]["p50_us"]
rng = random.Random(1)
print("mode size     A median (range)         B median (range)         B/A paired: median (range) [95% CI]")
for (mode, size), d in by.items():
    a, b = d.get("a", {}), d.get("b", {})
    rounds = sorted(set(a) & set(b))
    if not rounds:
        continue
    ratios = [b[k] / a[k] for k in rounds]
    boot = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(2000))
    lo, hi = boot[int(0.025 * len(boot))], boot[int(0.975 * len(boot)) - 1]
    av, bv = list(a.values()), list(b.values())
    print(f"{mode:<4} {size:<8} {statistics.median(av):7.2f} ({min(av):.2f}-{max(av):.2f})  "
          f"{statistics.median(bv):7.2f} ({min(bv):.2f}-{max(bv):.2f})  "
          f"{statistics.median(ratios):.3f}x ({min(ratios):.3f}-{max(ratios):.3f}) [{lo:.3f}-{hi:.3f}] n={len(ratios)}")
PY
