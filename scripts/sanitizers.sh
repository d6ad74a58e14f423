#!/usr/bin/env bash
# Builds one sanitizer preset and runs the tests that mean something under it; exits non-zero on
# any failure or sanitizer report. Prints the time of each step.
#
#   ./scripts/sanitizers.sh asan     # AddressSanitizer + LeakSanitizer: every test but charts.*
#   ./scripts/sanitizers.sh ubsan    # UndefinedBehaviorSanitizer: the same selection
#   ./scripts/sanitizers.sh asan-ubsan   # both in one build (what CI runs): the union of the two
#                                        # exclusions below
#   ./scripts/sanitizers.sh tsan     # ThreadSanitizer: the tests labelled `tsan` only
#   VLAKE_BUILD_DIR=build/my-asan ./scripts/sanitizers.sh asan   # another tree than build/<preset>
#   ./scripts/sanitizers.sh asan -R hook   # extra arguments go to ctest
#   ./scripts/sanitizers.sh asan-ubsan --build-only   # configure and build only (.ci/run builds the
#   ./scripts/sanitizers.sh asan-ubsan --test-only    # trees in the background, then tests them)
#
# How the trees differ from the presets (CMakePresets.json), to fit CI's budget (2 cores):
#   -g1           instead of the presets' -g: line tables are all a sanitizer report needs.
#                 -O0 as in the presets: the build, not the tests, is what takes time, and -O1
#                 costs 60% more compile time (tests/driver/main.cpp under ASan: 24 s against
#                 15 s of CPU) for tests that mostly wait on processes and sockets. (At -O1 GCC 12
#                 also reports libstdc++'s std::regex with -Wmaybe-uninitialized under ASan.)
#   -Wno-tsan     tsan only: GCC warns that TSan does not model atomic_thread_fence, which only
#                 the state segment's seqlock uses (contracts/src/state.cpp); its readers map the
#                 segment at an address of their own, so TSan never pairs their reads with the
#                 daemon's writes anyway.
#   tsan          builds only the targets of vlake_tsan_tests (tests/CMakeLists.txt): the test
#                 folders that opt in with vlake_test_labels(<target> ... tsan).
# Not run under any sanitizer: `soak` (the endurance runs of pool.limits: time bounds a
# sanitizer's slowdown voids; the paths they drive, the pool.limits tests cover), bench.smoke and
# bench.storm (timings; the bench.unit, bench.report and bench.hotpath tests do run), `gpu` (skipped without a GPU anyway), `charts` (helm and node.js
# checks of the chart; the vlake code they call, vlakectl quota check and --help, the ctl and
# pool tests cover), `packaging` (cpack, dpkg and systemd-analyze over the installed files; the
# programs they run, the same tests cover), and prometheus.rules and prometheus.chart (promtool
# over YAML; prometheus.dashboard_queries, which runs vlaked and hooked tenants, does run;
# prometheus.operator_scrape runs the same daemon and tenants under another scrape config),
# `demo` and `docs` (scripts/demo.sh and the docs' runnable blocks: the programs they run, the
# e2e, ctl and quota tests run; a docs example loads the simulator into python3). Under asan only,
# sim.hostile and sim.contexts.limit are left out too (e2e.contexts runs the latter's checks in
# C++): their Python drivers load the simulated NVML in-process (ctypes),
# and an instrumented library cannot be loaded into an uninstrumented interpreter; the daemon
# paths it drives are run under ASan by the pool.* tests (holder scan, limits, memory outside
# vlake, handle binding). So are tools.python_vlake and tools.python_reclaim, whose tenants are
# Python interpreters with the instrumented hook preloaded; the hook paths they use (alloc,
# share, free, reclaim callbacks) run under ASan in the hook.* and dedup.* tests, and the daemon's
# pressure decisions in the pool.* tests. Under ubsan only, "pool.limits: out of descriptors…" is left out: it
# runs vlaked with 96 descriptors, and UBSan's runtime needs descriptors of its own (it probes
# memory with a pipe before each vptr check, and reports an invalid object when it gets none).
set -euo pipefail
cd "$(dirname "$0")/.."

