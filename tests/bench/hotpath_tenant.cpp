// A tenant for tests/bench/test_hotpath.cpp: loads libcuda.so.1 like an application (under
// LD_PRELOAD=libvlake-hook.so the lookups return the hook's wrappers), makes the primary
// context current, and answers commands on stdin, one line each:
//
//   pairs <size> <n>   n x (cuMemAlloc_v2(size), cuMemFree_v2) ->
//                      "ok vmm=<d> cuMemMap=<d> ..." (d: the simulator's call-count deltas over
//                      the n pairs, for every entry point in kEntries)
//   quit               exits 0
//
// Banner: "ok ready pid=<pid>", or "error <why>" and exit 1 (no simulator counters, no context).
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>

#include "bench_support.hpp"

namespace {

constexpr const char* kEntries[] = {"cuMemImportFromShareableHandle",
                                    "cuMemAddressReserve",
                                    "cuMemMap",
                                    "cuMemSetAccess",
                                    "cuMemUnmap",
                                    "cuMemRelease",
                                    "cuMemAddressFree",
                                    "cuMemCreate",
                                    "cuMemExportToShareableHandle",
                                    "cuMemAlloc_v2",
                                    "cuMemFree_v2"};

int run() {
  using vlake::bench::CudaApi;
  CudaApi api;
  api.init_context(vlake::DeviceOrdinal{0});
  if (!api.has_call_counts()) {
    std::cout << "error the driver has no vlake_sim_call_count (not the simulator)" << std::endl;
    return 1;
  }
  std::cout << "ok ready pid=" << ::getpid() << std::endl;
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string cmd;
    in >> cmd;
    if (cmd == "quit") return 0;
    if (cmd != "pairs") {
      std::cout << "error unknown command '" << cmd << "'" << std::endl;
      continue;
    }
    std::string size_text;
    long n = 0;
    in >> size_text >> n;
    std::size_t bytes = 0;
    try {
      bytes = vlake::parse_size(size_text).value();
    } catch (const std::exception& e) {
      std::cout << "error " << e.what() << std::endl;
      continue;
    }
    unsigned long long before[std::size(kEntries)];
    for (std::size_t i = 0; i < std::size(kEntries); ++i) before[i] = api.calls(kEntries[i]);
    const unsigned long long vmm0 = api.vmm_calls();
    CUresult rc = CUDA_SUCCESS;
    for (long i = 0; i < n && rc == CUDA_SUCCESS; ++i) {
      CUdeviceptr p = 0;
      rc = api.mem_alloc(&p, bytes);
      if (rc == CUDA_SUCCESS) rc = api.mem_free(p);
    }
    const unsigned long long vmm1 = api.vmm_calls();
    if (rc != CUDA_SUCCESS) {
      std::cout << "error " << api.error_name(rc) << std::endl;
      continue;
    }
    std::cout << "ok vmm=" << (vmm1 - vmm0);
    for (std::size_t i = 0; i < std::size(kEntries); ++i) {
      std::cout << " " << kEntries[i] << "=" << (api.calls(kEntries[i]) - before[i]);
    }
    std::cout << std::endl;
  }
  return 0;
}

}  // namespace

int main() {
  try {
    return run();
  } catch (const std::exception& e) {
    std::cout << "error " << e.what() << std::endl;
    return 1;
  }
}
