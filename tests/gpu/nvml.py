"""Minimal NVML access through ctypes (no pynvml needed): device memory and per-process usage."""
import ctypes


class _Mem2(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("total", ctypes.c_ulonglong),
                ("reserved", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                ("used", ctypes.c_ulonglong)]


class _Proc(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
                ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]


class Nvml:
    def __init__(self, index=0, library="libnvidia-ml.so.1"):
        self.lib = ctypes.CDLL(library)
        if self.lib.nvmlInit_v2() != 0:
            raise RuntimeError("nvmlInit_v2 failed")
        self.dev = ctypes.c_void_p()
        if self.lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(self.dev)) != 0:
            raise RuntimeError("no NVML device %d" % index)

    def memory(self):
        m = _Mem2()
        m.version = ctypes.sizeof(_Mem2) | (2 << 24)
        rc = self.lib.nvmlDeviceGetMemoryInfo_v2(self.dev, ctypes.byref(m))
        if rc != 0:
            raise RuntimeError("nvmlDeviceGetMemoryInfo_v2: %d" % rc)
        return {"total": m.total, "reserved": m.reserved, "free": m.free, "used": m.used}

    def processes(self):
        n = ctypes.c_uint(64)
        arr = (_Proc * 64)()
        rc = self.lib.nvmlDeviceGetComputeRunningProcesses_v3(self.dev, ctypes.byref(n), arr)
        if rc != 0:
            raise RuntimeError("nvmlDeviceGetComputeRunningProcesses_v3: %d" % rc)
        return {arr[i].pid: arr[i].usedGpuMemory for i in range(n.value)}

    def uuid(self):
        buf = ctypes.create_string_buffer(96)
        self.lib.nvmlDeviceGetUUID(self.dev, buf, 96)
        return buf.value.decode()
