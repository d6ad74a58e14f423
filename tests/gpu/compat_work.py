#!/usr/bin/env python3
"""The workloads of the compatibility matrix (compat.py): one process of one framework.

  compat_work.py WORKLOAD [--reference] [--limit BYTES] [workload options]

Protocol on stdout, lines starting with "@@ " followed by one JSON object (anything else on
stdout or stderr is the framework's own output):
  {"skip": reason}        the framework or the GPU is not usable here (exit 0);
  {"holding": {...}}      the workload holds its memory now and waits for one line on stdin
                          (compat.py snapshots the daemon's accounting and NVML meanwhile);
                          several may follow one another;
  {"result": {...}}       the last line: what was computed, the framework's version and, under
                          the hook, how an allocation of --limit + 1 GiB failed ("oom").
--reference: the run without the hook, for comparison: no holding, no over-limit allocation.
"""
import argparse
import ctypes
import json
import os
import select
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
MiB = 1 << 20
GiB = 1 << 30
OOM = 2  # CUDA_ERROR_OUT_OF_MEMORY


def emit(obj):
    print("@@ " + json.dumps(obj), flush=True)


def hold(args, info):
    """Reports what is held and waits for compat.py's go-ahead (not in reference runs)."""
    if args.reference:
        return
    emit({"holding": info})
    sys.stdin.readline()


def skip(reason):
    emit({"skip": reason})
    sys.exit(0)


# ---------------------------------------------------------------------------------------- torch
def torch_or_skip():
    try:
        import torch
    except ImportError as e:
        skip("PyTorch not importable: %s" % e)
    if not torch.cuda.is_available():
        skip("torch.cuda.is_available() is False")
    return torch


def torch_oom(args, device="cuda"):
    """Allocates --limit + 1 GiB: PyTorch must raise its own torch.OutOfMemoryError; a 64 MiB
    tensor afterwards must still work."""
    import torch
    out = {"error": None}
    try:
        x = torch.empty(args.limit + GiB, dtype=torch.uint8, device=device)
        torch.cuda.synchronize(device)
        del x
    except torch.OutOfMemoryError as e:
        out = {"error": "torch.OutOfMemoryError", "message": str(e).splitlines()[0][:240]}
    except Exception as e:  # any other error is reported by name, the check fails
        out = {"error": type(e).__module__ + "." + type(e).__name__, "message": str(e).splitlines()[0][:240]}
    y = torch.ones(64 * MiB, dtype=torch.uint8, device=device)
    out["after"] = int(y.sum().item()) == 64 * MiB
    return out


