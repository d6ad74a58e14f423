#!/usr/bin/env python3
"""Builds bench/run.sh's table and results JSON from the raw benchmark outputs (<raw>/*.json).

Rows: metric, native/baseline, hook, ratio (hook / baseline), target (from the issue), result
(PASS / FAIL for rows with a target, info otherwise; n/a when an input is missing), and an
optional note printed after the result in parentheses. The rows measured in interleaved pairs
(bench/pairs/pairs.py: launches, decode, model load, start, training; raw pairs_<row>.json)
have as ratio the median of the per-pair ratios (hook / native of each pair) and carry "pairs",
"pair_ratios", "ci95" (bootstrap 95% interval of that median) and "spread" {"min","max"}; a
throughput row passes when its ratio is at least the target (">="), a time row when it is at
most the target. The replay rows are information (the caching allocator off, docs/benchmarks.md).
Writes --results as
{"mode","quick","date","host","rows":[...],"raw":{name: json}} and prints the table. Exit 0, or 1
with --strict 1 when a targeted row FAILs or is n/a.
"""
import argparse
import datetime
import glob
import json
import os
import socket
import statistics
import sys


def load(raw):
    out = {}
    for p in sorted(glob.glob(os.path.join(raw, "*.json"))):
        name = os.path.basename(p)[:-5]
        try:
            with open(p) as f:
                text = f.read().strip()
            out[name] = json.loads(text) if text else None
        except (OSError, ValueError):
            out[name] = None
    return out


def size_rows(data, name):
    d = data.get(name)
    if not d or "sizes" not in d:
        return {}
    return {s["size"]: s for s in d["sizes"]}


AUTO = object()


def tenant_counts(data, asked):
    """The tenant counts > 1 to report: those asked for (missing ones give n/a rows) and any
    found in the raw outputs (alloc_<kind>_x<K>), ascending."""
    ks = {int(k) for k in str(asked).split(",") if k.strip().isdigit()}
    for name in data:
        if name.startswith("alloc_") and "_x" in name and name.rsplit("_x", 1)[1].isdigit():
            ks.add(int(name.rsplit("_x", 1)[1]))
    return sorted(k for k in ks if k > 1)


def median_ms(d):
    return d.get("median_ms") if isinstance(d, dict) else None


