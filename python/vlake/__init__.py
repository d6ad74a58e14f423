"""vlake: share read-only GPU memory (model weights) across processes (docs/dedup.md).

No build step: the functions live in libvlake-hook.so, which is preloaded into the process
(LD_PRELOAD or /etc/ld.so.preload); this module finds them with ctypes.

    import torch, vlake
    model = load_my_model().cuda().eval()
    stats = vlake.share_module(model)     # every parameter and buffer, packed and shared
    torch.cuda.empty_cache()              # the unpacked originals go back
    print(stats)                          # {'bytes': ..., 'shared_bytes': ..., 'merged_bytes': ...}

After share_module() the module's weights are read-only: a kernel that writes them faults
(CUDA_ERROR_ILLEGAL_ADDRESS, which ends this process's CUDA context), a copy into them fails.
Use it for inference weights that never change. Processes that load the same weights (same
architecture, dtype and values) get them stored once per GPU.
"""
import atexit
import ctypes
import importlib
import sys
import threading
import traceback
import weakref

__all__ = ["VlakeError", "available", "chunk_bytes", "device_buffer", "share_readonly", "share_tensor",
           "share_module", "enable_reclaim", "disable_reclaim", "reclaim_count"]

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
    try:
        lib.vlake_reclaim_register.restype = ctypes.c_int
        lib.vlake_reclaim_register.argtypes = [_RECLAIM_FN, ctypes.c_void_p]
        lib.vlake_reclaim_unregister.restype = ctypes.c_int
        lib.vlake_reclaim_unregister.argtypes = [_RECLAIM_FN, ctypes.c_void_p]
        lib.vlake_reclaim_count.restype = ctypes.c_uint64
        lib.vlake_reclaim_count.argtypes = []
    except AttributeError:
        raise VlakeError("this libvlake-hook.so has no reclaim functions (an older hook)") from None
    _lib = lib
    return lib


# Reclaim (docs/hook.md, "Reclaim"): frameworks give their cached GPU memory back when vlaked
# asks. fn(device, bytes) runs on the hook's own thread ("vlake-reclaim"), holding the GIL.
_RECLAIM_FN = ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64)
_RECLAIM_STATUS = {1: "the hook passes everything through in this process (VLAKE_DISABLE)",
                   2: "invalid callback", 3: "too many reclaim callbacks (8)", 4: "the hook could not start its thread"}
_reclaimers = {}  # handle -> ctypes callback (kept alive while registered)
_reclaim_lock = threading.Lock()


def enable_reclaim(fn):
    """Registers fn(device, nbytes) to free cached GPU memory when vlaked asks: `device` is the CUDA
    device ordinal in this process, `nbytes` what the node is short of (freeing more is fine). fn
    returns the bytes it freed, or None. It runs on the hook's background thread; an exception
    it raises is printed and ignored. Returns a handle for disable_reclaim(). Raises VlakeError
    without the hook. Registrations end at interpreter exit."""
    lib = _hook()

    def trampoline(_ctx, device, nbytes):
        try:
            return max(0, int(fn(int(device), int(nbytes)) or 0))
        except BaseException:  # never into the hook's thread
            traceback.print_exc(file=sys.stderr)
            return 0

    cb = _RECLAIM_FN(trampoline)
    rc = lib.vlake_reclaim_register(cb, None)
    if rc != 0:
        raise VlakeError("vlake_reclaim_register failed: " + _RECLAIM_STATUS.get(rc, "status %d" % rc), rc)
    with _reclaim_lock:
        handle = ctypes.cast(cb, ctypes.c_void_p).value
        _reclaimers[handle] = cb
    return handle


def disable_reclaim(handle):
    """Unregisters a callback enable_reclaim() returned; waits for a run of it in progress."""
    with _reclaim_lock:
        cb = _reclaimers.pop(handle, None)
    if cb is not None:
        _hook().vlake_reclaim_unregister(cb, None)


def reclaim_count():
    """How many times vlaked made this process run its reclaim callbacks."""
    return int(_hook().vlake_reclaim_count())


class _FrameworkReclaim:
    """One registration of a framework's cache-emptying callback (vlake.torch, vlake.cupy)."""

    def __init__(self, fn):
        self._fn, self._handle = fn, None

    def enable(self):
        if self._handle is None:
            self._handle = enable_reclaim(self._fn)
        return self._handle

    def disable(self):
        if self._handle is not None:
            disable_reclaim(self._handle)
            self._handle = None


@atexit.register
def _disable_all_reclaim():
    for handle in list(_reclaimers):
        try:
            disable_reclaim(handle)
        except Exception:
            pass


def __getattr__(name):
    # vlake.torch / vlake.cupy: framework helpers, imported on first use (they import the framework).
    if name in ("torch", "cupy"):
        return importlib.import_module("vlake." + name)
    raise AttributeError("module 'vlake' has no attribute %r" % name)


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


