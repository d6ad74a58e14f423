#!/usr/bin/env python3
"""bench.report.*: bench/report.py on hand-made raw outputs (no GPU, no daemon).

  test_report.py <path to bench/report.py> <case>

Cases: train_pairs (the training row's ratio is the median of the per-pair ratios, with the
spread, interval, note and pair count), train_missing (a row that lost pairs says how many
counted; a row without its file is n/a), paired_targets (throughput rows pass at >= their
target, time rows at <=; the start rows' target only from 128 processes; --only leaves other
sections out),
multi_tenant (K-tenant rows against native K and the 1-tenant cold p99, per K's own sizes; a
K asked for but not run gives n/a rows and --strict exits 1), replay (the replay rows are
information: no target, also against the native traces run at once). Exit 0 when the case holds.
"""
import json
import os
import subprocess
import sys
import tempfile


def alloc_json(sizes, tenants=1):
    """sizes: {name: (alloc p50, alloc p99)}; the pair and free figures are derived."""
    out = []
    for name, (p50, p99) in sizes.items():
        s = lambda a, b: {"n": 20, "p50_us": a, "p99_us": b, "mean_us": a, "min_us": a, "max_us": b}
        out.append({"size": name, "bytes": 1, "alloc": s(p50, p99), "free": s(p50, p99),
                    "pair": s(2 * p50, 2 * p99), "vmm_calls_per_pair": None})
    return {"bench": "alloc", "tenants": tenants, "sizes": out, "processes": [{"pid": i} for i in range(tenants)]}


def run_report(report, raw, tenants="1,4,8", pairs=5, strict=0, only=""):
    res = os.path.join(raw, "..", "results.json")
    p = subprocess.run([sys.executable, report, "--raw", raw, "--mode", "gpu", "--tenants", tenants,
                        "--train-pairs", str(pairs), "--pairs", str(pairs), "--only", only,
                        "--results", res, "--strict", str(strict)],
                       capture_output=True, text=True)
    with open(res) as f:
        return p.returncode, p.stdout, {r["metric"]: r for r in json.load(f)["rows"]}


def write(raw, name, obj):
    with open(os.path.join(raw, name + ".json"), "w") as f:
        f.write(json.dumps(obj) + "\n")


def close(a, b):
    return a is not None and abs(a - b) < 1e-9


def write_pairs(raw, row, unit, better, a, b, asked=None, errors=(), ci=(0.9, 1.1), extra=None):
    """A pairs_<row>.json as bench/pairs/pairs.py writes it, from the A and B values."""
    import statistics
    prs = [{"a": x, "b": y, "ratio": y / x, "order": "ab" if i % 2 == 0 else "ba"} for i, (x, y) in enumerate(zip(a, b))]
    d = {"bench": "pairs", "row": row, "unit": unit, "better": better, "pairs": prs, "n_pairs": len(prs),
         "asked_pairs": asked or len(prs), "errors": list(errors), "ci95": list(ci) if prs else None,
         "a_median": statistics.median(a) if prs else None, "b_median": statistics.median(b) if prs else None}
    d.update(extra or {})
    write(raw, "pairs_" + row, d)


def case_train_pairs(report, raw, errors):
    # default: pair ratios 1.10, 0.90, 1.00, 1.02, 0.95 -> median 1.00 (PASS), spread 0.90..1.10.
    # expandable: the ratio of the medians (24 / 30 = 0.8) differs from the median pair ratio.
    write_pairs(raw, "train_default", "ms", "lower", [40.0, 50.0, 30.0, 50.0, 40.0], [44.0, 45.0, 30.0, 51.0, 38.0])
    write_pairs(raw, "train_expandable", "ms", "lower", [10.0, 20.0, 30.0, 40.0, 50.0],
                [10.5, 21.0, 24.0, 42.0, 52.5], ci=(0.8, 1.05))  # ratios 1.05 1.05 0.8 1.05 1.05
    rc, out, rows = run_report(report, raw)
    d = rows.get("train step median (default allocator)")
    e = rows.get("train step median (expandable allocator)")
    if not d or not e:
        errors.append("training rows missing: %s" % sorted(rows))
        return
    if not close(d["ratio"], 1.0) or d["result"] != "PASS" or d["pairs"] != 5:
        errors.append("default row: %r" % d)
    if not close(d["spread"]["min"], 0.9) or not close(d["spread"]["max"], 1.1):
        errors.append("default spread: %r" % d["spread"])
    if not close(d["baseline"], 40.0) or not close(d["hook"], 44.0):
        errors.append("default baseline/hook (medians of the A and B runs): %r %r" % (d["baseline"], d["hook"]))
    if not close(e["ratio"], 1.05) or e["result"] != "FAIL":
        errors.append("expandable row: ratio %r result %r (want the median pair ratio 1.05, FAIL)" %
                      (e["ratio"], e["result"]))
    want_note = "median of 5/5 pair ratios, 95% CI 0.800x-1.050x, spread 0.800x-1.050x"
    if e.get("note") != want_note or e.get("ci95") != [0.8, 1.05]:
        errors.append("expandable note: %r, ci95 %r" % (e.get("note"), e.get("ci95")))
    line = [l for l in out.splitlines() if l.startswith("train step median (expandable")]
    if len(line) != 1 or not line[0].endswith("FAIL  (%s)" % want_note) or "<=1.01x" not in line[0]:
        errors.append("table line: %r" % line)
    if rc != 0:
        errors.append("exit %d without --strict" % rc)