def fmt(v, unit):
    if v is None:
        return "-"
    if unit == "us":
        return "%.1f us" % v
    if unit == "ms":
        return "%.2f ms" % v
    if unit == "bytes":
        return "%.1f MiB" % (v / 2**20)
    if unit == "calls":
        return "%.2f" % v
    if unit == "s":
        return "%.3f s" % v
    if unit in ("launches/s", "tokens/s"):
        return "%.0f/s" % v
    return "%g" % v


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--raw", required=True)
    ap.add_argument("--mode", default="gpu")
    ap.add_argument("--quick", type=int, default=0)
    ap.add_argument("--tenants", default="1,4,8", help="tenant counts run.sh ran (comma-separated)")
    ap.add_argument("--train-pairs", type=int, default=10)
    ap.add_argument("--pairs", type=int, default=10, help="pairs run.sh asked for (rows with fewer say so)")
    ap.add_argument("--only", default="", help="sections run.sh ran (comma-separated; default all)")
    ap.add_argument("--results", required=True)
    ap.add_argument("--strict", type=int, default=0)
    args = ap.parse_args()
    data = load(args.raw)
    rows = []
    ran = set(x for x in args.only.split(",") if x) or None

    def section(name):
        return ran is None or name in ran

    def row(metric, base, hook, unit, target=None, ratio=AUTO, note=None, extra=None, at_least=False):
        # ratio: hook / base unless given (the paired rows give the median of pair ratios).
        if ratio is AUTO:
            ratio = hook / base if (base not in (None, 0) and hook is not None) else None
            if hook is not None and base == 0 and hook == 0:
                ratio = 0.0
        if target is None:
            result = "info"
        elif ratio is None:
            result = "n/a"
        elif at_least:
            result = "PASS" if ratio >= target - 1e-9 else "FAIL"
        else:
            result = "PASS" if ratio <= target + 1e-9 else "FAIL"
        r = {"metric": metric, "baseline": base, "hook": hook, "unit": unit,
             "ratio": ratio, "target": target, "result": result}
        if at_least:
            r["at_least"] = True
        if note:
            r["note"] = note
        r.update(extra or {})
        rows.append(r)

    native, warm = size_rows(data, "alloc_native"), size_rows(data, "alloc_warm")
    cold = size_rows(data, "alloc_cold")
    sizes = list(native) or list(warm) or list(cold)
    if not section("alloc"):
        native, warm, cold, sizes = {}, {}, {}, []
    g = lambda rows_, s, op, q: rows_.get(s, {}).get(op, {}).get(q) if rows_ else None
    for s in sizes:
        row("warm alloc+free p50 %s" % s, g(native, s, "pair", "p50_us"), g(warm, s, "pair", "p50_us"), "us", 0.25)
    for s in sizes:
        row("warm alloc+free p99 %s" % s, g(native, s, "pair", "p99_us"), g(warm, s, "pair", "p99_us"), "us", 1.0)
    for s in sizes:
        row("cold alloc p50 %s" % s, g(native, s, "alloc", "p50_us"), g(cold, s, "alloc", "p50_us"), "us", 1.5)
    for s in sizes:
        row("cold alloc p99 %s" % s, g(native, s, "alloc", "p99_us"), g(cold, s, "alloc", "p99_us"), "us")
    # K tenants at once (K > 1): the alloc latency pooled over the K processes, against native
    # with K processes in the same run (info), and the hook's p99 against one hooked tenant's.
    ks = tenant_counts(data, args.tenants) if section("alloc") else []
    multi = {k: {kind: size_rows(data, "alloc_%s_x%d" % (kind, k)) for kind in ("native", "warm", "cold")}
             for k in ks}
    # The sizes of each K's runs (on the simulator they leave out 1 GiB), else the 1-tenant ones.
    ksizes = {k: list(m["native"]) or list(m["warm"]) or list(m["cold"]) or sizes for k, m in multi.items()}
    for k in ks:
        m = multi[k]
        for kind in ("warm", "cold"):
            for q in ("p50", "p99"):
                for s in ksizes[k]:
                    row("%d tenants: %s alloc %s %s" % (k, kind, q, s), g(m["native"], s, "alloc", q + "_us"),
                        g(m[kind], s, "alloc", q + "_us"), "us")
    for k in ks:
        for s in ksizes[k]:
            row("%d-tenant warm alloc p99 %s (baseline: 1 tenant)" % (k, s),
                g(warm, s, "alloc", "p99_us"), g(multi[k]["warm"], s, "alloc", "p99_us"), "us", 2.0)
    for k in ks:
        for s in ksizes[k]:
            row("%d tenants cold at once: alloc p99 %s (baseline: 1 tenant cold)" % (k, s),
                g(cold, s, "alloc", "p99_us"), g(multi[k]["cold"], s, "alloc", "p99_us"), "us", 2.0)
    # Simulator only: the driver calls per pair (native: 1 alloc + 1 free; warm hook: 0).
    if warm and any(v.get("vmm_calls_per_pair") is not None for v in warm.values()):
        for s in sizes:
            b = native.get(s, {}).get("vmm_calls_per_pair") if native else None
            h = warm.get(s, {}).get("vmm_calls_per_pair")
            r = {"metric": "warm driver VMM calls per pair %s" % s, "baseline": b, "hook": h,
                 "unit": "calls", "ratio": None, "target": 0,
                 "result": "n/a" if h is None else ("PASS" if h == 0 else "FAIL")}
            rows.append(r)

    # Rows measured in interleaved pairs (bench/pairs/pairs.py): the ratio is the median of the
    # pair ratios (B hook / A native), the baseline and hook columns the medians of the A and of
    # the B values; the note gives the pair count, the bootstrap 95% interval and the spread.
    def pairs_row(metric, name, asked, target=None, sec=None):
        d = data.get("pairs_" + name) or {}
        prs = d.get("pairs") or []
        ratios = [p["ratio"] for p in prs]
        higher = d.get("better", "higher" if name.startswith(("launch", "decode")) else "lower") == "higher"
        note = None
        if ratios:
            ci = d.get("ci95")
            note = "median of %d/%d pair ratios%s, spread %.3fx-%.3fx" % (
                len(ratios), d.get("asked_pairs", asked), ", 95%% CI %.3fx-%.3fx" % tuple(ci) if ci else "",
                min(ratios), max(ratios))
        elif d.get("errors"):
            note = d["errors"][-1][:120]
        row(metric, d.get("a_median"), d.get("b_median"), d.get("unit", "ms" if name.startswith("train") else "s"),
            target, ratio=statistics.median(ratios) if ratios else None, note=note, at_least=higher,
            extra={"pairs": d.get("asked_pairs", asked), "pair_ratios": ratios, "ci95": d.get("ci95"),
                   "spread": {"min": min(ratios), "max": max(ratios)} if ratios else None})

    gpu = args.mode != "sim"
    if section("launch"):
        pairs_row("launches/s, tight loop of empty kernels", "launch_loop", args.pairs, 0.98)
        pairs_row("launches/s, CUDA graph replay (100 kernel nodes)", "launch_graph", args.pairs, 0.98)
    if gpu and section("decode"):
        pairs_row("decode tokens/s, GPT-2 small, batch 1", "decode_b1", args.pairs, 0.98)
        pairs_row("decode tokens/s, GPT-2 small, batch 32", "decode_b32", args.pairs, 0.98)
    if gpu and section("load"):
        d = data.get("pairs_load_model") or {}
        gib = ((d.get("a_extra") or {}).get("file_bytes") or 0) / 2**30
        pairs_row("model load, %s safetensors to the GPU" % ("%.0f GiB" % gib if gib else "checkpoint"),
                  "load_model", args.pairs, 1.05)
    if gpu and section("train"):
        for alloc in ("default", "expandable"):
            pairs_row("train step median (%s allocator)" % alloc, "train_" + alloc, args.train_pairs, 1.01)
    if section("start"):
        counts = sorted(int(k[len("pairs_start_"):]) for k in data
                        if k.startswith("pairs_start_") and k[len("pairs_start_"):].isdigit())
        for n in counts or ([] if not gpu else [32, 128]):
            pairs_row("start: %d processes CUDA-ready with 64 MiB each (time until all)" % n, "start_%d" % n,
                      args.pairs, 1.2 if n >= 128 else None)

    traces = sorted(k[len("replay_native_"):] for k in data
                    if k.startswith("replay_native_") and not k.startswith("replay_native_all_"))
    if not section("replay"):
        traces = []
    for tag, what in (("", ""), ("_nores", ", reserve off"), ("_stock", ", warm stock on"), ("_prefetch", ", prefetch on")):
        peak_sum = 0
        for t in traces:
            n, h = data.get("replay_native_" + t) or {}, data.get("replay_hook%s_%s" % (tag, t)) or {}
            if "alloc" in h:
                peak_sum += h.get("peak_granted_bytes", 0)
            row("replay %s alloc p50%s" % (t, what), n.get("alloc", {}).get("p50_us"),
                h.get("alloc", {}).get("p50_us"), "us")
            row("replay %s alloc p90%s" % (t, what), n.get("alloc", {}).get("p90_us"),
                h.get("alloc", {}).get("p90_us"), "us")
            # Information, not a target: the traces are PyTorch's block allocations replayed as if
            # its caching allocator were off, which real PyTorch users do not run. The hooked
            # traces run at once, so they are also compared with the native traces run at once.
            row("replay %s alloc p99%s" % (t, what), n.get("alloc", {}).get("p99_us"),
                h.get("alloc", {}).get("p99_us"), "us")
            if tag == "":
                na = data.get("replay_native_all_" + t) or {}
                row("replay %s alloc p99 (baseline: native, %d traces at once)" % (t, len(traces)),
                    na.get("alloc", {}).get("p99_us"), h.get("alloc", {}).get("p99_us"), "us")
        w = data.get("poolwatch" + tag) or {}
        devs = w.get("devices") or []
        if traces:
            pool_peak = None
            if devs:
                d0 = devs[0]
                pool_peak = d0.get("pool_peak_bytes") or d0.get("pool_bytes_max")
            row("replay %d tenants%s: pool peak vs sum of tenant peaks" % (len(traces), what),
                peak_sum or None, pool_peak, "bytes")
            if devs:
                row("replay %d tenants%s: granted peak vs sum of tenant peaks" % (len(traces), what),
                    peak_sum or None, devs[0].get("granted_bytes_max"), "bytes")

    # Storm (simulator, whatever the mode): absolute targets from the issue. The daemon's figures
    # come from its grant-latency histogram, the clients' from their own clocks.
    def abs_row(metric, base, value, limit):
        result = "info" if limit is None else ("n/a" if value is None else ("PASS" if value <= limit + 1e-9 else "FAIL"))
        rows.append({"metric": metric, "baseline": base, "hook": value, "unit": "ms",
                     "ratio": value / base if (base and value is not None) else None, "target": limit,
                     "absolute": True, "result": result})

    if section("storm"):
        storm = data.get("storm") or {}
        sd, sc = storm.get("daemon") or {}, storm.get("client") or {}
        ms = lambda v: v / 1e3 if v is not None else None
        tag = "storm %dx%d" % (int(storm.get("tenants", 64)), int(storm.get("threads", 4)))
        abs_row("%s grant p50 (daemon)" % tag, None, ms(sd.get("all", {}).get("p50_us")), None)
        abs_row("%s grant p99 (daemon)" % tag, None, ms(sd.get("all", {}).get("p99_us")), 1.0)
        abs_row("%s grant max (daemon)" % tag, None, ms(sd.get("max_us")), 10.0)
        abs_row("%s grant p99, tenant stopped (daemon; baseline: before)" % tag,
                ms(sd.get("before", {}).get("p99_us")), ms(sd.get("during", {}).get("p99_us")), 1.0)
        ca = sc.get("alloc", {})
        abs_row("%s alloc p99 (clients)" % tag, None, ms(ca.get("all", {}).get("p99_us")), None)
        abs_row("%s alloc p99, tenant stopped (clients; baseline: before)" % tag,
                ms(ca.get("before", {}).get("p99_us")), ms(ca.get("during", {}).get("p99_us")), None)

    out = {
        "mode": args.mode,
        "quick": bool(args.quick),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "rows": rows,
        "raw": data,
    }
    with open(args.results, "w") as f:
        json.dump(out, f, indent=1)

    w_metric = max([len(r["metric"]) for r in rows] + [6])
    print("== vlake bench (%s%s)%s" % (args.mode, ", quick" if args.quick else "",
                                       "  [simulator: timings are not GPU timings]" if args.mode == "sim" else ""))
    print("%-*s  %16s  %16s  %8s  %8s  %s" % (w_metric, "metric", "native/baseline", "hook", "ratio", "target", "result"))
    for r in rows:
        ratio = "-" if r["ratio"] is None else "%.2fx" % r["ratio"]
        if r["target"] is None:
            target = "-"
        elif r.get("absolute"):
            target = "<=%g%s" % (r["target"], r["unit"])
        elif r.get("at_least"):
            target = ">=%gx" % r["target"]
        else:
            target = "<=%gx" % r["target"] if r["unit"] != "calls" else "0"
        line = "%-*s  %16s  %16s  %8s  %8s  %s" % (w_metric, r["metric"], fmt(r["baseline"], r["unit"]),
                                                 fmt(r["hook"], r["unit"]), ratio, target, r["result"])
        print(line + ("  (%s)" % r["note"] if r.get("note") else ""))
    counts = {k: sum(1 for r in rows if r["result"] == k) for k in ("PASS", "FAIL", "n/a", "info")}
    print("%d PASS, %d FAIL, %d n/a, %d info; results: %s" % (counts["PASS"], counts["FAIL"], counts["n/a"],
                                                              counts["info"], args.results))
    if args.strict and (counts["FAIL"] or counts["n/a"]):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