def w_train(args):
    """A few training steps of train.py's small transformer (deterministic)."""
    torch = torch_or_skip()
    from train import Model
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    model = Model(layers=2).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    gen = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(args.steps):
        x = torch.randint(0, 1000, (16, 128), generator=gen).cuda()
        y = torch.roll(x, shifts=-1, dims=1)
        loss = torch.nn.functional.cross_entropy(model(x).reshape(-1, 1000), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    extra = torch.ones(512 * MiB, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    res = {"version": torch.__version__, "losses": losses, "mem_get_info": list(torch.cuda.mem_get_info()),
           "allocator": torch.cuda.get_allocator_backend()}
    hold(args, {"held": max(torch.cuda.memory_reserved(), extra.numel())})
    if not args.reference:
        res["oom"] = torch_oom(args)
    emit({"result": res})


def w_graphs(args):
    """CUDA graph capture + replay of a small MLP whose captured region also allocates 128 MiB
    (with the cudaMallocAsync backend: graph memory nodes); replays compared with eager runs."""
    torch = torch_or_skip()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 512)).cuda()
    static_in = torch.randn(64, 512, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            model(static_in)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        scratch = torch.ones(32 * MiB, device="cuda")  # 128 MiB allocated inside the capture
        static_out = model(static_in) * scratch[-1]  # exact: times 1.0, after the whole fill
    worst, sums = 0.0, []
    with torch.no_grad():
        for i in range(4):
            static_in.copy_(torch.randn(64, 512, generator=torch.Generator().manual_seed(i)).cuda())
            graph.replay()
            eager = model(static_in)
            worst = max(worst, (static_out - eager).abs().max().item())
            sums.append(static_out.double().sum().item())
    torch.cuda.synchronize()
    res = {"version": torch.__version__, "max_diff": worst, "sums": sums,
           "allocator": torch.cuda.get_allocator_backend()}
    hold(args, {"held": torch.cuda.memory_reserved()})
    if not args.reference:
        res["oom"] = torch_oom(args)
    del graph
    emit({"result": res})


def _ipc_consumer(q_in, q_out):
    import torch
    x, ready = q_in.get()
    torch.cuda.current_stream().wait_event(ready)  # the producer's fill, through an IPC event
    x.add_(1)
    torch.cuda.synchronize()
    q_out.put(("done", os.getpid()))
    q_in.get()  # "exit": keeps the mapping alive until compat.py has looked
    del x


def w_mp_ipc(args):
    """torch.multiprocessing (spawn): a CUDA tensor sent through a Queue with an interprocess
    event; the consumer adds 1 in place, the producer sees it."""
    torch = torch_or_skip()
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    q_in, q_out = ctx.Queue(), ctx.Queue()
    consumer = ctx.Process(target=_ipc_consumer, args=(q_in, q_out))
    consumer.start()
    x = torch.ones(64 * MiB, dtype=torch.float32, device="cuda")  # 256 MiB
    ready = torch.cuda.Event(interprocess=True)
    ready.record()
    q_in.put((x, ready))
    msg = q_out.get(timeout=120)
    torch.cuda.synchronize()
    seen = bool((x == 2).all().item())
    res = {"version": torch.__version__, "consumer": msg[1], "producer_sees_write": seen}
    hold(args, {"held": x.numel() * 4})
    if not args.reference:
        res["oom"] = torch_oom(args)
    q_in.put("exit")
    consumer.join(timeout=60)
    res["consumer_exit"] = consumer.exitcode
    emit({"result": res})


class _Squares:
    """A deterministic dataset: sample i depends on i only."""

    def __len__(self):
        return 256

    def __getitem__(self, i):
        import torch
        x = torch.randn(128, generator=torch.Generator().manual_seed(i))
        return x, (x.sum() > 0).long()


def w_dataloader(args):
    """DataLoader with 2 worker processes and pinned memory feeding a GPU MLP."""
    torch = torch_or_skip()
    from torch.utils.data import DataLoader
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 2)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(_Squares(), batch_size=32, num_workers=2, pin_memory=True, shuffle=False)
    losses, pinned = [], True
    for _ in range(2):
        for x, y in loader:
            pinned = pinned and x.is_pinned()
            x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss.item())
    res = {"version": torch.__version__, "losses": losses, "pinned": pinned}
    hold(args, {"held": torch.cuda.memory_reserved()})
    if not args.reference:
        res["oom"] = torch_oom(args)
    emit({"result": res})


def nccl_version(torch):
    v = torch.cuda.nccl.version()  # a tuple in recent PyTorch, an int (2.21.5 = 22105) before
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