def case_train_missing(report, raw, errors):
    # 4 of 5 pairs, then a worker failed: the row says 4/5 and keeps its ratio.
    write_pairs(raw, "train_default", "ms", "lower", [10.0, 10.0, 10.0, 10.0], [10.1, 10.2, 10.4, 10.5], asked=5,
                errors=["worker exited (status 1); see its log"])
    rc, out, rows = run_report(report, raw)
    d = rows.get("train step median (default allocator)") or {}
    if d.get("pair_ratios") is None or len(d["pair_ratios"]) != 4 or d.get("pairs") != 5:
        errors.append("pairs: %r" % d)
    elif not d.get("note", "").startswith("median of 4/5 pair ratios") or not close(d["ratio"], 1.03):
        errors.append("note/ratio: %r %r" % (d.get("note"), d.get("ratio")))
    e = rows.get("train step median (expandable allocator)") or {}
    if e.get("result") != "n/a" or e.get("pair_ratios") != []:
        errors.append("expandable without runs should be n/a: %r" % e)
    # A row whose worker never started: n/a, the error in its note.
    write_pairs(raw, "train_expandable", "ms", "lower", [], [], asked=5, errors=["worker start: no answer"])
    rc, out, rows = run_report(report, raw)
    e = rows.get("train step median (expandable allocator)") or {}
    if e.get("result") != "n/a" or e.get("note") != "worker start: no answer":
        errors.append("expandable whose worker did not start: %r" % e)


def case_paired_targets(report, raw, errors):
    write_pairs(raw, "decode_b1", "tokens/s", "higher", [100.0] * 3, [97.0, 96.0, 99.0])  # 0.97: FAIL
    write_pairs(raw, "decode_b32", "tokens/s", "higher", [100.0] * 3, [98.0, 99.0, 101.0])  # 0.99: PASS
    write_pairs(raw, "launch_loop", "launches/s", "higher", [1e5] * 3, [0.98e5, 0.99e5, 1e5])  # 0.99
    write_pairs(raw, "load_model", "s", "lower", [1.0] * 3, [1.04, 1.03, 1.06], extra={"a_extra": {"file_bytes": 4 << 30}})
    write_pairs(raw, "start_32", "s", "lower", [1.0] * 3, [2.0] * 3)  # info
    write_pairs(raw, "start_128", "s", "lower", [2.0] * 3, [2.6] * 3)  # 1.3: FAIL
    rc, out, rows = run_report(report, raw, pairs=3, only="launch,decode,load,start")
    want = {
        "decode tokens/s, GPT-2 small, batch 1": (0.97, 0.98, "FAIL"),
        "decode tokens/s, GPT-2 small, batch 32": (0.99, 0.98, "PASS"),
        "launches/s, tight loop of empty kernels": (0.99, 0.98, "PASS"),
        "launches/s, CUDA graph replay (100 kernel nodes)": (None, 0.98, "n/a"),
        "model load, 4 GiB safetensors to the GPU": (1.04, 1.05, "PASS"),
        "start: 32 processes CUDA-ready with 64 MiB each (time until all)": (2.0, None, "info"),
        "start: 128 processes CUDA-ready with 64 MiB each (time until all)": (1.3, 1.2, "FAIL"),
    }
    for m, (ratio, target, result) in want.items():
        r = rows.get(m)
        if r is None:
            errors.append("no row %r" % m)
        elif not ((ratio is None and r["ratio"] is None) or close(r["ratio"], ratio)) or r["target"] != target \
                or r["result"] != result:
            errors.append("%s: %r" % (m, r))
    line = [l for l in out.splitlines() if l.startswith("decode tokens/s, GPT-2 small, batch 1")]
    if len(line) != 1 or ">=0.98x" not in line[0]:
        errors.append("throughput target not shown as >=: %r" % line)
    if any(m.startswith(("train", "storm", "warm", "cold", "replay")) for m in rows):
        errors.append("--only left other sections' rows in: %s" % sorted(rows))


