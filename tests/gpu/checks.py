"""The acceptance scripts' check list: one line per check as it happens, a table at the end."""

import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support"))
import testprocs  # noqa: E402,F401  (tests/support/testprocs.py, for the scripts importing checks)

MiB = 1 << 20
GiB = 1 << 30
SKIP = 77


def torch_gpu_as_root(name):
    """For scripts that start tenants with their own primary groups: None to go on; else the
    exit code, 77 (skipped) without a GPU and PyTorch, 1 (failed) when not root."""
    probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
                           capture_output=True, text=True)
    if probe.stdout.strip() != "True":
        print("SKIP: no GPU with PyTorch here")
        return 77
    if os.geteuid() != 0:
        print("FAIL %s: starts tenants with their own primary groups, so it needs root" % name)
        return 1
    return None


class Checks:
    def __init__(self):
        self.results = []  # (name, ok, detail)

    def __call__(self, name, ok, detail=""):
        """Records one check and prints it at once; returns whether it passed."""
        self.results.append((name, bool(ok), detail))
        print(("PASS " if ok else "FAIL ") + name + (": " + detail if detail else ""), flush=True)
        return bool(ok)

    def reconcile(self, name, state, nvml_used, daemon_context, note="", gpu=0):
        """Checks NVML's used memory of GPU `gpu` against the daemon's figures within 64 MiB.

        `state` is vlake_state_json's snapshot taken with `nvml_used`; `daemon_context` was
        measured at another moment (the daemon's NVML figure less its pool once the tenants had
        left), so no term is derived from another. The daemon's side: what each tenant holds
        (granted, its processes' own memory, memory outside vlake, retained), the free pool not
        bound to a tenant (bound free handles are their tenants' retained memory), its context,
        less what dedup saved (a shared chunk counts once per tenant in `granted`, once on the GPU).
        """
        dev = [d for d in state["devices"] if d["ordinal"] == gpu][0]
        tenants = sum(t["used"][gpu] for t in state["tenants"])
        unbound_free = dev["free_bytes"] - (dev["retained_bytes"] - dev["held_fd_bytes"])
        saved = dev["dedup_logical_bytes"] - dev["dedup_physical_bytes"]
        ours = tenants + unbound_free + daemon_context - saved
        return self(name, abs(ours - nvml_used) <= 64 * MiB,
                    "NVML used %.1f MiB%s; tenants %.1f + unbound free pool %.1f + daemon context %.1f"
                    " - dedup saved %.1f = %.1f MiB" % (nvml_used / MiB, note, tenants / MiB, unbound_free / MiB,
                                                        daemon_context / MiB, saved / MiB, ours / MiB))

    def any_failed(self):
        return any(not ok for _, ok, _ in self.results)

    def verdict(self, name):
        """Prints "<name>: PASS" when there were checks and all passed, else FAIL; returns the
        exit code (0 or 1)."""
        ok = bool(self.results) and not self.any_failed()
        print("%s: %s" % (name, "PASS" if ok else "FAIL"))
        return 0 if ok else 1

    def table(self, width=90):
        """Prints the table of every check; returns the exit code (0 only if all passed)."""
        print("\n%-*s %s" % (width, "check", "result"))
        for name, ok, _ in self.results:
            print("%-*s %s" % (width, name[:width], "PASS" if ok else "FAIL"))
        failed = sum(1 for _, ok, _ in self.results if not ok)
        print("%d passed, %d failed" % (len(self.results) - failed, failed))
        return 1 if failed else 0
