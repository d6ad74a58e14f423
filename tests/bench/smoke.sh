#!/usr/bin/env bash
# bench.smoke: bench/run.sh --sim --quick against the simulator must print a well-formed table
# and write a results JSON with every expected row, including the 1, 4 and 8 tenant alloc runs
# and the interleaved pairs of the launch and start rows (timings are not judged: simulator).
#   smoke.sh <path to bench/run.sh> <build dir>
set -uo pipefail
run="$1"; build="$2"
out="$(mktemp -d /tmp/vlake-bench-smoke-XXXXXX)"
trap 'rm -rf "$out"' EXIT
"$run" --sim --quick --build "$build" --results "$out/results.json" >"$out/table.txt" 2>"$out/err.txt"
rc=$?
cat "$out/table.txt"
if ((rc != 0)); then echo "smoke: run.sh exited $rc"; cat "$out/err.txt"; exit 1; fi
python3 - "$out/table.txt" "$out/results.json" <<'PY'
import json, re, sys
table = open(sys.argv[1]).read().splitlines()
res = json.load(open(sys.argv[2]))
errors = []
if not table or not table[0].startswith("== vlake bench (sim, quick)"):
    errors.append("no header line")
hdr = [l for l in table if l.startswith("metric ")]
if len(hdr) != 1 or hdr[0].split()[-1] != "result":
    errors.append("no column header")
rows = res.get("rows", [])
lines = [l for l in table if l and not l.startswith(("==", "metric ")) and " PASS, " not in l]
if len(lines) != len(rows):
    errors.append("table has %d rows, JSON %d" % (len(lines), len(rows)))
for l, r in zip(lines, rows):
    tail = r["result"] + ("  (%s)" % r["note"] if r.get("note") else "")
    if not l.startswith(r["metric"]) or not l.rstrip().endswith(tail):
        errors.append("row mismatch: %r vs %r" % (l, r["metric"]))
    if r["result"] not in ("PASS", "FAIL", "info", "n/a"):
        errors.append("bad result %r" % r["result"])
    if r["result"] == "n/a":
        errors.append("missing measurement: %s" % r["metric"])
metrics = [r["metric"] for r in rows]
for s in ("2MiB", "20MiB", "256MiB", "1GiB"):
    for m in ("warm alloc+free p50 " + s, "warm alloc+free p99 " + s, "cold alloc p50 " + s,
              "warm driver VMM calls per pair " + s):
        if m not in metrics:
            errors.append("missing row: " + m)
    for k in (4, 8) if s != "1GiB" else ():  # run.sh --sim: no 1 GiB with several tenants
        want = ["%d-tenant warm alloc p99 %s (baseline: 1 tenant)" % (k, s),
                "%d tenants cold at once: alloc p99 %s (baseline: 1 tenant cold)" % (k, s)]
        want += ["%d tenants: %s alloc %s %s" % (k, kind, q, s) for kind in ("warm", "cold") for q in ("p50", "p99")]
        for m in want:
            if m not in metrics:
                errors.append("missing row: " + m)
for t in ("train_ckpt", "lora", "infer_kv"):
    if "replay %s alloc p50" % t not in metrics:
        errors.append("missing replay row for " + t)
    rep = res["raw"].get("replay_hook_" + t) or {}
    if not rep.get("allocs") or rep.get("failed_allocs", 1) != 0:
        errors.append("replay %s under the hook: %r" % (t, {k: rep.get(k) for k in ("allocs", "failed_allocs")}))
if not any(m.startswith("replay 3 tenants: pool peak") for m in metrics):
    errors.append("missing pool peak row")
for k in (4, 8):
    for kind in ("native", "warm", "cold"):
        multi = res["raw"].get("alloc_%s_x%d" % (kind, k)) or {}
        if len(multi.get("processes", [])) != k or multi.get("tenants") != k:
            errors.append("%s run with %d tenants: %d processes" % (kind, k, len(multi.get("processes", []))))
want_pairs = {"launches/s, tight loop of empty kernels": "launch_loop",
              "launches/s, CUDA graph replay (100 kernel nodes)": "launch_graph",
              "start: 4 processes CUDA-ready with 64 MiB each (time until all)": "start_4",
              "start: 16 processes CUDA-ready with 64 MiB each (time until all)": "start_16"}
for m, name in want_pairs.items():
    if m not in metrics:
        errors.append("missing row: " + m)
    d = res["raw"].get("pairs_" + name) or {}
    if d.get("n_pairs") != 3 or d.get("errors") or len(d.get("ci95") or []) != 2:
        errors.append("pairs of %s: %r" % (name, {k: d.get(k) for k in ("n_pairs", "errors", "ci95")}))
if any(m.startswith(("decode", "model load", "train")) for m in metrics):
    errors.append("PyTorch rows in a simulator run")
for e in errors:
    print("smoke: " + e)
print("smoke: %d rows, %s" % (len(rows), "OK" if not errors else "%d problems" % len(errors)))
sys.exit(1 if errors else 0)
PY
ok=$?
((ok == 0)) || { echo "smoke: run.sh stderr:"; cat "$out/err.txt"; }
exit "$ok"
