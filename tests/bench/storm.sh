#!/usr/bin/env bash
# bench.storm (sim): vlake_bench_storm against a real vlaked on the simulator, shorter than the
# benchmark and with bounds generous enough for a loaded 2-core CI machine:
#   64 tenants x 4 threads with the reserve off, one tenant SIGSTOPped for 2.5 s in the middle;
#   every tenant finishes (no stall), no allocation fails, the daemon's grant p99 <= 20 ms and
#   max <= 200 ms, grants go on while the tenant is stopped, and neither the daemon's nor the
#   other tenants' p99 while it is stopped is far above the p99 before (the tenants': or under
#   40 % of the stop, which a stall behind the stopped tenant would exceed).
#   storm.sh <build dir> [storm options...]
set -uo pipefail
build="$1"; shift
umask 0002  # the simulator's node file stays group-writable: tenants run under other uids
work="$(mktemp -d /tmp/vlake-storm-test-XXXXXX)"
chmod 755 "$work"
node="storm-test-$$"
state="$work/state"  # a file in the private work directory
daemon_pid=""
cleanup() {
  [[ -n "$daemon_pid" ]] && kill -9 "$daemon_pid" 2>/dev/null && wait "$daemon_pid" 2>/dev/null
  rm -rf "$work"
  rm -f "/dev/shm/vlake-sim-$node"
}
trap cleanup EXIT
export VLAKE_SIM_NODE="$node" VLAKE_SIM_DEVICE_MEMORY=64GiB VLAKE_SIM_DEVICE_COUNT=1
printf 'version: 1\ndefault:\n  limit: 60GiB\n' >"$work/vlake.yaml"
"$build/pool/vlaked" --config "$work/vlake.yaml" --socket "$work/vlaked.sock" --state "$state" \
  --metrics-address none --nvml none --driver "$build/sim/libcuda.so.1" >"$work/vlaked.log" 2>&1 &
daemon_pid=$!
for _ in $(seq 1 100); do [[ -S "$work/vlaked.sock" ]] && break; sleep 0.1; done
[[ -S "$work/vlaked.sock" ]] || { echo "storm: vlaked did not start"; cat "$work/vlaked.log"; exit 1; }

# The tenants preload the hook: under ASan its runtime is not first in their library list.
VLAKE_SOCKET="$work/vlaked.sock" LD_LIBRARY_PATH="$build/sim" ASAN_OPTIONS="verify_asan_link_order=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}" timeout 55 "$build/bench/vlake_bench_storm" \
  --hook "$build/hook/libvlake-hook.so" --driver "$build/sim/libcuda.so.1" --state "$state" \
  --tenants 64 --threads 4 --duration-ms 8000 --stop-at-ms 3000 --stop-ms 2500 --think-us 2000 \
  --label ci "$@" >"$work/storm.json" 2>"$work/storm.err"
rc=$?
cat "$work/storm.json"
if ((rc != 0)); then
  echo "storm: vlake_bench_storm exited $rc"; tail -n 20 "$work/storm.err"; tail -n 20 "$work/vlaked.log"; exit 1
fi
kill -0 "$daemon_pid" 2>/dev/null || { echo "storm: vlaked died"; tail -n 20 "$work/vlaked.log"; exit 1; }
python3 - "$work/storm.json" <<'PY'
import json, sys
d = json.loads([l for l in open(sys.argv[1]) if l.startswith("{")][-1])
c, g = d["client"], d["daemon"]
errors = []
def check(ok, what):
    if not ok:
        errors.append(what)
check(d["finished"], "a tenant stalled (did not finish)")
check(d["stopped"] is not None and "stop_retries" in d["stopped"], "no stopped tenant")
check(c["failed_tenants"] == 0, "%d tenants failed" % c["failed_tenants"])
check(c["errors"] == 0, "%d allocations failed" % c["errors"])
check(g["all"]["n"] >= 1000, "only %d grants" % g["all"]["n"])
check(g["all"]["p99_us"] <= 20000, "daemon grant p99 %.0f us > 20 ms" % g["all"]["p99_us"])
check(g["max_us"] <= 200000, "daemon grant max %.0f us > 200 ms" % g["max_us"])
before, during = g["before"], g["during"]
check(during["n"] >= 100, "only %d grants while a tenant was stopped: the daemon stalled" % during["n"])
check(during["p99_us"] <= max(3 * before["p99_us"], before["p99_us"] + 5000),
      "daemon p99 while a tenant is stopped %.0f us vs %.0f us before" % (during["p99_us"], before["p99_us"]))
cb, cd = c["alloc"]["before"], c["alloc"]["during"]
check(cd["n"] >= 100, "only %d allocations of the other tenants while one was stopped" % cd["n"])
# The clients' latencies are mostly CPU contention (256 threads on 2 cores, and whatever else runs):
# a stall behind the stopped tenant would hold them for its whole stop, so the bound is also
# met under 40 % of the stop.
stop_us = 1000 * d["stopped"]["stop_ms"]
check(cd["p99_us"] <= max(3 * cb["p99_us"], cb["p99_us"] + 50000, 0.4 * stop_us),
      "the other tenants' alloc p99 while one is stopped %.0f us vs %.0f us before (stop %.0f us)"
      % (cd["p99_us"], cb["p99_us"], stop_us))
print("storm: daemon p50/p99/max %.0f/%.0f/%.0f us (before %.0f, during %.0f); clients p99 before %.0f us, during %.0f us"
      % (g["all"]["p50_us"], g["all"]["p99_us"], g["max_us"], before["p99_us"], during["p99_us"], cb["p99_us"],
         cd["p99_us"]))
for e in errors:
    print("storm: " + e)
sys.exit(1 if errors else 0)
PY
ok=$?
((ok == 0)) || tail -n 20 "$work/vlaked.log"
exit "$ok"