def case_multi_tenant(report, raw, errors):
    four = {"2MiB": (10.0, 20.0), "1GiB": (100.0, 200.0)}
    write(raw, "alloc_native", alloc_json(four))
    write(raw, "alloc_warm", alloc_json({"2MiB": (1.0, 2.0), "1GiB": (1.0, 4.0)}))
    write(raw, "alloc_cold", alloc_json({"2MiB": (15.0, 30.0), "1GiB": (120.0, 300.0)}))
    two = {"2MiB": (40.0, 80.0)}  # the 4-tenant runs have one size only (as on the simulator)
    write(raw, "alloc_native_x4", alloc_json(two, 4))
    write(raw, "alloc_warm_x4", alloc_json({"2MiB": (1.0, 3.0)}, 4))
    write(raw, "alloc_cold_x4", alloc_json({"2MiB": (50.0, 90.0)}, 4))
    rc, out, rows = run_report(report, raw, tenants="1,4,8", strict=1)
    want = {
        "cold alloc p99 2MiB": (20.0, 30.0, 1.5, None, "info"),
        "cold alloc p99 1GiB": (200.0, 300.0, 1.5, None, "info"),
        "4 tenants: cold alloc p50 2MiB": (40.0, 50.0, 1.25, None, "info"),
        "4 tenants: cold alloc p99 2MiB": (80.0, 90.0, 1.125, None, "info"),
        "4 tenants: warm alloc p99 2MiB": (80.0, 3.0, 3.0 / 80.0, None, "info"),
        "4-tenant warm alloc p99 2MiB (baseline: 1 tenant)": (2.0, 3.0, 1.5, 2.0, "PASS"),
        "4 tenants cold at once: alloc p99 2MiB (baseline: 1 tenant cold)": (30.0, 90.0, 3.0, 2.0, "FAIL"),
    }
    for m, (b, h, ratio, target, result) in want.items():
        r = rows.get(m)
        if not r:
            errors.append("missing row " + m)
        elif not (close(r["baseline"], b) and close(r["hook"], h) and close(r["ratio"], ratio)
                  and r["target"] == target and r["result"] == result):
            errors.append("row %s: %r" % (m, r))
    if any(m.startswith("4 tenants") and "1GiB" in m for m in rows):
        errors.append("4-tenant rows for a size the 4-tenant runs did not have")
    # 8 was asked for but not run: its rows are there, n/a for the targeted ones, for every size.
    r8 = rows.get("8 tenants cold at once: alloc p99 1GiB (baseline: 1 tenant cold)")
    if not r8 or r8["result"] != "n/a" or not close(r8["baseline"], 300.0):
        errors.append("8-tenant acceptance row without a run: %r" % r8)
    if rc != 1:
        errors.append("--strict 1 with FAIL and n/a rows exited %d" % rc)
    if list(rows).index("cold alloc p50 2MiB") > list(rows).index("4 tenants: warm alloc p50 2MiB"):
        errors.append("row order: one tenant's rows come first")


def replay_json(p99):
    s = {"n": 100, "p50_us": p99 / 4, "p90_us": p99 / 2, "p99_us": p99, "max_us": p99 * 2}
    return {"bench": "replay", "alloc": s, "free": s, "peak_granted_bytes": 4 << 20}


def case_replay(report, raw, errors):
    # lora: 300 us hooked, 100 alone (3x), 200 at once (1.5x); kv: 90 alone, 100 at once, 250
    # hooked (2.5x). Information only: no row has a target, so --strict passes.
    for t, alone, together, hooked in (("lora", 100.0, 200.0, 300.0), ("kv", 90.0, 100.0, 250.0)):
        write(raw, "replay_native_" + t, replay_json(alone))
        write(raw, "replay_native_all_" + t, replay_json(together))
        write(raw, "replay_hook_" + t, replay_json(hooked))
        write(raw, "replay_hook_nores_" + t, replay_json(hooked * 2))
    rc, out, rows = run_report(report, raw, strict=1, only="replay")
    want = {
        "replay lora alloc p99": (100.0, 300.0, None, "info"),
        "replay lora alloc p99 (baseline: native, 2 traces at once)": (200.0, 300.0, None, "info"),
        "replay kv alloc p99 (baseline: native, 2 traces at once)": (100.0, 250.0, None, "info"),
        "replay kv alloc p99, reserve off": (90.0, 500.0, None, "info"),
    }
    for m, (base, hook, target, result) in want.items():
        r = rows.get(m)
        if r is None:
            errors.append("no row %r" % m)
            continue
        got = (r.get("baseline"), r.get("hook"), r.get("target"), r.get("result"))
        if not (close(got[0], base) and close(got[1], hook) and got[2] == target and got[3] == result):
            errors.append("%s: %r, want %r" % (m, got, (base, hook, target, result)))
    if any(m.startswith("replay native_all") or "all_kv" in m for m in rows):
        errors.append("the native at-once runs were read as traces of their own")
    if rc != 0:
        errors.append("--strict 1 with only information rows exited %d" % rc)


def main():
    report, case = sys.argv[1], sys.argv[2]
    cases = {"train_pairs": case_train_pairs, "train_missing": case_train_missing,
             "paired_targets": case_paired_targets,
             "multi_tenant": case_multi_tenant, "replay": case_replay}
    if case not in cases:
        print("unknown case " + case)
        return 2
    errors = []
    with tempfile.TemporaryDirectory(prefix="vlake-bench-report-") as tmp:
        raw = os.path.join(tmp, "raw")
        os.mkdir(raw)
        cases[case](report, raw, errors)
    for e in errors:
        print("report.%s: %s" % (case, e))
    print("report.%s: %s" % (case, "OK" if not errors else "%d problems" % len(errors)))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
