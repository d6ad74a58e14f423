#!/usr/bin/env bash
# demo.sim: scripts/demo.sh --sim on build tree BUILD passes, and what it made is gone afterwards:
# its work directory, its state segment and its simulated node in /dev/shm, vlaked and the tenants.
# A demo that cannot find its programs fails too (exit 1, with the reason).
#
#   demo_test.sh DEMO_SH BUILD
set -uo pipefail
demo="$1"
build="$2"
out="$(mktemp)"
trap 'rm -f "$out"' EXIT

status=0
timeout 150 "$demo" --sim --build-dir "$build" >"$out" 2>&1 || status=$?
cat "$out"
echo "---- demo_test.sh: demo.sh exited $status"
failures=0
check() {  # check <what> <command...>: prints and counts a failed expectation
  local what="$1"
  shift
  if ! "$@"; then
    echo "demo_test.sh: FAILED: $what"
    failures=$((failures + 1))
  fi
}
check "demo.sh exits 0" test "$status" -eq 0
check "demo.sh says it passed" grep -q "^demo passed" "$out"

# left_behind <output> <processes expected>: what a run printed that it made is gone — its files
# ("files:    WORK, WORK/state, /dev/shm/vlake-sim-NODE") and its processes ("vlaked pid N
# is up", "<tenant>: pid N (").
left_behind() {
  local files pids f pid
  files="$(sed -n 's/^files: *//p' "$1")"
  IFS=', ' read -r -a made <<<"$files"
  check "the demo names three files (work directory, state segment, simulated node)" test "${#made[@]}" -eq 3
  for f in "${made[@]}"; do check "$f is removed" test ! -e "$f"; done
  pids="$(sed -n -e 's/^vlaked pid \([0-9]*\) is up.*/\1/p' -e 's/^[^ ]*: pid \([0-9]*\) (.*/\1/p' "$1")"
  check "the demo names vlaked and the tenants ($2 processes)" test "$(wc -w <<<"$pids")" -eq "$2"
  for pid in $pids; do check "process $pid has exited" test ! -e "/proc/$pid"; done
}
left_behind "$out" 4

# A missing build: a clear failure, not a hang or a pass.
bad_status=0
bad_out="$("$demo" --sim --build-dir "$build/no-such-dir" 2>&1)" || bad_status=$?
check "demo.sh without a build exits 1 (got $bad_status)" test "$bad_status" -eq 1
check "demo.sh without a build says what is missing" grep -q "is missing: build the tree first" <<<"$bad_out"

# Tenants that exit at once (a tree whose tenant program does nothing): the demo fails at its
# first check, and still removes everything.
fake="$(mktemp -d)"
trap 'rm -f "$out"; rm -rf "$fake"' EXIT
for f in pool/vlaked ctl/vlakectl hook/libvlake-hook.so sim/libcuda.so.1 sim/libnvidia-ml.so.1; do
  mkdir -p "$fake/$(dirname "$f")"
  ln -s "$(cd "$build" && pwd)/$f" "$fake/$f"
done
mkdir -p "$fake/tests/hook"
printf '#!/bin/sh\nexit 0\n' >"$fake/tests/hook/vlake_hook_tenant"
chmod 0755 "$fake/tests/hook/vlake_hook_tenant"
bad_status=0
timeout 150 "$demo" --sim --build-dir "$fake" >"$out" 2>&1 || bad_status=$?
echo "---- demo_test.sh: with tenants that do nothing, demo.sh exited $bad_status:"
tail -n 5 "$out"
check "demo.sh with failing tenants exits 1 (got $bad_status)" test "$bad_status" -eq 1
check "demo.sh says which step failed" grep -q "FAILED: tenant .* exited before the end of phase 1" "$out"
left_behind "$out" 4

((failures == 0)) && echo "demo_test.sh: ok"
exit $((failures == 0 ? 0 : 1))
