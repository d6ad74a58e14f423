#!/usr/bin/env bash
# vlake benchmarks: runs every benchmark against native CUDA and under libvlake-hook.so with
# its own vlaked, then prints one table (metric, native/baseline, hook, ratio, target, result)
# and writes the same as JSON. Builds nothing. See docs/benchmarks.md.
#
#   bench/run.sh [--sim] [--quick] [--build DIR] [--results FILE] [--tenants LIST]
#                [--pairs N] [--train-pairs N] [--start-processes LIST] [--only LIST] [--strict]
#
#   --sim          run the C++ benchmarks against the simulated driver (no GPU, no PyTorch): a
#                  smoke test of the machinery; the timings are not GPU timings
#   --quick        fewer iterations and shorter traces, 3 training pairs unless --train-pairs
#   --build        build directory (default: build/gpu, else build/release)
#   --results      JSON results file (default: <build>/bench-results.json)
#   --tenants      comma-separated tenant counts for the alloc runs, each native, hook warm and
#                  hook cold with that many processes at once (default 1,4,8; 1 always runs)
#   --pairs        interleaved native/hook pairs of the launch, decode, load and start rows
#                  (bench/pairs/pairs.py; default 10, --quick 3)
#   --train-pairs  the same for the training rows, per allocator (default: --pairs)
#   --start-processes  process counts of the start rows (default 32,128; --sim 4,16)
#   --only         comma-separated sections to run (default all): alloc, launch, decode, load,
#                  train, start, replay, storm; rows of the others are left out of the table
#   --keep DIR     copy the raw outputs and the logs (workers', vlaked's) to DIR at the end
#   --strict       exit 1 if a row with a target fails (default: exit 0 once the table is out)
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"

sim=0 quick=0 strict=0 tenants=1,4,8 pairs="" train_pairs="" build="" results="" only="" start_procs="" keep=""
while (($#)); do
  case "$1" in
    --sim) sim=1 ;;
    --quick) quick=1 ;;
    --strict) strict=1 ;;
    --build) build="$2"; shift ;;
    --results) results="$2"; shift ;;
    --tenants) tenants="$2"; shift ;;
    --pairs) pairs="$2"; shift ;;
    --train-pairs) train_pairs="$2"; shift ;;
    --start-processes) start_procs="$2"; shift ;;
    --only) only="$2"; shift ;;
    --keep) keep="$2"; shift ;;
    -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
