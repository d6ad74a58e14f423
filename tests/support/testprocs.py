"""Process helpers shared by the Python test scripts (tests/gpu, tests/tools, tests/docs):
stopping a daemon, ending a tenant driven over stdin, quiet removal, and the scripts' common
command-line flags. Import it after putting this folder on sys.path:

    sys.path.insert(0, os.path.join(<tests>, "support"))
    import testprocs
"""

import argparse
import os
import signal
import subprocess


def _wait_or_kill(proc, timeout):
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    return proc.returncode


def stop(proc, timeout=30, sig=signal.SIGTERM):
    """Asks a running process to stop with `sig`; SIGKILLs it after `timeout` seconds. Always
    reaps it. Returns its exit status."""
    if proc.poll() is None:
        proc.send_signal(sig)
    return _wait_or_kill(proc, timeout)


def end(proc, timeout):
    """Ends a process driven over its stdin: closes stdin (its cue to exit), waits `timeout`
    seconds, then SIGKILLs it. Always reaps it. Returns its exit status."""
    try:
        proc.stdin.close()
    except (OSError, ValueError):
        pass
    return _wait_or_kill(proc, timeout)


def state_path(name):
    """vlaked's state segment `name` (contracts/state.hpp segment_path): an absolute path as is,
    a name in $VLAKE_STATE_DIR, else /run/vlake/state."""
    if name.startswith("/"):
        return name
    return os.path.join(os.environ.get("VLAKE_STATE_DIR") or "/run/vlake/state", name)


def unlink_quiet(*paths):
    """Removes files that may already be gone."""
    for path in paths:
        try:
            os.unlink(path)
        except OSError:
            pass


def tool_args(*required, optional=(), description=None):
    """Parses the command line of a script taking tool paths: each flag of `required` must be
    given (e.g. "--vlaked", "--hook"), each of `optional` may be."""
    ap = argparse.ArgumentParser(description=description)
    for flag in required:
        ap.add_argument(flag, required=True)
    for flag in optional:
        ap.add_argument(flag)
    return ap.parse_args()