class _DeviceMemory:
    """One allocation made with the driver's cuMemAlloc_v2 as the preloaded hook exports it, so
    vlake's pool serves it whatever allocator PyTorch uses (caching blocks or expandable
    segments). It exposes `__cuda_array_interface__` (uint8, `nbytes` long) for torch.as_tensor,
    whose tensor keeps this object alive as long as any view of it; the allocation is freed
    (cuMemFree_v2, after synchronizing its device) when the last reference goes, and never at
    interpreter exit (the daemon takes it back when the process ends)."""

    def __init__(self, nbytes, device_index):
        lib = _hook()
        try:
            alloc, free = lib.cuMemAlloc_v2, lib.cuMemFree_v2
        except AttributeError:
            raise VlakeError("the loaded libvlake-hook.so exports no cuMemAlloc_v2") from None
        alloc.restype = free.restype = ctypes.c_int
        alloc.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
        free.argtypes = [ctypes.c_uint64]
        p = ctypes.c_uint64(0)
        rc = alloc(ctypes.byref(p), ctypes.c_size_t(int(nbytes)))
        if rc != 0:
            raise VlakeError("cuMemAlloc_v2 of %d bytes on cuda:%d failed (CUresult %d%s)"
                             % (nbytes, device_index, rc, ", out of memory" if rc == 2 else ""), NO_MEMORY)
        self.ptr = p.value
        self.nbytes = int(nbytes)
        self.device_index = device_index
        self._finalizer = weakref.finalize(self, _DeviceMemory._free, free, self.ptr, device_index)
        self._finalizer.atexit = False

    @staticmethod
    def _free(free, ptr, device_index):
        try:
            import torch
            torch.cuda.synchronize(device_index)  # no kernel may still read it (cuMemFree's fence)
        except Exception:
            pass
        return free(ptr)

    def release(self):
        """Frees the allocation now (only when no tensor views it); returns cuMemFree_v2's
        CUresult (None if it was freed already)."""
        return self._finalizer()

    @property
    def __cuda_array_interface__(self):
        return {"shape": (self.nbytes,), "typestr": "|u1", "data": (self.ptr, False), "version": 2}


def device_buffer(nbytes, device=None, align=None):
    """A uint8 CUDA tensor of `nbytes` in its own allocation made through cuMemAlloc_v2 (served
    from vlake's pool, whatever PYTORCH_CUDA_ALLOC_CONF says), starting at a multiple of `align`
    bytes (default: the chunk size). The allocation lives as long as any view of the tensor.
    Raises VlakeError without the hook, without a CUDA context or without memory."""
    _hook()
    import torch
    device = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    if device.type != "cuda":
        raise VlakeError("device_buffer needs a CUDA device, not " + str(device))
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    with torch.cuda.device(device):
        torch.cuda.synchronize(device)  # makes the device's primary context current on this thread
        g = chunk_bytes()
        if g == 0:
            raise VlakeError("no CUDA context on " + str(device))
        align = g if align is None else int(align)
        mem = _DeviceMemory(nbytes, device.index)
        start = (-mem.ptr) % align
        if start:  # guard fault mode right-aligns allocations (docs/guard.md): ask for room to align
            mem.release()
            mem = _DeviceMemory(nbytes + align, device.index)
            start = (-mem.ptr) % align
        ptr = mem.ptr
        try:
            raw = torch.as_tensor(mem, device=device)
        except Exception as e:
            mem.release()
            raise VlakeError("cannot wrap the allocation as a tensor: %s" % e) from e
        del mem  # from here on the tensor's storage holds it
        if raw.data_ptr() != ptr or raw.device != device or raw.dtype != torch.uint8:
            raise VlakeError("torch.as_tensor did not alias the allocation (0x%x on %s as %s, expected 0x%x on %s)"
                             % (raw.data_ptr(), raw.device, raw.dtype, ptr, device))
        return raw[start:start + nbytes]


def _round_up(v, a):
    return (v + a - 1) // a * a


def share_module(module, buffers=True, align=512):
    """Packs `module`'s CUDA parameters (and buffers) into one flat buffer per (device, dtype),
    in a deterministic order (sorted names, each tensor at a multiple of `align` bytes, the
    buffer starting on a chunk boundary and padded with zeros to whole chunks), points them at
    views of it, and shares the buffer read-only. The flat buffer is an allocation of its own,
    made through the driver (device_buffer: served from vlake's pool with PyTorch's caching
    allocator and with expandable segments alike). Two processes holding equal weights
    therefore hold equal chunks. Returns {'bytes', 'shared_bytes', 'merged_bytes',
    'copied_bytes', 'buffers'}. Tied parameters stay tied. Raises VlakeError (the module is
    then unchanged or packed but private). The unpacked originals go back to PyTorch's
    allocator: torch.cuda.empty_cache() returns them."""
    _hook()
    import torch
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
    keep = list(getattr(module, "_vlake_shared", []))
    for (device, dtype), items in sorted(groups.items(), key=lambda kv: (str(kv[0][0]), str(kv[0][1]))):
        with torch.cuda.device(device):
            offsets, total = [], 0
            for e in items:
                total = _round_up(total, align)
                offsets.append(total)
                total += e[3].numel() * e[3].element_size()
            torch.cuda.synchronize(device)  # the device's context is current from here on
            g = chunk_bytes()
            if g == 0:
                raise VlakeError("no CUDA context on " + str(device))
            padded = _round_up(total, g)
            flat = device_buffer(padded, device)
            with torch.no_grad():
                flat.zero_()  # the gaps and the padding: equal in every process
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
            keep.append(flat)
            # The flat buffers live as long as the views that point into them (and the module).
            module._vlake_shared = keep
            r = share_readonly(flat.data_ptr(), padded)
            stats["bytes"] += padded
            for k in ("shared_bytes", "merged_bytes", "copied_bytes"):
                stats[k] += r[k]
            stats["buffers"] += 1
    return stats