# Tenant counts: 1 (the baseline of the multi-tenant rows) and the listed ones, ascending.
klist=(1)
IFS=, read -ra asked <<<"$tenants"
for k in "${asked[@]}"; do
  [[ "$k" =~ ^[0-9]+$ ]] && ((10#$k >= 1 && 10#$k <= 64)) || { echo "run.sh: --tenants takes counts 1..64, got '$tenants'" >&2; exit 2; }
  [[ " ${klist[*]} " == *" $((10#$k)) "* ]] || klist+=($((10#$k)))
done
mapfile -t klist < <(printf '%s\n' "${klist[@]}" | sort -n)
tenants="$(IFS=,; echo "${klist[*]}")"
[[ -z "$pairs" ]] && { pairs=10; ((quick)) && pairs=3; }
[[ "$pairs" =~ ^[0-9]+$ ]] && ((pairs >= 1)) || { echo "run.sh: --pairs takes a count >= 1" >&2; exit 2; }
[[ -z "$train_pairs" ]] && train_pairs="$pairs"
[[ "$train_pairs" =~ ^[0-9]+$ ]] && ((train_pairs >= 1)) || { echo "run.sh: --train-pairs takes a count >= 1" >&2; exit 2; }
[[ -z "$start_procs" ]] && { start_procs=32,128; ((sim)) && start_procs=4,16; }
[[ "$start_procs" =~ ^[0-9]+(,[0-9]+)*$ ]] || { echo "run.sh: --start-processes takes counts, e.g. 32,128" >&2; exit 2; }
sections=(alloc launch decode load train start replay storm)
[[ -z "$only" ]] && only="$(IFS=,; echo "${sections[*]}")"
IFS=, read -ra only_list <<<"$only"
for x in "${only_list[@]}"; do
  [[ " ${sections[*]} " == *" $x "* ]] || { echo "run.sh: --only takes sections of: ${sections[*]}; got '$x'" >&2; exit 2; }
done
want() { [[ ",$only," == *",$1,"* ]]; }
if [[ -z "$build" ]]; then
  for b in "$root/build/gpu" "$root/build/release"; do [[ -d "$b" ]] && { build="$b"; break; }; done
fi
[[ -n "$build" && -d "$build" ]] || { echo "run.sh: no build directory (use --build DIR)" >&2; exit 2; }
build="$(cd "$build" && pwd)"
results="${results:-$build/bench-results.json}"

alloc_bin="$build/bench/vlake_bench_alloc"
replay_bin="$build/bench/vlake_bench_replay"
watch_bin="$build/bench/vlake_bench_poolwatch"
vlaked="$build/pool/vlaked"
hook="$build/hook/libvlake-hook.so"
launch_bin="$build/bench/vlake_bench_launch"
start_bin="$build/bench/vlake_bench_start"
for f in "$alloc_bin" "$replay_bin" "$watch_bin" "$launch_bin" "$start_bin" "$vlaked" "$hook"; do
  [[ -x "$f" || -f "$f" ]] || { echo "run.sh: missing $f (build targets vlake_bench vlaked vlake_hook)" >&2; exit 2; }
done

work="$(mktemp -d /tmp/vlake-bench-XXXXXX)"
chmod 755 "$work"
raw="$work/raw"
mkdir -p "$raw"
daemon_pid=""
cleanup() {
  [[ -n "$daemon_pid" ]] && kill "$daemon_pid" 2>/dev/null && wait "$daemon_pid" 2>/dev/null
  rm -f "/dev/shm/vlake-bench-$$-"* "/dev/shm/vlake-sim-bench-$$" 2>/dev/null
  if [[ -n "$keep" ]]; then
    mkdir -p "$keep" && cp -r "$raw" "$keep/" && cp "$work"/*.log "$keep/" 2>/dev/null
  fi
  rm -rf "$work"
}
trap cleanup EXIT

if ((sim)); then
  export VLAKE_SIM_NODE="bench-$$"
  export VLAKE_SIM_DEVICE_MEMORY=32GiB  # memfd-backed: only touched pages cost host memory
  export VLAKE_SIM_DEVICE_COUNT=1
  export LD_LIBRARY_PATH="$build/sim${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  limit=30GiB
  daemon_driver=(--driver "$build/sim/libcuda.so.1" --nvml none)
else
  limit=64GiB
  daemon_driver=()
fi
if ((quick)); then
  iters=20; sizes=2MiB,20MiB,256MiB,1GiB; steps=20; replay_args=(--max-events 3000)
else
  iters=200; sizes=2MiB,20MiB,256MiB,1GiB; steps=30; replay_args=()
fi
((sim)) && replay_args+=(--scale-div 4)
# Several tenants at once on the simulator: no 1 GiB size. There every new handle is zeroed by
# page-faulting host memory on the daemon's thread, while the tenants' processes compete with it
# for the same few cores: 8 tenants x 1 GiB grow the daemon to 8 GiB resident and can stall it
# past VLAKE_TIMEOUT (10 s) on a busy 2-core machine.
multi_sizes="$sizes"
((sim)) && multi_sizes=2MiB,20MiB,256MiB
printf 'version: 1\ndefault:\n  limit: %s\n' "$limit" >"$work/vlake.yaml"
# The start rows' daemon: the whole GPU for the one tenant (every hooked process is the same
# user), since 128 CUDA contexts alone take tens of GiB and contexts count against the limit.
start_limit=100%
((sim)) && start_limit="$limit"
printf 'version: 1\ndefault:\n  limit: %s\n' "$start_limit" >"$work/vlake-start.yaml"
conf="$work/vlake.yaml"
sock="$work/vlaked.sock"
hooked=(env LD_PRELOAD="$hook" VLAKE_SOCKET="$sock" ASAN_OPTIONS=verify_asan_link_order=0)

start_daemon() {  # $1: state name, rest: more vlaked flags
  state="$work/$1"; shift  # a file in the private work directory
  "$vlaked" --config "$conf" --socket "$sock" --state "$state" --metrics-address none \
    "${daemon_driver[@]}" "$@" >>"$work/vlaked.log" 2>&1 &
  daemon_pid=$!
  for _ in $(seq 1 300); do
    [[ -S "$sock" ]] && return 0
    kill -0 "$daemon_pid" 2>/dev/null || break
    sleep 0.1
  done
  echo "run.sh: vlaked did not start:" >&2; tail -n 20 "$work/vlaked.log" >&2; exit 1
}
stop_daemon() {
  kill "$daemon_pid" 2>/dev/null; wait "$daemon_pid" 2>/dev/null; daemon_pid=""
  rm -f "$sock" "$state" 2>/dev/null
}
step() { echo "-- $*" >&2; }
run_json() {  # $1: output name, rest: command; keeps the last JSON line
  local name="$1"; shift
  if ! "$@" >"$raw/$name.out" 2>"$raw/$name.err"; then
    echo "run.sh: $name failed:" >&2; tail -n 5 "$raw/$name.err" >&2
    echo '{"error":"failed"}' >"$raw/$name.json"; return 1
  fi
  grep '^{' "$raw/$name.out" | tail -n 1 >"$raw/$name.json"
}

# The interleaved pairs (bench/pairs/pairs.py) of one suite against the running daemon.
pairs_suite() {  # $1: suite, $2: pair count
  step "$1: $2 interleaved pairs, native and hooked (bench/pairs/pairs.py)"
  local drv=()
  ((sim)) && drv=(--driver "$build/sim/libcuda.so.1")
  local q=(); ((quick)) && q=(--quick)
  python3 "$here/pairs/pairs.py" "$1" --out "$raw" --work "$work" --pairs "$2" --build "$build" "${drv[@]}" \
    "${q[@]}" --start-processes "$start_procs" --hook-env LD_PRELOAD="$hook" --hook-env VLAKE_SOCKET="$sock" \
    --hook-env ASAN_OPTIONS=verify_asan_link_order=0 2>&1 | sed 's/^/   /' >&2
}
has_torch=0
if ((!sim)) && python3 -c 'import torch' 2>/dev/null; then has_torch=1; fi

if want alloc; then
start_daemon "vlake-bench-$$-a"
# For each tenant count K: native, hook warm, hook cold, each with K processes at once (K = 1:
# alloc_native, alloc_warm, alloc_cold; else alloc_<kind>_x<K>), the native baseline next to
# the hooked runs it is compared with.
for k in "${klist[@]}"; do
  step "alloc/free latency, $k tenant(s) at once: native, hook warm, hook cold"
  sfx="" tlabel=""
  ((k > 1)) && sfx="_x$k" tlabel="_x$k"
  kargs=(--sizes "$sizes" --iterations "$iters" --tenants "$k")
  ((k > 1)) && kargs[1]="$multi_sizes"
  run_json "alloc_native$sfx" "$alloc_bin" "${kargs[@]}" --label "native$tlabel"
  run_json "alloc_warm$sfx" "${hooked[@]}" VLAKE_RESERVE=4GiB "$alloc_bin" "${kargs[@]}" --label "hook_warm$tlabel"
  run_json "alloc_cold$sfx" "${hooked[@]}" VLAKE_RESERVE=0 "$alloc_bin" "${kargs[@]}" --label "hook_cold$tlabel"
done
stop_daemon
fi

if want launch || want decode || want load || want train; then
  start_daemon "vlake-bench-$$-p"
  want launch && pairs_suite launch "$pairs"
  if ((has_torch)); then
    want decode && pairs_suite decode "$pairs"
    want load && pairs_suite load "$pairs"
    # A model large enough that a step is bound by the GPU, not by Python and kernel launches:
    # smaller ones vary by tens of percent from run to run, which hides a 1 % difference.
    want train && pairs_suite train "$train_pairs"
  elif ((!sim)); then
    echo "run.sh: no PyTorch: the decode, load and training rows are n/a" >&2
  fi
  stop_daemon
fi

if want start; then
  conf="$work/vlake-start.yaml"
  start_daemon "vlake-bench-$$-s"
  pairs_suite start "$pairs"
  stop_daemon
  conf="$work/vlake.yaml"
fi

if want replay; then
step "trace replay: each trace native alone, then all at once natively and under the hook"
traces=(train_ckpt lora infer_kv)
for t in "${traces[@]}"; do
  run_json "replay_native_$t" "$replay_bin" --trace "$here/traces/$t.trace" "${replay_args[@]}" --label native
done
# The hooked replays below run the three traces at once, so the baseline they are judged by does
# too: three processes share the GPU driver (its locks, the GPU's copy and memset engines).
replay_native_all() {
  local pace=1; ((sim)) && pace=0
  local start_at=$(( $(date +%s%3N) + 1500 ))
  local pids=() t p
  for t in "${traces[@]}"; do
    run_json "replay_native_all_$t" "$replay_bin" --trace "$here/traces/$t.trace" "${replay_args[@]}" \
      --pace "$pace" --start-at "$start_at" --label native_all &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
}
replay_native_all
# All traces at once under the hook, each tenant its own process: with the local reserve (the
# default) and with it off (every alloc/free reaches the pool: memory moves between tenants).
replay_all() {  # $1: tag, $2: VLAKE_RESERVE (default: the hook's), rest: more vlaked flags
  local tag="$1" reserve="$2"; shift 2
  start_daemon "vlake-bench-$$-r$tag" "$@"
  local pace=1; ((sim)) && pace=0
  "$watch_bin" --state "$state" --interval-ms 20 >"$raw/poolwatch$tag.json" 2>"$raw/poolwatch$tag.err" &
  local watch_pid=$!
  local start_at=$(( $(date +%s%3N) + 1500 ))
  local pids=() t p
  local res=()
  [[ "$reserve" == default ]] || res=(VLAKE_RESERVE="$reserve")  # default: the hook's own defaults
  for t in "${traces[@]}"; do
    run_json "replay_hook${tag}_$t" "${hooked[@]}" "${res[@]}" "$replay_bin" \
      --trace "$here/traces/$t.trace" "${replay_args[@]}" --pace "$pace" --start-at "$start_at" --label "hook$tag" &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
  kill -TERM "$watch_pid" 2>/dev/null; wait "$watch_pid" 2>/dev/null
  stop_daemon
}
replay_all "" default
replay_all "_nores" 0
# The daemon's warm stock on (docs/pool.md, "Warm reserve and warm stock"; off by default).
replay_all "_stock" default --warm-stock 1GiB
# The hook's prefetch on (docs/hook.md, "Prefetch"; off by default).
hooked_plain=("${hooked[@]}")
hooked+=(VLAKE_PREFETCH=8)
replay_all "_prefetch" default
hooked=("${hooked_plain[@]}")
fi

# Storm (docs/benchmarks.md, "Storm"): 64 tenants x 4 threads with the reserve off, one of them
# SIGSTOPped in the middle. It measures vlaked's event loop, not the driver, so it always runs on
# the simulator (64 CUDA contexts would not fit a GPU), with its own vlaked.
storm_tenants=64 storm_args=(--duration-ms 10000 --stop-at-ms 4000 --stop-ms 3000)
((quick)) && storm_args=(--duration-ms 5000 --stop-at-ms 2000 --stop-ms 1500)
if ! want storm; then
  :
elif [[ -x "$build/bench/vlake_bench_storm" && -f "$build/sim/libcuda.so.1" ]]; then
  step "storm: $storm_tenants tenants x 4 threads, reserve off, one SIGSTOPped (simulator)"
  (
    umask 0002  # the simulator's node file: tenants run under their own uids (gid 0)
    export VLAKE_SIM_NODE="bench-$$-storm" VLAKE_SIM_DEVICE_MEMORY=64GiB VLAKE_SIM_DEVICE_COUNT=1
    export LD_LIBRARY_PATH="$build/sim${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    storm_state="$work/state-storm"
    printf 'version: 1\ndefault:\n  limit: 60GiB\n' >"$work/storm.yaml"
    # The simulated tenants burn CPU for what a GPU does; vlaked gets the CPU priority of a
    # node's system daemon (as root; otherwise nice warns and it runs at the default).
    nice -n -10 "$vlaked" --config "$work/storm.yaml" --socket "$work/storm.sock" --state "$storm_state" \
      --metrics-address none --nvml none --driver "$build/sim/libcuda.so.1" >>"$work/vlaked-storm.log" 2>&1 &
    storm_daemon=$!
    for _ in $(seq 1 100); do [[ -S "$work/storm.sock" ]] && break; sleep 0.1; done
    run_json storm env VLAKE_SOCKET="$work/storm.sock" ASAN_OPTIONS=verify_asan_link_order=0 \
      "$build/bench/vlake_bench_storm" \
      --hook "$hook" --driver "$build/sim/libcuda.so.1" --state "$storm_state" --tenants "$storm_tenants" \
      --threads 4 "${storm_args[@]}" --label storm
    kill "$storm_daemon" 2>/dev/null; wait "$storm_daemon" 2>/dev/null
    rm -f "$storm_state" "/dev/shm/vlake-sim-bench-$$-storm" 2>/dev/null
  )
else
  echo "run.sh: no vlake_bench_storm or simulator in $build: storm rows are n/a" >&2
fi

mode=gpu; ((sim)) && mode=sim
python3 "$here/report.py" --raw "$raw" --mode "$mode" --quick "$quick" --tenants "$tenants" \
  --train-pairs "$train_pairs" --pairs "$pairs" --only "$only" --results "$results" --strict "$strict"
