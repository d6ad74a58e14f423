#!/usr/bin/env bash
# Builds vlake on a GPU machine and runs everything that needs the real GPU — the `gpu`-labelled
# tests and the benchmarks (bench/run.sh) — in one go, then prints a summary table and the
# benchmark table.
#
#   ./scripts/gpu-check.sh [--all] [--no-bench] [--tests REGEX] [--bench-only SECTIONS] [--reserve-profile]
#     --all          also run the simulator-backed tests
#     --bench-only SECTIONS  only these sections of bench/run.sh (its --only: alloc, launch, decode,
#                    load, train, start, replay, storm); a whole run takes about 14 minutes on an
#                    H200, so a machine that limits each command to 10 minutes runs it in parts
#     --reserve-profile  also measure how workloads reuse the hook's local reserve
#                    (bench/hook/reserve_profile.py; docs/hook.md, "Choosing the reserve's defaults")
#     --tests REGEX  only the tests whose names match (ctest -R), e.g. to split the GPU tests over
#                    several calls of a machine that limits each command's time; `'compat|bypass'`
#                    runs the compatibility matrix (gpu.compat.*, gpu.bypass.*; docs/compat.md);
#                    2-GPU rows skip on a 1-GPU machine: `--tests compat.torch.nccl` on 2 GPUs
#
# Needs g++, CMake >= 3.25, ninja, the CUDA headers and an NVIDIA driver. Third-party packages
# the machine lacks are taken from .deps/debs/*.deb (see scripts/gpu-deps.sh), unpacked into
# .deps/root without installing anything. Warnings are not fatal here (the machine's compiler
# may be newer than CI's, which enforces -Werror). Build and ctest output:
# build/gpu/gpu-check.log; every test's full output: build/gpu/gpu-tests-full.log; per-test
# results: build/gpu/results.xml (JUnit); benchmark results: build/gpu/bench-results.json
# (raw outputs and table, docs/benchmarks.md). --no-bench skips the benchmarks.
set -uo pipefail
cd "$(dirname "$0")/.."

run_all=0
run_bench=1
run_profile=0
only=()
bench_only=()
while (($#)); do
  case "$1" in
    --all) run_all=1 ;;
    --no-bench) run_bench=0 ;;
    --reserve-profile) run_profile=1 ;;
    --tests) only=(-R "$2"); shift ;;
    --bench-only) bench_only=(--only "$2"); shift ;;
  esac
  shift
done
build=build/gpu
mkdir -p "$build"
log="$build/gpu-check.log"
: >"$log"

prefix=()
if compgen -G ".deps/debs/*.deb" >/dev/null; then
  mkdir -p .deps/root
  for deb in .deps/debs/*.deb; do dpkg -x "$deb" .deps/root; done
  prefix=(-DCMAKE_PREFIX_PATH="$PWD/.deps/root/usr")
  export LD_LIBRARY_PATH="$PWD/.deps/root/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

echo "== GPU"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee -a "$log"

echo "== build"
if ! { cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DVLAKE_WERROR=OFF -DVLAKE_BUILD_SCHEDULER=OFF \
         -DPython3_EXECUTABLE="$(command -v python3)" "${prefix[@]}" && cmake --build "$build" -j "$(nproc)"; } >>"$log" 2>&1; then
  tail -n 40 "$log"
  echo "gpu-check: build failed (full log: $log)"
  exit 1
fi

echo "== tests"
label=(-L gpu)
((run_all)) && label=()
( cd "$build" && ctest --output-on-failure --output-junit results.xml "${label[@]}" "${only[@]}" -j 4 ) 2>&1 |
  tee -a "$log"
rc=${PIPESTATUS[0]}
# Every test's full output (passing ones too), for the record.
cp "$build/Testing/Temporary/LastTest.log" "$build/gpu-tests-full.log" 2>/dev/null

echo
echo "== summary"
python3 - "$build/results.xml" "$build/compat-results.jsonl" <<'PY'
import json, os, sys, xml.etree.ElementTree as ET
cases = ET.parse(sys.argv[1]).getroot().iter("testcase")
# Key figures of the compatibility rows (latest line per row; the NCCL row's bus bandwidth).
notes = {}
if os.path.exists(sys.argv[2]):
    for line in open(sys.argv[2]):
        if line.strip():
            r = json.loads(line)
            n = r.get("numbers") or {}
            name = ("gpu." if r["row"].startswith("bypass.") else "gpu.compat.") + r["row"]
            if n.get("busbw_GBps_hook") is not None:
                notes[name] = "busbw %.1f GB/s hooked, %.1f native" % (n["busbw_GBps_hook"], n["busbw_GBps_native"])
            elif r.get("version"):
                notes[name] = r["version"]
rows = []
for c in cases:
    status = c.get("status", "run")
    if c.find("failure") is not None: result = "FAILED"
    elif c.find("skipped") is not None or status in ("notrun", "disabled"): result = "skipped"
    else: result = "passed"
    rows.append((c.get("name"), result, float(c.get("time", "0"))))
w = max([len(r[0]) for r in rows] + [4])
print(f"{'test':<{w}}  {'result':<8} {'seconds':>8}  notes")
for name, result, t in rows:
    print(f"{name:<{w}}  {result:<8} {t:>8.2f}  {notes.get(name, '') if result != 'skipped' else ''}")
counts = {k: sum(1 for r in rows if r[1] == k) for k in ("passed", "FAILED", "skipped")}
print(f"{counts['passed']} passed, {counts['FAILED']} failed, {counts['skipped']} skipped")
PY
# The compatibility matrix (docs/compat.md): the latest result of every row and mode that ran,
# with the NCCL row's bus bandwidth.
if [[ -s "$build/compat-results.jsonl" ]]; then
  echo
  echo "== compatibility matrix ($build/compat-results.jsonl)"
  python3 scripts/compat-table.py "$build/compat-results.jsonl"
fi

if ((run_profile)); then
  echo
  echo "== local reserve reuse (bench/hook/reserve_profile.py; results in $build/reserve-profile.json)"
  python3 bench/hook/reserve_profile.py --vlaked "$build/pool/vlaked" --hook "$build/hook/libvlake-hook.so" \
    --json "$build/reserve-profile.json" 2>"$build/reserve-profile.log" || {
    echo "gpu-check: reserve_profile.py failed (log: $build/reserve-profile.log)"
    tail -n 30 "$build/reserve-profile.log"
  }
fi

if ((run_bench)); then
  echo
  echo "== benchmarks (bench/run.sh; table also in $build/bench-table.txt)"
  bench/run.sh --build "$build" "${bench_only[@]}" --results "$build/bench-results.json" >"$build/bench-table.txt" \
    2>"$build/bench.log"
  brc=$?
  cat "$build/bench-table.txt"
  ((brc == 0)) || { echo "gpu-check: bench/run.sh exited $brc (log: $build/bench.log)"; tail -n 20 "$build/bench.log"; }
fi
exit "$rc"
