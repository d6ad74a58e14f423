#!/usr/bin/env python3
"""Every entry point the hook intercepts runs without a GPU, or says why it cannot.

For each row of hooked.def (VLAKE_HOOK(base, symbol, version): `symbol`;
VLAKE_HOOK_PTSZ(base, symbol, ptsz_symbol, version): `ptsz_symbol`), the entry point is covered
when both
  (a) the simulated libcuda.so.1 exports it (`nm -D --defined-only`), and
  (b) some test source under the tests directory names it: as a string literal ("symbol", a
      dlsym or cuGetProcAddress look-up) or as an identifier. An identifier that cuda.h
      redirects to another symbol (#define cuMemAlloc cuMemAlloc_v2) does not count for the
      redirected name: a call written that way reaches the other symbol.
An entry point that is not covered must be listed with its reason in the GPU-only file
(`name  reason` rows; '#' starts a comment). A listed entry point that is covered, or one that
is not a hooked.def row, is an error too (the list stays exact).

Exit status 0 when every entry point is covered or listed; 1 otherwise (the uncovered ones are
printed); 2 on a usage or input error.
"""
import argparse
import pathlib
import re
import subprocess
import sys

ROW = re.compile(r"^\s*VLAKE_HOOK\(\s*(\w+)\s*,\s*(\w+)\s*,\s*(\d+)\s*\)")
PTSZ_ROW = re.compile(r"^\s*VLAKE_HOOK_PTSZ\(\s*(\w+)\s*,\s*(\w+)\s*,\s*(\w+)\s*,\s*(\d+)\s*\)")
REDIRECT = re.compile(r"^\s*#\s*define\s+(cu\w+)\s+(?:__CUDA_API_PT(?:DS|SZ)\(\s*)?(cu\w+)")
SOURCE_SUFFIXES = {".cpp", ".hpp", ".c", ".h", ".cc", ".py", ".sh"}


def hooked_entry_points(def_path):
    names = []
    for line in def_path.read_text().splitlines():
        if m := ROW.match(line):
            names.append(m.group(2))
        elif m := PTSZ_ROW.match(line):
            names.append(m.group(3))
    return list(dict.fromkeys(names))


def exported_symbols(lib):
    out = subprocess.run(["nm", "-D", "--defined-only", str(lib)], check=True, capture_output=True, text=True).stdout
    return {parts[-1].split("@")[0] for parts in (l.split() for l in out.splitlines()) if len(parts) >= 3}


def redirected_names(cuda_h):
    # The renaming block at the top of cuda.h (before its first typedef).
    redirected = set()
    for line in cuda_h.read_text(errors="replace").splitlines():
        if line.lstrip().startswith("typedef"):
            break
        if (m := REDIRECT.match(line)) and m.group(1) != m.group(2):
            redirected.add(m.group(1))
    return redirected


def test_text(tests_dir, skip):
    chunks = []
    for p in sorted(tests_dir.rglob("*")):
        if p.is_file() and p.suffix in SOURCE_SUFFIXES and p.resolve() != skip:
            chunks.append(p.read_text(errors="replace"))
    return "\n".join(chunks)


def named(symbol, text, redirected):
    if f'"{symbol}"' in text:
        return True
    return symbol not in redirected and re.search(rf"(?<![\w]){re.escape(symbol)}(?![\w])", text) is not None


def gpu_only_rows(path):
    rows = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split(None, 1)
        if len(parts) < 2 or not parts[1].strip():
            raise ValueError(f"{path}:{n}: '{parts[0]}' has no reason")
        rows[parts[0]] = parts[1].strip()
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hooked-def", required=True, type=pathlib.Path)
    ap.add_argument("--sim-lib", required=True, type=pathlib.Path)
    ap.add_argument("--tests-dir", required=True, type=pathlib.Path)
    ap.add_argument("--cuda-h", required=True, type=pathlib.Path)
    ap.add_argument("--gpu-only", required=True, type=pathlib.Path)
    a = ap.parse_args()
    try:
        entries = hooked_entry_points(a.hooked_def)
        exported = exported_symbols(a.sim_lib)
        redirected = redirected_names(a.cuda_h)
        text = test_text(a.tests_dir, pathlib.Path(__file__).resolve())
        gpu_only = gpu_only_rows(a.gpu_only)
    except (OSError, ValueError, subprocess.CalledProcessError) as e:
        print(f"check_hooked_coverage: {e}", file=sys.stderr)
        return 2
    if not entries:
        print(f"check_hooked_coverage: no rows in {a.hooked_def}", file=sys.stderr)
        return 2

    problems = []
    covered = listed = 0
    for e in entries:
        missing = []
        if e not in exported:
            missing.append("not exported by the simulator")
        if not named(e, text, redirected):
            missing.append("named by no test")
        if e in gpu_only:
            if missing:
                listed += 1
                print(f"GPU-only  {e}: {gpu_only[e]}")
            else:
                problems.append(f"{e}: listed as GPU-only but covered (remove it from {a.gpu_only.name})")
        elif missing:
            problems.append(f"{e}: {', '.join(missing)}")
        else:
            covered += 1
    for g in sorted(set(gpu_only) - set(entries)):
        problems.append(f"{g}: listed as GPU-only but not a row of {a.hooked_def.name}")
    print(f"{len(entries)} hooked entry points: {covered} covered by the simulator and a test, "
          f"{listed} GPU-only, {len(problems)} problems")
    for p in problems:
        print(f"UNCOVERED {p}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
