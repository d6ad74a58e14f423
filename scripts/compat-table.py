#!/usr/bin/env python3
"""Renders the compatibility matrix's results (the JSON lines tests/gpu/compat.py appends to
compat-results.jsonl in the build directory) as the markdown table of docs/compat.md: one line
per row and mode, the latest result of each.

  scripts/compat-table.py [RESULTS]     (default: build/gpu/compat-results.jsonl)
"""
import json
import sys


def numbers(n):
    """The key figures of a line: bus bandwidth for NCCL, otherwise what the row recorded."""
    if not n:
        return ""
    if n.get("busbw_GBps_hook") is not None:
        return "busbw %.1f GB/s with the hook, %.1f without (%.1f %%)" % (
            n["busbw_GBps_hook"], n["busbw_GBps_native"], 100.0 * (n.get("ratio") or 0))
    parts = []
    for k, v in n.items():
        if v is None:
            continue
        if isinstance(v, dict):
            v = " ".join("%s=%s" % kv for kv in v.items() if kv[1] is not None)
        parts.append("%s %s" % (k, v))
    return ", ".join(parts)


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "build/gpu/compat-results.jsonl"
    latest = {}
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    rec = json.loads(line)
                    latest[(rec["row"], rec["mode"])] = rec  # later lines win
    except FileNotFoundError:
        print("compat-table: no results in %s (run the gpu.compat.* / gpu.bypass.* tests)" % path)
        return 1
    print("| row | framework | version | mode | result | numbers | date | GPU |")
    print("|---|---|---|---|---|---|---|---|")
    for (row, mode), r in sorted(latest.items()):
        print("| %s | %s | %s | %s | %s | %s | %s | %s |" % (row, r["framework"], r.get("version") or "-", mode,
                                                         r["result"], numbers(r.get("numbers")), r["date"],
                                                         r.get("device", "")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