def w_nccl(args):
    """One rank of a 2-process torch.distributed NCCL job: an exact all-reduce, then the bus
    bandwidth of --bytes all-reduces (best of 3 rounds of --iters after 5 warm-ups)."""
    torch = torch_or_skip()
    import torch.distributed as dist
    if torch.cuda.device_count() < args.world:
        skip("%d GPUs visible, %d needed" % (torch.cuda.device_count(), args.world))
    dev = torch.device("cuda", args.rank)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", init_method="tcp://127.0.0.1:%d" % args.port, rank=args.rank,
                            world_size=args.world, device_id=dev)
    t = torch.arange(1 << 20, dtype=torch.float32, device=dev) * (args.rank + 1)
    dist.all_reduce(t)
    factor = args.world * (args.world + 1) // 2
    exact = bool(torch.equal(t, torch.arange(1 << 20, dtype=torch.float32, device=dev) * factor))
    buf = torch.ones(args.bytes // 4, dtype=torch.float32, device=dev)
    for _ in range(5):
        dist.all_reduce(buf)
    torch.cuda.synchronize()
    best = 0.0
    for _ in range(3):
        dist.barrier()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(args.iters):
            dist.all_reduce(buf)
        torch.cuda.synchronize()
        dt = (time.perf_counter() - t0) / args.iters
        best = max(best, 2 * (args.world - 1) / args.world * args.bytes / dt / 1e9)
    res = {"version": torch.__version__, "nccl": nccl_version(torch), "exact": exact,
           "checksum": t.double().sum().item(), "busbw_GBps": round(best, 2), "rank": args.rank}
    hold(args, {"held": torch.cuda.memory_reserved(dev), "gpu": args.rank})
    if not args.reference:
        res["oom"] = torch_oom(args, dev)
    dist.barrier()
    dist.destroy_process_group()
    emit({"result": res})


def w_transformers(args):
    """Greedy generation with a small GPT-2 built locally (random weights, no download)."""
    torch = torch_or_skip()
    try:
        import transformers
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError as e:
        skip("transformers not importable: %s" % e)
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=1000, n_positions=128)
    model = GPT2LMHeadModel(cfg).cuda().eval()
    ids = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]], device="cuda")
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False,
                             pad_token_id=0)
    res = {"version": "transformers %s, torch %s" % (transformers.__version__, torch.__version__),
           "tokens": out[0].tolist()}
    hold(args, {"held": torch.cuda.memory_reserved()})
    if not args.reference:
        res["oom"] = torch_oom(args)
    emit({"result": res})


