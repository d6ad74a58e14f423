#!/usr/bin/env python3
"""bench.count.compare: bench/count/gate.py's comparison on hand-made counts (no valgrind).

  test_count_gate.py <path to bench/count/gate.py>

A count 20 % above its baseline fails the gate (exit 1), 5 % above passes, 15 % below passes
with the note that the baseline can be lowered, a path missing from the measurement fails, a
new path without a baseline passes. Exit 0 when all hold.
"""
import json
import os
import subprocess
import sys
import tempfile

BASE = {"version": 1, "compiler": "c++ 12.2.0", "build_type": "RelWithDebInfo",
        "counts": {"tenant.pair": {"gated": 2000.0}, "tenant.launch": {"gated": 100.0}}}


def run(gate, tmp, counts):
    base = os.path.join(tmp, "baseline.json")
    meas = os.path.join(tmp, "measured.json")
    with open(base, "w") as f:
        json.dump(BASE, f)
    with open(meas, "w") as f:
        json.dump({"counts": counts}, f)
    p = subprocess.run([sys.executable, gate, "--compare", meas, "--baseline", base], capture_output=True, text=True)
    return p.returncode, p.stdout


def main():
    gate = sys.argv[1]
    errors = []
    with tempfile.TemporaryDirectory(prefix="vlake-count-gate-") as tmp:
        cases = [
            ("20% slower warm pair", {"tenant.pair": {"gated": 2400.0}, "tenant.launch": {"gated": 100.0}}, 1, "FAIL (+20.0%"),
            ("5% slower", {"tenant.pair": {"gated": 2100.0}, "tenant.launch": {"gated": 105.0}}, 0, "ok (+5.0%)"),
            ("15% faster", {"tenant.pair": {"gated": 1700.0}, "tenant.launch": {"gated": 100.0}}, 0,
             "the baseline can be lowered"),
            ("a path not measured", {"tenant.pair": {"gated": 2000.0}}, 1, "FAIL (missing)"),
            ("a new path", {"tenant.pair": {"gated": 2000.0}, "tenant.launch": {"gated": 100.0},
                            "tenant.new": {"gated": 5.0}}, 0, "new (no baseline)"),
            ("exactly +10%", {"tenant.pair": {"gated": 2200.0}, "tenant.launch": {"gated": 110.0}}, 0, "ok (+10.0%)"),
        ]
        for name, counts, want_rc, want_text in cases:
            rc, out = run(gate, tmp, counts)
            if rc != want_rc or want_text not in out:
                errors.append("%s: exit %d (want %d), output %r (want %r in it)" % (name, rc, want_rc, out, want_text))
    for e in errors:
        print("count.compare: " + e)
    print("count.compare: %s" % ("OK" if not errors else "%d problems" % len(errors)))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
