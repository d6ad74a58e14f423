// vlake_bench_count: the tenant of the instruction-count gates (bench/count/gate.py,
// docs/benchmarks.md "Instruction-count gates"). It initializes CUDA, does `--warmup` untimed
// operations, then runs `--iterations` of one operation inside vlake_count_loop(), the one
// function callgrind collects (--toggle-collect), so the count covers exactly those calls on
// this thread (the hook's code, the driver's, this loop) and nothing of start-up, exit or the
// hook's worker thread. Operations:
//   pair     cuMemAlloc_v2 + cuMemFree_v2 of 2 MiB (under the hook with a local reserve: its warm
//            path; with VLAKE_RESERVE=0: a daemon grant and release each)
//   launch   cuLaunchKernel of a kernel that does nothing (vlake_fill_u32, n = 0)
//   memcpy   cuMemcpyHtoD_v2 of 4 KiB into an allocation
//   meminfo  cuMemGetInfo_v2
// Prints {"bench":"count","op":...,"iterations":N}. Exit 1 when a call fails, 2 on bad options.
#include <cudaTypedefs.h>

#include <array>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "../../common/src/kernels_ptx.hpp"
#include "bench_support.hpp"

namespace {

using vlake::bench::CudaApi;

struct Ops {
  const CudaApi* api = nullptr;
  PFN_cuLaunchKernel_v4000 launch = nullptr;
  PFN_cuMemcpyHtoD_v3020 htod = nullptr;
  PFN_cuMemGetInfo_v3020 meminfo = nullptr;
  CUfunction fn = nullptr;
  CUdeviceptr buffer = 0;
  std::array<unsigned char, 4096> host{};
};

enum class Op { pair, launch, memcpy, meminfo };

void once(Ops& o, Op op) {
  switch (op) {
    case Op::pair: {
      CUdeviceptr p = 0;
      o.api->check(o.api->mem_alloc(&p, 2ULL << 20), "cuMemAlloc_v2");
      o.api->check(o.api->mem_free(p), "cuMemFree_v2");
      break;
    }
    case Op::launch: {
      CUdeviceptr p = 0;
      unsigned long long n = 0;
      unsigned v = 0;
      void* params[] = {&p, &n, &v};
      o.api->check(o.launch(o.fn, 1, 1, 1, 32, 1, 1, 0, nullptr, params, nullptr), "cuLaunchKernel");
      break;
    }
    case Op::memcpy: o.api->check(o.htod(o.buffer, o.host.data(), o.host.size()), "cuMemcpyHtoD_v2"); break;
    case Op::meminfo: {
      size_t free = 0;
      size_t total = 0;
      o.api->check(o.meminfo(&free, &total), "cuMemGetInfo_v2");
      break;
    }
  }
}

}  // namespace

// The counted region (callgrind --toggle-collect=vlake_count_loop). noinline and extern "C"
// so that it exists under this exact name in every build.
extern "C" __attribute__((noinline, used)) void vlake_count_loop(Ops* o, Op op, long n) {
  for (long i = 0; i < n; ++i) once(*o, op);
}

int main(int argc, char** argv) {
  std::string op_name = "pair";
  std::string driver = "libcuda.so.1";
  long iterations = 100;
  long warmup = 2;
  const std::vector<std::string> args(argv + 1, argv + argc);
  try {
    for (std::size_t i = 0; i < args.size(); ++i) {
      if (args[i] == "--help" || args[i] == "-h") {
        std::cout << "usage: vlake_bench_count [--op pair|launch|memcpy|meminfo] [--iterations N] [--warmup N]\n"
                     "                         [--driver PATH]\n";
        return 0;
      }
      if (i + 1 >= args.size()) throw std::invalid_argument(args[i] + " needs a value");
      const std::string& v = args[++i];
      if (args[i - 1] == "--op") {
        op_name = v;
      } else if (args[i - 1] == "--iterations") {
        iterations = vlake::bench::parse_number("--iterations", v, 1, 100000000);
      } else if (args[i - 1] == "--warmup") {
        warmup = vlake::bench::parse_number("--warmup", v, 0, 1000000);
      } else if (args[i - 1] == "--driver") {
        driver = v;
      } else {
        throw std::invalid_argument("unknown option '" + args[i - 1] + "'");
      }
    }
  } catch (const std::exception& e) {
    std::cerr << "vlake_bench_count: " << e.what() << "\n";
    return 2;
  }
  Op op{};
  if (op_name == "pair") {
    op = Op::pair;
  } else if (op_name == "launch") {
    op = Op::launch;
  } else if (op_name == "memcpy") {
    op = Op::memcpy;
  } else if (op_name == "meminfo") {
    op = Op::meminfo;
  } else {
    std::cerr << "vlake_bench_count: unknown --op '" << op_name << "' (pair, launch, memcpy, meminfo)\n";
    return 2;
  }
  try {
    CudaApi api(driver);
    api.init_context(vlake::DeviceOrdinal{0});
    Ops o;
    o.api = &api;
    o.launch = api.entry<PFN_cuLaunchKernel_v4000>("cuLaunchKernel");
    o.htod = api.entry<PFN_cuMemcpyHtoD_v3020>("cuMemcpyHtoD_v2");
    o.meminfo = api.entry<PFN_cuMemGetInfo_v3020>("cuMemGetInfo_v2");
    CUmodule module = nullptr;
    api.check(api.entry<PFN_cuModuleLoadData_v2000>("cuModuleLoadData")(&module, vlake::detail::kKernelsPtx),
              "cuModuleLoadData");
    api.check(api.entry<PFN_cuModuleGetFunction_v2000>("cuModuleGetFunction")(&o.fn, module, "vlake_fill_u32"),
              "cuModuleGetFunction");
    api.check(api.mem_alloc(&o.buffer, 2ULL << 20), "cuMemAlloc_v2");
    for (long i = 0; i < warmup; ++i) once(o, op);
    vlake_count_loop(&o, op, iterations);
    api.check(api.mem_free(o.buffer), "cuMemFree_v2");
    std::cout << "{\"bench\":\"count\",\"op\":\"" << op_name << "\",\"iterations\":" << iterations << "}" << std::endl;
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "vlake_bench_count: " << e.what() << "\n";
    return 1;
  }
}
