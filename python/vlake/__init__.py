"""vlake: share read-only GPU memory (model weights) across processes (docs/dedup.md).

No build step: the functions live in libvlake-hook.so, which is preloaded into the process
(LD_PRELOAD or /etc/ld.so.preload); this module finds them with ctypes.

    import torch, vlake
    model = load_my_model().cuda().eval()
    stats = vlake.share_module(model)     # every parameter and buffer, packed and shared
    print(stats)                          # {'bytes': ..., 'shared_bytes': ..., 'merged_bytes': ...}

After share_module() the module's weights are read-only: a kernel that writes them faults
(CUDA_ERROR_ILLEGAL_ADDRESS, which ends this process's CUDA context), a copy into them fails.
Use it for inference weights that never change. Processes that load the same weights (same
architecture, dtype and values) get them stored once per GPU.
"""
import ctypes

__all__ = ["VlakeError", "available", "chunk_bytes", "share_readonly", "share_tensor", "share_module"]

OK, NOT_VLAKE, INVALID, UNREACHABLE, REFUSED, NO_MEMORY, DRIVER, FAULTED, INTERNAL = range(9)


class VlakeError(RuntimeError):
    """vlake_share_readonly failed (status in .status), or the hook is not loaded."""

    def __init__(self, message, status=None):
        super().__init__(message)
        self.status = status


class _Result(ctypes.Structure):
    _fields_ = [("chunk_bytes", ctypes.c_uint64), ("shared_bytes", ctypes.c_uint64),
                ("merged_bytes", ctypes.c_uint64), ("copied_bytes", ctypes.c_uint64)]


_lib = None


def _hook():
    global _lib
    if _lib is not None:
        return _lib
    lib = ctypes.CDLL(None)  # the process's global scope: the preloaded hook, if any
    try:
        fn = lib.vlake_share_readonly_ex
    except AttributeError:
        raise VlakeError("libvlake-hook.so is not loaded in this process (start it with "
                         "LD_PRELOAD=/usr/lib/vlake/libvlake-hook.so)") from None
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(_Result)]
    lib.vlake_share_chunk_bytes.restype = ctypes.c_size_t
    lib.vlake_share_chunk_bytes.argtypes = []
    lib.vlake_share_strerror.restype = ctypes.c_char_p
    lib.vlake_share_strerror.argtypes = [ctypes.c_int]
    _lib = lib
    return lib


def available():
    """True if the hook is loaded (vlake_share_readonly can be called)."""
    try:
        _hook()
        return True
    except VlakeError:
        return False


def chunk_bytes():
    """The chunk size of the current CUDA context's GPU (2 MiB on current GPUs), 0 without one."""
    return int(_hook().vlake_share_chunk_bytes())


def share_readonly(ptr, nbytes):
    """Shares the whole chunks of [ptr, ptr + nbytes) (device addresses, one allocation).
    Returns a dict of byte counts; raises VlakeError."""
    lib = _hook()
    r = _Result()
    rc = lib.vlake_share_readonly_ex(ctypes.c_void_p(int(ptr)), ctypes.c_size_t(int(nbytes)), ctypes.byref(r))
    if rc != OK:
        raise VlakeError("vlake_share_readonly: " + lib.vlake_share_strerror(rc).decode(), rc)
    return {"chunk_bytes": r.chunk_bytes, "shared_bytes": r.shared_bytes, "merged_bytes": r.merged_bytes,
            "copied_bytes": r.copied_bytes}


def share_tensor(t):
    """Shares the whole chunks a CUDA tensor covers. Only those chunks are shared: place the
    tensor chunk-aligned (see share_module) for it to match other processes' copies."""
    import torch
    if not t.is_cuda:
        raise VlakeError("share_tensor needs a CUDA tensor")
    torch.cuda.synchronize(t.device)
    return share_readonly(t.data_ptr(), t.numel() * t.element_size())


def _round_up(v, a):
    return (v + a - 1) // a * a


def share_module(module, buffers=True, align=512):
    """Packs `module`'s CUDA parameters (and buffers) into one flat buffer per (device, dtype),
    in a deterministic order (sorted names, each tensor at a multiple of `align` bytes, the
    buffer starting on a chunk boundary and padded with zeros to whole chunks), points them at
    views of it, and shares the buffer read-only. Two processes holding equal weights therefore
    hold equal chunks. Returns {'bytes', 'shared_bytes', 'merged_bytes', 'copied_bytes',
    'buffers'}. Tied parameters stay tied. Raises VlakeError (the module is then unchanged or
    packed but private)."""
    import torch
    _hook()
    entries = []  # (name, owner module, attribute, tensor, is_param)
    seen = set()
    for mname, m in module.named_modules():
        for pname, p in list(m._parameters.items()):
            if p is not None and p.is_cuda and id(p) not in seen:
                seen.add(id(p))
                entries.append((mname + "." + pname, m, pname, p, True))
        if buffers:
            for bname, b in list(m._buffers.items()):
                if b is not None and b.is_cuda and id(b) not in seen:
                    seen.add(id(b))
                    entries.append((mname + "." + bname, m, bname, b, False))
    groups = {}
    for e in sorted(entries, key=lambda e: e[0]):
        groups.setdefault((e[3].device, e[3].dtype), []).append(e)
    stats = {"bytes": 0, "shared_bytes": 0, "merged_bytes": 0, "copied_bytes": 0, "buffers": 0}
    keep = []
    for (device, dtype), items in sorted(groups.items(), key=lambda kv: (str(kv[0][0]), str(kv[0][1]))):
        with torch.cuda.device(device):
            g = chunk_bytes()
            if g == 0:
                raise VlakeError("no CUDA context on " + str(device))
            offsets, total = [], 0
            for e in items:
                total = _round_up(total, align)
                offsets.append(total)
                total += e[3].numel() * e[3].element_size()
            padded = _round_up(total, g)
            raw = torch.zeros(padded + g, dtype=torch.uint8, device=device)
            start = (-raw.data_ptr()) % g  # the first chunk boundary inside the allocation
            flat = raw[start:start + padded]
            with torch.no_grad():
                for e, off in zip(items, offsets):
                    t = e[3]
                    nbytes = t.numel() * t.element_size()
                    view = flat[off:off + nbytes].view(t.dtype).view(t.shape)
                    view.copy_(t)
                    if e[4]:
                        t.data = view
                    else:
                        e[1]._buffers[e[2]] = view
            torch.cuda.synchronize(device)
            r = share_readonly(flat.data_ptr(), padded)
            keep.append(raw)
            stats["bytes"] += padded
            for k in ("shared_bytes", "merged_bytes", "copied_bytes"):
                stats[k] += r[k]
            stats["buffers"] += 1
    # The flat buffers live as long as the views that point into them.
    module._vlake_shared = keep
    return stats
