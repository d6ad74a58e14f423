"""The acceptance scripts' check list: one line per check as it happens, a table at the end."""


class Checks:
    def __init__(self):
        self.results = []  # (name, ok, detail)

    def __call__(self, name, ok, detail=""):
        """Records one check and prints it at once; returns whether it passed."""
        self.results.append((name, bool(ok), detail))
        print(("PASS " if ok else "FAIL ") + name + (": " + detail if detail else ""), flush=True)
        return bool(ok)

    def any_failed(self):
        return any(not ok for _, ok, _ in self.results)

    def table(self, width=90):
        """Prints the table of every check; returns the exit code (0 only if all passed)."""
        print("\n%-*s %s" % (width, "check", "result"))
        for name, ok, _ in self.results:
            print("%-*s %s" % (width, name[:width], "PASS" if ok else "FAIL"))
        failed = sum(1 for _, ok, _ in self.results if not ok)
        print("%d passed, %d failed" % (len(self.results) - failed, failed))
        return 1 if failed else 0
