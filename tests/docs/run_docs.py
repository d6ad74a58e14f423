#!/usr/bin/env python3
"""Runs every command block of the documentation that is marked runnable (docs/development.md,
"Runnable docs"), against a sandbox on the simulated GPU, and fails naming the file and line of
each block that does not do what the page says.

    run_docs.py --source DIR --build DIR [--list] [FILE.md ...]

Markers, on the line right before a fenced block (HTML comments: GitHub shows nothing of them):

    <!-- runnable -->               a ```sh block: run with bash -e -o pipefail, must exit 0;
                                    a block of "$ command" lines each followed by its output:
                                    every command runs in one shell, in order, and its output
                                    (stdout and stderr) must be the lines shown. In those lines
                                    "…" matches any text, and a line that is only "…" any lines
    <!-- runnable-file: NAME -->    the block is a file the blocks after it use: written as NAME
                                    into the page's directory

The sandbox: one vlaked on the simulated driver (a 16 GiB GPU) with its own state segment, socket
and metrics port; each page runs in a directory of its own where the repository's top-level
entries are linked, and build/release is the tree under test. The blocks see VLAKE_STATE and
VLAKE_SOCKET (vlakectl and the hook find that vlaked), VLAKE_SIM_NODE and VLAKE_SIM_DEVICE_MEMORY
(a program on the simulator shares its GPU), VLAKE_METRICS_URL (its /metrics) and PATH with
vlaked and vlakectl first. Everything it started or made is removed at the end.
"""
import argparse
import glob
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support"))
import testprocs  # noqa: E402  (tests/support/testprocs.py)

MARK_RUN = re.compile(r"^<!--\s*runnable\s*-->\s*$")
MARK_FILE = re.compile(r"^<!--\s*runnable-file:\s*([A-Za-z0-9._-]+)\s*-->\s*$")
MARK_ANY = re.compile(r"^<!--\s*runnable")
FENCE = re.compile(r"^(```+|~~~+)\s*([^\s`]*)")
SHELL_LANGS = {"sh", "bash", "shell"}
BLOCK_TIMEOUT = 60  # seconds, per block
CMD_MARK = "@@vlake-docs-command-done@@"


class Block:
    def __init__(self, path, line, kind, lang, text, name=None):
        self.path, self.line, self.kind, self.lang, self.text, self.name = path, line, kind, lang, text, name

    def where(self):
        return "%s:%d" % (self.path, self.line)


def parse(path, rel):
    """The marked blocks of one Markdown file; a marker not followed by a fence is an error."""
    lines = open(path, encoding="utf-8").read().split("\n")
    blocks, errors = [], []
    i = 0
    while i < len(lines):
        line = lines[i]
        unmarked = FENCE.match(line)
        if unmarked:  # a block without a marker: skip it whole (a marker inside it is an example)
            i += 1
            while i < len(lines) and not lines[i].startswith(unmarked.group(1)):
                i += 1
            i += 1
            continue
        if not MARK_ANY.match(line):
            i += 1
            continue
        run, file = MARK_RUN.match(line), MARK_FILE.match(line)
        fence = FENCE.match(lines[i + 1]) if i + 1 < len(lines) else None
        if not (run or file):
            errors.append("%s:%d: unknown marker %r (<!-- runnable --> or <!-- runnable-file: NAME -->)"
                          % (rel, i + 1, line.strip()))
            i += 1
            continue
        if fence is None:
            errors.append("%s:%d: a runnable marker must be right before a fenced block" % (rel, i + 1))
            i += 1
            continue
        ticks, lang = fence.group(1), fence.group(2)
        end = i + 2
        while end < len(lines) and not lines[end].startswith(ticks):
            end += 1
        if end >= len(lines):
            errors.append("%s:%d: the block never closes" % (rel, i + 2))
            break
        text = "\n".join(lines[i + 2:end]) + "\n"
        if file:
            blocks.append(Block(rel, i + 2, "file", lang, text, file.group(1)))
        elif lang in SHELL_LANGS:
            blocks.append(Block(rel, i + 2, "script", lang, text))
        elif lines[i + 2:end] and lines[i + 2].startswith("$ "):
            blocks.append(Block(rel, i + 2, "transcript", lang, text))
        else:
            errors.append("%s:%d: a runnable block is ```sh (a script) or starts with '$ ' (a transcript)"
                          % (rel, i + 2))
        i = end + 1
    return blocks, errors


