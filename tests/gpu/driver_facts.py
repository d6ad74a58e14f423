#!/usr/bin/env python3
"""Measures driver answers that the simulator and docs/driver.md rely on for IPC, peer access
and graph memory (no hook, no daemon): one "fact: value" line each. Run on a GPU machine:

  python3 tests/gpu/driver_facts.py

Each line names the call and the code (or figure) the driver gave; docs/driver.md records them.
"""
import ctypes
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compat_work as cw  # noqa: E402  (driver(), ctx_on(), the cuda.h structures)

MiB = 1 << 20
P, U64 = ctypes.c_void_p, ctypes.c_uint64


class _Access(ctypes.Structure):  # CUmemAccessDesc
    _fields_ = [("location", cw._Loc), ("flags", ctypes.c_int)]


class _IpcHandle(ctypes.Structure):  # CUipcMemHandle
    _fields_ = [("reserved", ctypes.c_char * 64)]


def main():
    cu = cw.driver()
    dev = cw.ctx_on(cu)
    for name, args in {
        "cuMemAddressReserve": [ctypes.POINTER(U64), ctypes.c_size_t, ctypes.c_size_t, U64, U64],
        "cuMemMap": [U64, ctypes.c_size_t, ctypes.c_size_t, U64, U64],
        "cuMemSetAccess": [U64, ctypes.c_size_t, ctypes.POINTER(_Access), ctypes.c_size_t],
        "cuIpcGetMemHandle": [ctypes.POINTER(_IpcHandle), U64],
        "cuIpcOpenMemHandle_v2": [ctypes.POINTER(U64), _IpcHandle, ctypes.c_uint],
        "cuIpcCloseMemHandle": [U64],
        "cuMemAlloc_v2": [ctypes.POINTER(U64), ctypes.c_size_t],
        "cuMemAlloc": [ctypes.POINTER(ctypes.c_uint32), ctypes.c_uint],
        "cuCtxEnablePeerAccess": [P, ctypes.c_uint], "cuCtxGetCurrent": [ctypes.POINTER(P)],
        "cuDeviceGetGraphMemAttribute": [ctypes.c_int, ctypes.c_int, P],
    }.items():
        f = getattr(cu, name)
        f.argtypes, f.restype = args, ctypes.c_int

    def fact(name, value):
        print("fact: %s: %s" % (name, value), flush=True)

    # A VMM range, as the hook serves it.
    prop = cw._AllocProp()
    prop.type, prop.requestedHandleTypes = cw.PINNED, cw.HANDLE_POSIX_FD
    prop.location.type, prop.location.id = cw.LOC_DEVICE, dev
    h, va = U64(), U64()
    rc = cu.cuMemCreate(ctypes.byref(h), 2 * MiB, ctypes.byref(prop), 0)
    rc = rc or cu.cuMemAddressReserve(ctypes.byref(va), 2 * MiB, 0, 0, 0)
    rc = rc or cu.cuMemMap(va, 2 * MiB, 0, h, 0)
    acc = _Access()
    acc.location.type, acc.location.id, acc.flags = cw.LOC_DEVICE, dev, 3
    rc = rc or cu.cuMemSetAccess(va, 2 * MiB, ctypes.byref(acc), 1)
    fact("VMM range set up", rc)
    ipc = _IpcHandle()
    fact("cuIpcGetMemHandle(VMM memory)", cu.cuIpcGetMemHandle(ctypes.byref(ipc), va))
    fact("cuIpcGetMemHandle(unknown pointer 0x1000)", cu.cuIpcGetMemHandle(ctypes.byref(ipc), U64(0x1000)))
    acc.flags = 0  # CU_MEM_ACCESS_FLAGS_PROT_NONE
    fact("cuMemSetAccess(PROT_NONE for the owning device)", cu.cuMemSetAccess(va, 2 * MiB, ctypes.byref(acc), 1))

    # Classic memory: a handle, then opening it in the same process.
    p = U64()
    fact("cuMemAlloc_v2(2 MiB)", cu.cuMemAlloc_v2(ctypes.byref(p), 2 * MiB))
    fact("cuIpcGetMemHandle(cuMemAlloc memory)", cu.cuIpcGetMemHandle(ctypes.byref(ipc), p))
    q = U64()
    fact("cuIpcOpenMemHandle_v2(own handle, same process)", cu.cuIpcOpenMemHandle_v2(ctypes.byref(q), ipc, 1))
    junk = _IpcHandle()
    ctypes.memmove(junk.reserved, b"\x5a" * 64, 64)
    fact("cuIpcOpenMemHandle_v2(64 garbage bytes)", cu.cuIpcOpenMemHandle_v2(ctypes.byref(q), junk, 1))
    fact("cuIpcCloseMemHandle(pointer never opened)", cu.cuIpcCloseMemHandle(p))
    small = ctypes.c_uint32()
    fact("cuMemAlloc (pre-3.2 ABI, 2 MiB)", cu.cuMemAlloc(ctypes.byref(small), 2 * MiB))

    ctx = P()
    cu.cuCtxGetCurrent(ctypes.byref(ctx))
    fact("cuCtxEnablePeerAccess(own context)", cu.cuCtxEnablePeerAccess(ctx, 0))

    # Graph memory: reserved right after the launch (no synchronization), then after it.
    graph, node, exe = P(), P(), P()
    params = cw._AllocNodeParams()
    params.poolProps.allocType, params.poolProps.location.type, params.poolProps.location.id = (
        cw.PINNED, cw.LOC_DEVICE, dev)
    params.bytesize = 256 * MiB
    rc = cu.cuGraphCreate(ctypes.byref(graph), 0)
    rc = rc or cu.cuGraphAddMemAllocNode(ctypes.byref(node), graph, None, 0, ctypes.byref(params))
    rc = rc or cu.cuGraphInstantiateWithFlags(ctypes.byref(exe), graph, 0)
    reserved = U64()
    cu.cuDeviceGetGraphMemAttribute(dev, 2, ctypes.byref(reserved))  # CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT
    fact("graph reserved after instantiate (bytes)", reserved.value)
    rc = rc or cu.cuGraphLaunch(exe, None)
    cu.cuDeviceGetGraphMemAttribute(dev, 2, ctypes.byref(reserved))
    fact("graph launch rc / reserved right after launch, no sync (bytes)", "%d / %d" % (rc, reserved.value))
    cu.cuCtxSynchronize()
    cu.cuDeviceGetGraphMemAttribute(dev, 2, ctypes.byref(reserved))
    fact("graph reserved after sync (bytes)", reserved.value)
    relaunch = cu.cuGraphLaunch(exe, None)
    fact("second launch of an exec whose allocation was not freed", relaunch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