def _wait_child(pid, seconds):
    """(exit status or None if it had to be killed after `seconds`)."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        time.sleep(0.05)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return None


def _describe(status):
    if status is None:
        return "hung (killed after 30 s)"
    if os.WIFSIGNALED(status):
        return "killed by signal %d" % os.WTERMSIG(status)
    return "exit %d" % os.WEXITSTATUS(status)


def w_fork(args):
    """A process with CUDA initialized under the hook forks: a child not touching CUDA, then a
    child calling the driver (ctypes on libcuda.so.1); the parent keeps allocating."""
    torch = torch_or_skip()
    # 64 MiB tensors: .sum() of uint8 accumulates in int64, a temporary 8 times the tensor's size.
    SIZE = 64 * MiB
    x = torch.ones(SIZE, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    res = {"version": torch.__version__}
    pid = os.fork()
    if pid == 0:
        os._exit(0 if sum(range(1000)) == 499500 else 1)
    res["plain_child"] = _describe(_wait_child(pid, 30))
    y = torch.ones(SIZE, dtype=torch.uint8, device="cuda")
    res["parent_after_plain_child"] = int(y.sum().item()) == SIZE
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        rcs = {}
        try:
            cu = ctypes.CDLL("libcuda.so.1")
            rcs["cuInit"] = cu.cuInit(0)
            devh = ctypes.c_int()
            rcs["cuDeviceGet"] = cu.cuDeviceGet(ctypes.byref(devh), 0)
            ctx = ctypes.c_void_p()
            rcs["cuDevicePrimaryCtxRetain"] = cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), devh)
            rcs["cuCtxSetCurrent"] = cu.cuCtxSetCurrent(ctx)
            ptr = ctypes.c_uint64()
            cu.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
            rcs["cuMemAlloc_v2"] = cu.cuMemAlloc_v2(ctypes.byref(ptr), 64 * MiB)
        except Exception as e:
            rcs["exception"] = repr(e)
        os.write(w, json.dumps(rcs).encode())
        os._exit(0)
    os.close(w)
    status = _wait_child(pid, 30)
    got = b""
    while select.select([r], [], [], 0)[0]:
        chunk = os.read(r, 4096)
        if not chunk:
            break
        got += chunk
    os.close(r)
    res["cuda_child"] = _describe(status)
    res["cuda_child_results"] = json.loads(got) if got else None
    z = torch.ones(SIZE, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    res["parent_after_cuda_child"] = int(z.sum().item()) == SIZE and int(x.sum().item()) == SIZE
    hold(args, {"held": torch.cuda.memory_reserved()})
    if not args.reference:
        res["oom"] = torch_oom(args)
    emit({"result": res})


# ------------------------------------------------------------------------------------------ JAX
def w_jax(args):
    """A few jitted gradient steps of a linear model; memory as XLA's allocator holds it (the
    mode comes from XLA_PYTHON_CLIENT_* in the environment)."""
    try:
        import jax
        import jax.numpy as jnp
    except ImportError as e:
        skip("JAX not importable: %s" % e)
    try:
        gpus = jax.devices("gpu")
    except RuntimeError as e:
        skip("JAX has no GPU backend: %s" % str(e).splitlines()[0])
    key = jax.random.PRNGKey(0)
    w = jax.random.normal(key, (512, 512), dtype=jnp.float32)
    x = jax.random.normal(jax.random.PRNGKey(1), (256, 512), dtype=jnp.float32)

    @jax.jit
    def step(w, x):
        loss, g = jax.value_and_grad(lambda w: jnp.mean((x @ w) ** 2))(w)
        return w - 0.01 * g, loss

    losses = []
    for _ in range(10):
        w, loss = step(w, x)
        losses.append(float(loss))
    extra = jnp.ones((256 * MiB) // 4, dtype=jnp.float32).block_until_ready()
    stats = gpus[0].memory_stats() or {}
    res = {"version": "jax %s" % jax.__version__, "losses": losses,
           "memory_stats": {k: stats.get(k) for k in ("bytes_in_use", "bytes_reserved", "bytes_limit", "pool_bytes")}}
    hold(args, {"held": max(stats.get("pool_bytes") or 0, stats.get("bytes_reserved") or 0, extra.size * 4)})
    if not args.reference:
        try:
            big = jnp.ones((args.limit + GiB) // 4, dtype=jnp.float32).block_until_ready()
            res["oom"] = {"error": None}
            del big
        except Exception as e:
            msg = str(e)
            res["oom"] = {"error": type(e).__name__ + (" RESOURCE_EXHAUSTED" if "RESOURCE_EXHAUSTED" in msg else ""),
                          "message": msg.splitlines()[0][:240] if msg else ""}
        after = jnp.ones((64 * MiB) // 4, dtype=jnp.float32).block_until_ready()
        res["oom"]["after"] = float(after.sum()) == (64 * MiB) // 4
    emit({"result": res})


# ----------------------------------------------------------------------------------------- CuPy
def w_cupy(args):
    """A matrix product through cuBLAS, with CuPy's default memory pool or none (--no-pool)."""
    try:
        import cupy as cp
    except ImportError as e:
        skip("CuPy not importable: %s" % e)
    try:
        cp.cuda.runtime.getDeviceCount()
    except Exception as e:
        skip("CuPy sees no GPU: %s" % e)
    if args.no_pool:
        cp.cuda.set_allocator(None)
    rs = cp.random.RandomState(0)
    a = rs.standard_normal((1024, 1024), dtype=cp.float32)
    b = rs.standard_normal((1024, 1024), dtype=cp.float32)
    c = a @ b
    extra = cp.ones((256 * MiB) // 4, dtype=cp.float32)
    cp.cuda.Device().synchronize()
    pool = cp.get_default_memory_pool()
    res = {"version": "cupy %s" % cp.__version__, "checksum": float(c.astype(cp.float64).sum()),
           "pool_total": pool.total_bytes(), "allocator": "none" if args.no_pool else "pool"}
    hold(args, {"held": max(pool.total_bytes(), extra.nbytes)})
    if not args.reference:
        try:
            big = cp.empty(args.limit + GiB, dtype=cp.uint8)
            cp.cuda.Device().synchronize()
            res["oom"] = {"error": None}
            del big
        except Exception as e:
            name = type(e).__module__.split(".")[0] + "." + type(e).__name__
            res["oom"] = {"error": name, "message": str(e).splitlines()[0][:240]}
        after = cp.ones(64 * MiB, dtype=cp.uint8)
        res["oom"]["after"] = int(after.sum()) == 64 * MiB
    emit({"result": res})


# ----------------------------------------------------------------- the driver API through ctypes
class _Loc(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class _AllocProp(ctypes.Structure):  # CUmemAllocationProp
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", _Loc),
                ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", _AllocFlags)]


class _PoolProps(ctypes.Structure):  # CUmemPoolProps
    _fields_ = [("allocType", ctypes.c_int), ("handleTypes", ctypes.c_int), ("location", _Loc),
                ("win32SecurityAttributes", ctypes.c_void_p), ("maxSize", ctypes.c_size_t),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 54)]


class _AllocNodeParams(ctypes.Structure):  # CUDA_MEM_ALLOC_NODE_PARAMS_v1
    _fields_ = [("poolProps", _PoolProps), ("accessDescs", ctypes.c_void_p), ("accessDescCount", ctypes.c_size_t),
                ("bytesize", ctypes.c_size_t), ("dptr", ctypes.c_uint64)]


# Layouts of cuda.h (CUDA 13), checked here so a wrong layout fails loudly instead of passing garbage.
assert ctypes.sizeof(_AllocProp) == 32 and ctypes.sizeof(_PoolProps) == 88 and ctypes.sizeof(_AllocNodeParams) == 120

PINNED, LOC_DEVICE, HANDLE_POSIX_FD = 1, 1, 1
ATTR_RDMA_WITH_VMM, ATTR_MEMORY_POOLS = 110, 115  # CU_DEVICE_ATTRIBUTE_*
RELEASE_THRESHOLD, RESERVED_MEM_CURRENT = 4, 5
P = ctypes.c_void_p
U64 = ctypes.c_uint64
PU64 = ctypes.POINTER(ctypes.c_uint64)


def driver():
    try:
        cu = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        skip("libcuda.so.1 not loadable: %s" % e)
    sig = {
        "cuInit": [ctypes.c_uint], "cuDeviceGet": [ctypes.POINTER(ctypes.c_int), ctypes.c_int],
        "cuDevicePrimaryCtxRetain": [ctypes.POINTER(P), ctypes.c_int], "cuCtxSetCurrent": [P],
        "cuMemCreate": [PU64, ctypes.c_size_t, ctypes.POINTER(_AllocProp), U64], "cuMemRelease": [U64],
        "cuMemPoolCreate": [ctypes.POINTER(P), ctypes.POINTER(_PoolProps)], "cuMemPoolDestroy": [P],
        "cuMemPoolSetAttribute": [P, ctypes.c_int, P], "cuMemPoolGetAttribute": [P, ctypes.c_int, P],
        "cuMemPoolTrimTo": [P, ctypes.c_size_t], "cuDeviceGetDefaultMemPool": [ctypes.POINTER(P), ctypes.c_int],
        "cuMemAllocFromPoolAsync": [PU64, ctypes.c_size_t, P, P], "cuMemAllocAsync": [PU64, ctypes.c_size_t, P],
        "cuMemFreeAsync": [U64, P], "cuStreamSynchronize": [P], "cuCtxSynchronize": [],
        "cuGraphCreate": [ctypes.POINTER(P), ctypes.c_uint], "cuGraphDestroy": [P],
        "cuGraphAddMemAllocNode": [ctypes.POINTER(P), P, P, ctypes.c_size_t, ctypes.POINTER(_AllocNodeParams)],
        "cuGraphInstantiateWithFlags": [ctypes.POINTER(P), P, ctypes.c_ulonglong], "cuGraphExecDestroy": [P],
        "cuGraphLaunch": [P, P], "cuDeviceGraphMemTrim": [ctypes.c_int],
        "cuMemGetInfo_v2": [ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)],
        "cuDeviceGetAttribute": [ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_int],
    }
    for name, argtypes in sig.items():
        try:
            f = getattr(cu, name)
        except AttributeError:  # a driver without it: calling it fails loudly with the name
            continue
        f.argtypes = argtypes
        f.restype = ctypes.c_int
    return cu