def transcript_steps(text):
    """[(command, [expected output lines])] of a transcript block."""
    steps = []
    for line in text.rstrip("\n").split("\n"):
        if line.startswith("$ "):
            steps.append((line[2:], []))
        else:
            steps[-1][1].append(line)
    return steps


def line_matches(pattern, actual):
    parts = [re.escape(p) for p in pattern.rstrip().split("…")]
    return re.fullmatch(".*".join(parts), actual.rstrip(), re.S) is not None


def lines_match(expected, actual):
    """Expected lines against actual ones: '…' alone matches any lines, inside a line any text."""
    if not expected:
        return not actual
    head = expected[0]
    if head.strip() == "…":
        return any(lines_match(expected[1:], actual[k:]) for k in range(len(actual) + 1))
    return bool(actual) and line_matches(head, actual[0]) and lines_match(expected[1:], actual[1:])


def run_transcript(block, cwd, env):
    steps = transcript_steps(block.text)
    script = ["set -o pipefail", "__vlake_docs_rc=0"]
    for cmd, _ in steps:
        # The previous command's status is restored, so that `echo $?` sees it.
        script += ["(exit $__vlake_docs_rc)", "{ %s\n} 2>&1" % cmd, "__vlake_docs_rc=$?",
                   "printf '\\n%s\\n'" % CMD_MARK]
    try:
        p = subprocess.run(["bash", "-c", "\n".join(script) + "\n"], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=BLOCK_TIMEOUT)
    except subprocess.TimeoutExpired:
        return "timed out after %d s" % BLOCK_TIMEOUT
    out = p.stdout.decode("utf-8", "replace")
    chunks = out.split("\n" + CMD_MARK + "\n")
    for k, (cmd, expected) in enumerate(steps):
        got = chunks[k] if k < len(chunks) else "(no output: the shell stopped before it)"
        got = got[:-1] if got.endswith("\n") else got  # the newline before the mark
        actual = got.split("\n") if got else []
        if not lines_match(expected, actual):
            return ("`$ %s` printed:\n%s\n--- the page says:\n%s" %
                    (cmd, "\n".join("  | " + a for a in actual), "\n".join("  | " + e for e in expected)))
    return None


