#!/usr/bin/env python3
"""GPU acceptance test of dedup (docs/dedup.md): 4 PyTorch processes under libvlake-hook.so load
the same GPT-2-sized model (random init, saved once with safetensors) and share its weights with
python/vlake (share_module).

Checks (exit 0 only if all pass; 77 = skipped):
  1. every process's share succeeds; all but the first merge all of their chunks;
  2. (printed, not checked) vlake's own figure for the weights: the daemon's dedup physical
     bytes + the processes' private edge chunks; the GPU memory check is NVML's, in
     tests/gpu/dedup_nvml.py;
  3. logits of every shared process are bit-identical to a run without the hook;
  4. prefill tokens/s of the shared processes (median) within 2 % of unshared runs under the hook
     (mean of one before and one after); decode tokens/s (launch-bound, noisy) is printed.

  dedup.py --vlaked PATH --hook PATH [--procs 4]
  dedup.py --worker MODEL [--share]       (internal: one tenant; JSON lines on stdout)
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
MiB = 1 << 20
SKIP = 77


def emit(**kw):
    print(json.dumps(kw), flush=True)


def build_model(torch):
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config())  # 124M parameters, fp32


def worker(args):
    import torch
    from safetensors.torch import load_file
    sys.path.insert(0, os.path.join(ROOT, "python"))
    model = build_model(torch)
    state = load_file(args.worker)
    model.load_state_dict(state, strict=False)
    model = model.cuda().eval()
    stats = None
    if args.share:
        import vlake
        stats = vlake.share_module(model)
        torch.cuda.empty_cache()
    replica = sum(p.numel() * p.element_size() for p in model.parameters())
    replica += sum(b.numel() * b.element_size() for b in model.buffers())
    emit(event="ready", stats=stats, replica=replica)
    sys.stdin.readline()  # "go"
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 50257, (8, 128), generator=g).cuda()
    with torch.no_grad():
        logits = model(ids).logits.float().cpu()
        # prefill (GPU-bound): batch 16 x 512 tokens; decode (launch-bound): batch 8, 64 greedy
        # steps with the KV cache. Medians of 7 after a warm-up.
        big = torch.randint(0, 50257, (16, 512), generator=g).cuda()
        pre, dec = [], []
        for i in range(8):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            model(big)
            torch.cuda.synchronize()
            t1 = time.perf_counter()
            out = model(ids, use_cache=True)
            past, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
            for _ in range(64):
                out = model(nxt, past_key_values=past, use_cache=True)
                past, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            if i > 0:
                pre.append(16 * 512 / (t1 - t0))
                dec.append(8 * 64 / (t2 - t1))
        pre.sort()
        dec.sort()
    torch.save(logits, args.logits)
    emit(event="done", prefill=pre[len(pre) // 2], decode=dec[len(dec) // 2])
    sys.stdin.readline()  # "exit"
    return 0


results = []


def check(name, ok, detail=""):
    results.append((name, bool(ok), detail))
    print(("PASS " if ok else "FAIL ") + name + (": " + detail if detail else ""), flush=True)
    return ok


def metrics(addr):
    text = urllib.request.urlopen("http://%s/metrics" % addr, timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or 'gpu_index="0"' not in line:
            continue
        name = line.split("{", 1)[0]
        out[name] = float(line.rsplit(" ", 1)[1])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vlaked")
    ap.add_argument("--hook")
    ap.add_argument("--procs", type=int, default=4)
    # --host-tier SIZE: the tenants in an overcommit namespace with vlaked's host tier on, where
    # they keep the pool and dedup (docs/swap.md, "Host tier").
    ap.add_argument("--host-tier")
    ap.add_argument("--worker")
    ap.add_argument("--share", action="store_true")
    ap.add_argument("--logits")
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    try:
        import torch  # noqa: F401
        import safetensors  # noqa: F401
        import transformers  # noqa: F401
        if not torch.cuda.is_available():
            raise ImportError
    except ImportError:
        print("SKIP: no GPU with PyTorch, safetensors and transformers here")
        return SKIP

    work = tempfile.mkdtemp(prefix="vlake-dedup-")
    os.chmod(work, 0o755)
    model_path = os.path.join(work, "gpt2-random.safetensors")
    import torch
    from safetensors.torch import save_file
    save_file({k: v.contiguous() for k, v in build_model(torch).state_dict().items()
               if not k.endswith("lm_head.weight")}, model_path)

    base = dict(os.environ, PYTHONUNBUFFERED="1", CUBLAS_WORKSPACE_CONFIG=":4096:8")

    def start(env, share, tag):
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", model_path,
               "--logits", os.path.join(work, tag + ".pt")] + (["--share"] if share else [])
        return subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def read(p, event):
        for line in p.stdout:
            if line.startswith("{"):
                d = json.loads(line)
                if d.get("event") == event:
                    return d
        raise RuntimeError("worker ended before " + event)

    def run_one(env, share, tag):
        p = start(env, share, tag)
        ready = read(p, "ready")
        p.stdin.write("go\n"); p.stdin.flush()
        done = read(p, "done")
        p.stdin.write("exit\n"); p.stdin.flush()
        p.wait(timeout=120)
        return ready, done

    # Reference: no hook.
    _, ref = run_one(base, False, "ref")
    ref_logits = torch.load(os.path.join(work, "ref.pt"))

    import socket as _socket
    with _socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        maddr = "127.0.0.1:%d" % s.getsockname()[1]
    cfg = os.path.join(work, "vlake.yaml")
    with open(cfg, "w") as f:
        if args.host_tier:
            f.write("version: 1\ndefault:\n  limit: 60GiB\nnamespaces:\n"
                    "  - {name: nb, overcommit: true, dedup_domain: replicas, users: [%d]}\n" % os.getuid())
        else:
            f.write("version: 1\ndefault:\n  limit: 60GiB\n  dedup_domain: replicas\n")
    sock = os.path.join(work, "vlaked.sock")
    log = open(os.path.join(work, "vlaked.log"), "w")
    daemon = subprocess.Popen([args.vlaked, "--config", cfg, "--socket", sock, "--state",
                               "vlake-dedup-%d" % os.getpid(), "--metrics-address", maddr,
                               *(("--host-tier", args.host_tier) if args.host_tier else ())],
                              stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 60
        while not os.path.exists(sock):
            if daemon.poll() is not None or time.time() > deadline:
                raise RuntimeError("vlaked did not start")
            time.sleep(0.1)
        hooked = dict(base, LD_PRELOAD=args.hook, VLAKE_SOCKET=sock, VLAKE_RESERVE="0")

        # Unshared under the hook (tokens/s baseline).
        _, unshared = run_one(hooked, False, "unshared")

        # K shared processes, loaded at the same time.
        procs = [start(hooked, True, "shared%d" % i) for i in range(args.procs)]
        readies = [read(p, "ready") for p in procs]
        m = metrics(maddr)
        replica = readies[0]["replica"]
        merged = sorted(r["stats"]["merged_bytes"] for r in readies)
        check("every process shared its weights",
              all(r["stats"] and r["stats"]["shared_bytes"] >= replica - 4 * MiB for r in readies),
              "shared %s MiB each" % [round(r["stats"]["shared_bytes"] / MiB, 1) for r in readies])
        check("all but the first merged every chunk",
              merged[0] == 0 and all(x == readies[0]["stats"]["shared_bytes"] for x in merged[1:]),
              "merged MiB %s" % [round(x / MiB, 1) for x in merged])
        phys = m.get("vlake_dedup_physical_bytes", -1)
        logical = m.get("vlake_dedup_logical_bytes", -1)
        private = sum(r["stats"]["copied_bytes"] for r in readies)
        pool_used = m.get("vlake_pool_reserved_bytes", 0) - m.get("vlake_pool_free_bytes", 0)
        weights = phys + private
        print("INFO vlake's counters (NVML's figure is dedup_nvml.py's): replica %.1f MiB, %d procs: shared "
              "physical %.1f MiB + private %.1f MiB = %.3fx; logical %.1f MiB; pool in use %.1f MiB"
              % (replica / MiB, args.procs, phys / MiB, private / MiB, weights / replica, logical / MiB,
                 pool_used / MiB), flush=True)
        pre, dec = [], []
        for i, p in enumerate(procs):  # one at a time: timings without contention
            p.stdin.write("go\n"); p.stdin.flush()
            d = read(p, "done")
            pre.append(d["prefill"])
            dec.append(d["decode"])
        for p in procs:
            p.stdin.write("exit\n"); p.stdin.flush()
            p.wait(timeout=120)
        same = all(torch.equal(torch.load(os.path.join(work, "shared%d.pt" % i)), ref_logits)
                   for i in range(args.procs))
        check("logits bit-identical to the run without the hook", same)
        check("unshared logits under the hook bit-identical too",
              torch.equal(torch.load(os.path.join(work, "unshared.pt")), ref_logits))
        _, unshared2 = run_one(hooked, False, "unshared2")
        un_pre = (unshared["prefill"] + unshared2["prefill"]) / 2
        un_dec = (unshared["decode"] + unshared2["decode"]) / 2
        sh_pre = sorted(pre)[len(pre) // 2]
        sh_dec = sorted(dec)[len(dec) // 2]
        check("prefill tokens/s shared within 2 % of unshared", abs(sh_pre / un_pre - 1) <= 0.02,
              "shared %s (median %.0f), unshared (hook) %.0f/%.0f, no hook %.0f"
              % ([round(x) for x in pre], sh_pre, unshared["prefill"], unshared2["prefill"], ref["prefill"]))
        # Decode at batch 8 is bound by Python and kernel launches: identical runs differ by up to
        # 30 % on the H100 machine (docs/dedup.md), so it is reported, not checked.
        print("INFO decode tokens/s: shared %s (median %.0f, %.1f %% vs unshared), unshared (hook) "
              "%.0f/%.0f, no hook %.0f" % ([round(x) for x in dec], sh_dec, 100 * (sh_dec / un_dec - 1),
                                           unshared["decode"], unshared2["decode"], ref["decode"]),
              flush=True)
        after = metrics(maddr)
        check("shared chunks back to the pool after the processes exit",
              after.get("vlake_dedup_physical_bytes", -1) == 0)
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:
            daemon.kill()
        log.close()
    print()
    for name, ok, detail in results:
        print("%-4s %s%s" % ("ok" if ok else "FAIL", name, "  (" + detail + ")" if detail else ""))
    if not all(ok for _, ok, _ in results):
        print(open(os.path.join(work, "vlaked.log")).read()[-3000:])
        return 1
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
