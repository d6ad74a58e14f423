"""The worker side of bench/pairs/pairs.py's protocol, for the PyTorch benchmarks.

serve(handlers, ready): prints `ready` (a dict, "ready": true added) as one JSON line, then reads
command lines from stdin ("<op> key=value ..."), calls handlers[op](**kwargs) with the values
as strings, and prints its dict as one JSON line (it must hold "value"); an exception prints
{"error": "..."} and serving goes on. "quit" or the end of input returns.
"""
import json
import sys


def serve(handlers, ready):
    print(json.dumps(dict(ready, ready=True)), flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "quit":
            return 0
        try:
            if words[0] not in handlers:
                raise ValueError("unknown command %r (%s)" % (words[0], ", ".join(sorted(handlers))))
            kwargs = dict(w.split("=", 1) for w in words[1:])
            out = handlers[words[0]](**kwargs)
        except Exception as e:  # noqa: BLE001 - the harness records it and goes on
            out = {"error": "%s: %s" % (type(e).__name__, e)}
        print(json.dumps(out), flush=True)
    return 0