def run_script(block, cwd, env):
    try:
        p = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block.text], cwd=cwd, env=env,
                           stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=BLOCK_TIMEOUT)
    except subprocess.TimeoutExpired:
        return "timed out after %d s" % BLOCK_TIMEOUT
    if p.returncode != 0:
        return "exit status %d; output:\n%s" % (p.returncode, "\n".join(
            "  | " + l for l in p.stdout.decode("utf-8", "replace").rstrip("\n").split("\n")))
    return None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Sandbox:
    """vlaked on the simulated driver, and the environment the blocks run in."""

    def __init__(self, source, build):
        self.source, self.build = source, build
        self.root = tempfile.mkdtemp(prefix="vlake-docs-")
        os.chmod(self.root, 0o755)
        tag = "docs-%d" % os.getpid()
        self.state, self.node = "vlake-" + tag, tag
        self.sock = os.path.join(self.root, "vlaked.sock")
        self.proc = None
        bindir = os.path.join(self.root, "bin")
        os.mkdir(bindir)
        for name, rel in (("vlaked", "pool/vlaked"), ("vlakectl", "ctl/vlakectl")):
            os.symlink(os.path.join(build, rel), os.path.join(bindir, name))
        self.port = free_port()
        self.env = dict(os.environ, PATH=bindir + os.pathsep + os.environ.get("PATH", ""),
                        VLAKE_STATE=self.state, VLAKE_SOCKET=self.sock, VLAKE_SIM_NODE=self.node,
                        VLAKE_SIM_DEVICE_MEMORY="16GiB", VLAKE_METRICS_URL="http://127.0.0.1:%d/metrics" % self.port)
        for var in ("LD_PRELOAD", "LD_LIBRARY_PATH", "VLAKE_SIM_DEVICE_COUNT", "VLAKE_SIM_NODE_MODE",
                    "VLAKE_SIM_NODE_GROUP"):
            self.env.pop(var, None)

    def start(self):
        config = os.path.join(self.root, "vlake.yaml")
        with open(config, "w") as f:
            f.write("version: 1\ndefault:\n  limit: 4GiB\n")
        self.log = open(os.path.join(self.root, "vlaked.log"), "w")
        self.proc = subprocess.Popen(
            [os.path.join(self.build, "pool/vlaked"), "--config", config, "--socket", self.sock, "--state", self.state,
             "--driver", os.path.join(self.build, "sim/libcuda.so.1"),
             "--nvml", os.path.join(self.build, "sim/libnvidia-ml.so.1"),
             "--metrics-address", "127.0.0.1:%d" % self.port, "--sample-interval-ms", "250"],
            env=self.env, stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 30
        while not os.path.exists(self.sock):
            if self.proc.poll() is not None or time.time() > deadline:
                raise RuntimeError("vlaked did not start:\n" + open(self.log.name).read()[-3000:])
            time.sleep(0.05)

    def page_dir(self, rel):
        """A fresh directory for one page: the repository's entries linked, build/release the tree."""
        d = os.path.join(self.root, "pages", re.sub(r"[^A-Za-z0-9._-]", "_", rel))
        os.makedirs(os.path.join(d, "build"))
        for entry in os.listdir(self.source):
            if entry not in ("build", ".git"):
                os.symlink(os.path.join(self.source, entry), os.path.join(d, entry))
        os.symlink(self.build, os.path.join(d, "build", "release"))
        return d

    def stop(self):
        if self.proc is not None:
            testprocs.stop(self.proc)
        testprocs.unlink_quiet("/dev/shm/" + self.state, "/dev/shm/vlake-sim-" + self.node)
        shutil.rmtree(self.root, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--source", required=True, help="the repository")
    ap.add_argument("--build", required=True, help="the build tree under test")
    ap.add_argument("--list", action="store_true", help="list the marked blocks, run nothing")
    ap.add_argument("files", nargs="*", help="pages to run (default: README.md and docs/*.md)")
    args = ap.parse_args()
    source, build = os.path.abspath(args.source), os.path.abspath(args.build)
    files = args.files or ["README.md"] + sorted(os.path.relpath(p, source)
                                                 for p in glob.glob(os.path.join(source, "docs", "*.md")))
    pages, errors = [], []
    for rel in files:
        blocks, errs = parse(os.path.join(source, rel), rel)
        errors += errs
        if blocks:
            pages.append((rel, blocks))
    runnable = sum(1 for _, blocks in pages for b in blocks if b.kind != "file")
    if args.list:
        for _, blocks in pages:
            for b in blocks:
                print("%s %s%s" % (b.where(), b.kind, " " + b.name if b.name else ""))
    for e in errors:
        print(e)
    if errors:
        return 1
    if args.list:
        return 0
    if runnable == 0:
        print("run_docs.py: no block is marked runnable in %s" % ", ".join(files))
        return 1

    sandbox = Sandbox(source, build)
    failed, passed = [], 0
    try:
        sandbox.start()
        for rel, blocks in pages:
            cwd = sandbox.page_dir(rel)
            for b in blocks:
                if b.kind == "file":
                    with open(os.path.join(cwd, b.name), "w") as f:
                        f.write(b.text)
                    continue
                started = time.time()
                why = (run_script if b.kind == "script" else run_transcript)(b, cwd, sandbox.env)
                took = time.time() - started
                if why is None:
                    passed += 1
                    print("ok      %s (%s, %.1f s)" % (b.where(), b.kind, took))
                else:
                    failed.append(b.where())
                    print("FAILED  %s (%s, %.1f s): %s" % (b.where(), b.kind, took, why))
        if sandbox.proc.poll() is not None:
            failed.append("vlaked (exited %d during the run)" % sandbox.proc.returncode)
    finally:
        sandbox.stop()
    print("%d passed, %d failed" % (passed, len(failed)))
    for f in failed:
        print("failed: " + f)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