def ctx_on(cu, ordinal=0):
    dev = ctypes.c_int()
    ctx = P()
    for rc, what in ((cu.cuInit(0), "cuInit"), (cu.cuDeviceGet(ctypes.byref(dev), ordinal), "cuDeviceGet"),
                     (cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain"),
                     (cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")):
        if rc != 0:
            skip("%s returned %d" % (what, rc))
    return dev.value


def attribute(cu, attr, dev):
    v = ctypes.c_int(0)
    return v.value if cu.cuDeviceGetAttribute(ctypes.byref(v), attr, dev) == 0 else 0


def w_bypass_rdma(args):
    """cuMemCreate with gpuDirectRDMACapable (where the device supports it) and POSIX-fd export
    (what NCCL creates) in 256 MiB handles until refused."""
    cu = driver()
    dev = ctx_on(cu)
    prop = _AllocProp()
    prop.type, prop.requestedHandleTypes = PINNED, HANDLE_POSIX_FD
    prop.location.type, prop.location.id = LOC_DEVICE, dev
    rdma = attribute(cu, ATTR_RDMA_WITH_VMM, dev)
    prop.allocFlags.gpuDirectRDMACapable = 1 if rdma else 0
    handles, rc = [], 0
    while sum(s for _, s in handles) <= args.limit + GiB:
        h = U64()
        rc = cu.cuMemCreate(ctypes.byref(h), 256 * MiB, ctypes.byref(prop), 0)
        if rc != 0:
            break
        handles.append((h.value, 256 * MiB))
    created = sum(s for _, s in handles)
    hold(args, {"held": created})
    for h, _ in handles:
        cu.cuMemRelease(h)
    emit({"result": {"version": "driver API (ctypes)", "created": created, "refused_rc": rc, "rdma_flag": bool(rdma)}})


def _pool_fill(cu, alloc, limit):
    ptrs, rc = [], 0
    while len(ptrs) * 256 * MiB <= limit + GiB:
        p = U64()
        rc = alloc(ctypes.byref(p), 256 * MiB)
        if rc == 0:
            rc = cu.cuStreamSynchronize(None)
        if rc != 0:
            break
        ptrs.append(p.value)
    return ptrs, rc


def w_bypass_pool(args):
    """Stream-ordered allocation until refused, from a pool of its own (cuMemPoolCreate +
    cuMemAllocFromPoolAsync) or the device's default pool (cuMemAllocAsync); the pool keeps
    everything freed (release threshold: all), then is trimmed."""
    cu = driver()
    dev = ctx_on(cu)
    if not attribute(cu, ATTR_MEMORY_POOLS, dev):
        skip("CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED is 0 on this device")
    pool = P()
    if args.default_pool:
        rc = cu.cuDeviceGetDefaultMemPool(ctypes.byref(pool), dev)
        alloc = lambda p, n: cu.cuMemAllocAsync(p, n, None)  # noqa: E731
    else:
        props = _PoolProps()
        props.allocType, props.location.type, props.location.id = PINNED, LOC_DEVICE, dev
        rc = cu.cuMemPoolCreate(ctypes.byref(pool), ctypes.byref(props))
        alloc = lambda p, n: cu.cuMemAllocFromPoolAsync(p, n, pool, None)  # noqa: E731
    if rc != 0:
        emit({"result": {"version": "driver API (ctypes)", "error": "pool: rc %d" % rc}})
        return
    keep = U64(0xFFFFFFFFFFFFFFFF)
    cu.cuMemPoolSetAttribute(pool, RELEASE_THRESHOLD, ctypes.byref(keep))
    ptrs, refused = _pool_fill(cu, alloc, args.limit)
    allocated = len(ptrs) * 256 * MiB
    reserved = U64()
    cu.cuMemPoolGetAttribute(pool, RESERVED_MEM_CURRENT, ctypes.byref(reserved))
    hold(args, {"held": allocated, "stage": "allocated"})
    for p in ptrs:
        cu.cuMemFreeAsync(p, None)
    cu.cuStreamSynchronize(None)
    kept = U64()
    cu.cuMemPoolGetAttribute(pool, RESERVED_MEM_CURRENT, ctypes.byref(kept))
    # The pool keeps what was freed: a plain allocation near the limit must still be accounted.
    hold(args, {"held": kept.value, "stage": "freed, kept by the pool"})
    # Refill from the kept memory: must not need new grants beyond the limit either.
    again, refused_again = _pool_fill(cu, alloc, args.limit)
    for p in again:
        cu.cuMemFreeAsync(p, None)
    cu.cuStreamSynchronize(None)
    cu.cuMemPoolTrimTo(pool, 0)
    if not args.default_pool:
        cu.cuMemPoolDestroy(pool)
    emit({"result": {"version": "driver API (ctypes)", "allocated": allocated, "refused_rc": refused,
                     "reserved": reserved.value, "kept_after_free": kept.value,
                     "refilled": len(again) * 256 * MiB, "refused_again_rc": refused_again}})


def _graph_alloc(cu, dev, size):
    """Builds, instantiates and launches a graph with one memory allocation node of `size`
    (no free node: the memory outlives the launch). (stage, rc, dptr)."""
    graph, node, exe = P(), P(), P()
    rc = cu.cuGraphCreate(ctypes.byref(graph), 0)
    if rc:
        return "cuGraphCreate", rc, 0
    params = _AllocNodeParams()
    params.poolProps.allocType, params.poolProps.location.type, params.poolProps.location.id = PINNED, LOC_DEVICE, dev
    params.bytesize = size
    try:
        rc = cu.cuGraphAddMemAllocNode(ctypes.byref(node), graph, None, 0, ctypes.byref(params))
        if rc:
            return "cuGraphAddMemAllocNode", rc, 0
        rc = cu.cuGraphInstantiateWithFlags(ctypes.byref(exe), graph, 0)
        if rc:
            return "cuGraphInstantiateWithFlags", rc, 0
        rc = cu.cuGraphLaunch(exe, None)
        if rc == 0:
            rc = cu.cuStreamSynchronize(None)
        cu.cuGraphExecDestroy(exe)
        return ("cuGraphLaunch", rc, 0) if rc else ("launched", 0, params.dptr)
    finally:
        cu.cuGraphDestroy(graph)


def w_bypass_graph(args):
    """Graph memory nodes: one of 512 MiB (must work and be charged), then one of --limit +
    1 GiB (must be refused with CUDA_ERROR_OUT_OF_MEMORY at instantiate or launch)."""
    cu = driver()
    dev = ctx_on(cu)
    stage, rc, ptr = _graph_alloc(cu, dev, 512 * MiB)
    small = {"stage": stage, "rc": rc}
    hold(args, {"held": 512 * MiB if rc == 0 else 0, "stage": "512 MiB graph allocation live"})
    if ptr:
        cu.cuMemFreeAsync(ptr, None)
        cu.cuStreamSynchronize(None)
    cu.cuDeviceGraphMemTrim(dev)
    stage, rc, ptr = _graph_alloc(cu, dev, args.limit + GiB)
    big = {"stage": stage, "rc": rc}
    hold(args, {"held": 0, "stage": "after the over-limit graph"})
    if ptr:
        cu.cuMemFreeAsync(ptr, None)
        cu.cuStreamSynchronize(None)
    cu.cuDeviceGraphMemTrim(dev)
    emit({"result": {"version": "driver API (ctypes)", "small": small, "big": big}})


WORKLOADS = {
    "train": w_train, "graphs": w_graphs, "mp_ipc": w_mp_ipc, "dataloader": w_dataloader, "nccl": w_nccl,
    "transformers": w_transformers, "fork": w_fork, "jax": w_jax, "cupy": w_cupy,
    "bypass_rdma": w_bypass_rdma, "bypass_pool": w_bypass_pool, "bypass_graph": w_bypass_graph,
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("workload", choices=sorted(WORKLOADS))
    ap.add_argument("--reference", action="store_true")
    ap.add_argument("--limit", type=int, default=4 * GiB)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--no-pool", action="store_true")
    ap.add_argument("--default-pool", action="store_true")
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--port", type=int, default=29500)
    ap.add_argument("--bytes", type=int, default=256 * MiB)
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    WORKLOADS[args.workload](args)


if __name__ == "__main__":
    main()
