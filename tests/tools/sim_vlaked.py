"""vlaked on the simulated driver for the Python tests of tests/tools (label sim).

    with SimVlaked(args, "pytest", "version: 1\\n...", ("--sample-interval-ms", "200")) as d:
        env = d.tenant_env(args.hook, VLAKE_RESERVE="0")   # a hooked tenant's environment
        ... d.state (the state segment's name), d.sock, d.work ...

Start: a work directory (mode 755, so tenants of other uids reach the socket), the quota file,
vlaked with --driver/--nvml from `args` and `extra_args`, waiting up to 30 s for its socket
(RuntimeError otherwise). The simulated GPU has 1 GiB. Exit: vlaked gets SIGTERM (killed after
30 s), its log's tail is printed when `failed()` says so, and the work directory, the state
segment and the simulator's node file are removed.
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support"))
import testprocs  # noqa: E402  (tests/support/testprocs.py)

# The start of a tenant program (python -c TENANT PYTHON_DIR ...): python/vlake imported from
# argv[1], libcuda initialised with device 0's primary context current.
TENANT_PROLOGUE = r"""sys.path.insert(0, sys.argv[1])
import vlake
cuda = ctypes.CDLL("libcuda.so.1")
assert cuda.cuInit(0) == 0
dev, ctx = ctypes.c_int(), ctypes.c_void_p()
assert cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
assert cuda.cuCtxSetCurrent(ctx) == 0
"""


class SimVlaked:
    def __init__(self, args, name, config, extra_args=(), failed=lambda: False):
        self.failed = failed
        self.work = tempfile.mkdtemp(prefix="vlake-%s-" % name)
        os.chmod(self.work, 0o755)
        self.node = "%s-%d" % (name, os.getpid())
        self.state = "vlake-%s-%d" % (name, os.getpid())
        self.sock = os.path.join(self.work, "vlaked.sock")
        self.env = dict(os.environ, VLAKE_SIM_NODE=self.node, VLAKE_SIM_DEVICE_MEMORY="1GiB",
                        LD_LIBRARY_PATH=os.path.dirname(os.path.abspath(args.driver)))
        cfg = os.path.join(self.work, "vlake.yaml")
        with open(cfg, "w") as f:
            f.write(config)
        self.log_path = os.path.join(self.work, "vlaked.log")
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen([args.vlaked, "--config", cfg, "--socket", self.sock, "--state", self.state,
                                      "--driver", args.driver, "--nvml", args.nvml, "--metrics-address", "none",
                                      *extra_args],
                                     stdout=self.log, stderr=subprocess.STDOUT, env=self.env)

    def __enter__(self):
        try:
            deadline = time.time() + 30
            while not os.path.exists(self.sock):
                if self.proc.poll() is not None or time.time() > deadline:
                    raise RuntimeError("vlaked did not start")
                time.sleep(0.05)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def tenant_env(self, hook, **more):
        return dict(self.env, LD_PRELOAD=os.path.abspath(hook), VLAKE_SOCKET=self.sock, **more)

    def __exit__(self, *exc):
        testprocs.stop(self.proc)
        self.log.close()
        if self.failed():
            with open(self.log_path) as f:
                print(f.read()[-4000:])
        testprocs.unlink_quiet(testprocs.state_path(self.state), "/dev/shm/vlake-sim-" + self.node)
        shutil.rmtree(self.work, ignore_errors=True)
        return False