san="${1:-}"
case "$san" in
  asan | ubsan | asan-ubsan | tsan) shift ;;
  *)
    echo "usage: scripts/sanitizers.sh asan|ubsan|asan-ubsan|tsan [--build-only|--test-only] [ctest arguments...]" >&2
    exit 2
    ;;
esac
do_build=1
do_test=1
case "${1:-}" in
  --build-only) do_test=0; shift ;;
  --test-only) do_build=0; shift ;;
esac
dir="${VLAKE_BUILD_DIR:-build/$san}"
cuda_root="${VLAKE_CUDA_ROOT:-/usr/local/cuda}"
jobs="$(nproc)"

step_start=$SECONDS
step() {  # step <name>: prints the time the previous step took, then the name of the next
  local now=$SECONDS
  [[ -n "${step_name:-}" ]] && printf 'sanitizers.sh %s: %s took %dm%02ds\n' \
    "$san" "$step_name" $(((now - step_start) / 60)) $(((now - step_start) % 60))
  step_name="$1"
  step_start=$now
  [[ -n "$step_name" ]] && echo "sanitizers.sh $san: $step_name"
  return 0
}
total_start=$SECONDS

# Sanitizer reports fail the test that produced them; stack traces name file and line.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:strict_string_checks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
export TSAN_OPTIONS="${TSAN_OPTIONS:-second_deadlock_stack=1:halt_on_error=0}"

# Tests run with address-space randomization off where the sanitizer runtimes need it.
# shellcheck source=scripts/no_aslr.sh
. scripts/no_aslr.sh
no_aslr_runner sanitizers.sh tests

build_args=(--build "$dir" -j "$jobs")
[[ "$san" == tsan ]] && build_args+=(--target vlake_tsan_tests)
if ((do_build)); then
  step configure
  flags="-O0 -g1"
  [[ "$san" == tsan ]] && flags+=" -Wno-tsan"
  cmake --preset "$san" -B "$dir" -DVLAKE_CUDA_ROOT="$cuda_root" \
    -DCMAKE_C_FLAGS_DEBUG="$flags" -DCMAKE_CXX_FLAGS_DEBUG="$flags" >/dev/null
  step build
  "${runner[@]}" cmake "${build_args[@]}"
elif [[ ! -f "$dir/CTestTestfile.cmake" ]]; then
  echo "sanitizers.sh $san: $dir is not built; run it without --test-only (or with --build-only) first" >&2
  exit 1
fi
if ((!do_test)); then
  step ""
  printf 'sanitizers.sh %s: built in %dm%02ds\n' "$san" $(((SECONDS - total_start) / 60)) $(((SECONDS - total_start) % 60))
  exit 0
fi

ctest_args=(--test-dir "$dir" --output-on-failure -j "$jobs")
if [[ "$san" == tsan ]]; then
  ctest_args+=(-L '^tsan$')
else
  exclude='^(prometheus\.(rules|chart|operator_scrape)|bench\.(smoke|storm))$'
  [[ "$san" == asan ]] &&
    exclude='^(prometheus\.(rules|chart|operator_scrape)|bench\.(smoke|storm)|sim\.(hostile|contexts\.limit)|tools\.python_(vlake|reclaim))$'
  [[ "$san" == ubsan ]] &&
    exclude='^(prometheus\.(rules|chart|operator_scrape)|bench\.(smoke|storm)|pool\.limits: out of descriptors.*)$'
  [[ "$san" == asan-ubsan ]] &&
    exclude='^(prometheus\.(rules|chart|operator_scrape)|bench\.(smoke|storm)|sim\.(hostile|contexts\.limit)|tools\.python_(vlake|reclaim)|pool\.limits: out of descriptors.*)$'
  ctest_args+=(-LE '^(gpu|charts|packaging|demo|docs|soak)$' -E "$exclude")
fi

step test
rc=0
"${runner[@]}" ctest "${ctest_args[@]}" "$@" || rc=$?

step ""
printf 'sanitizers.sh %s: total %dm%02ds%s\n' "$san" $(((SECONDS - total_start) / 60)) \
  $(((SECONDS - total_start) % 60)) "$( ((rc == 0)) || echo ", tests FAILED")"
exit "$rc"
