// The counted paths in real processes (docs/hook.md, "What is covered"): cuMemCreate with
// properties the pool cannot serve, stream-ordered memory pools and graph memory. Each path is
// charged (the daemon's figure, seen through cuMemGetInfo), refused at the limit with nothing
// left allocated, uncharged when the driver gives the memory back, and the daemon's figure
// equals what the simulator's NVML attributes to the process (procmem).
#include <catch2/catch.hpp>

// cuda.h as vlake's own headers include it (cuda_api.hpp: the legacy names visible), which the
// other files of this target's unity batch may include first; this file uses only its types.
#ifndef __CUDA_API_VERSION_INTERNAL
#define __CUDA_API_VERSION_INTERNAL 1
#endif
#include <cuda.h>

#include <cstdint>
#include <string>

#include "daemon_case.hpp"
#include "support.hpp"

using namespace hooktest;

namespace {

constexpr std::uint64_t kLimit = 64 * MiB;

// What the daemon charges the tenant, from the virtualized cuMemGetInfo of step `info`.
std::uint64_t charged(const std::string& out, const std::string& info) {
  return kLimit - std::stoull(line_of(out, info)["free"]);
}

std::uint64_t procmem(const std::string& out, const std::string& step) {
  return std::stoull(line_of(out, step)["bytes"]);
}

}  // namespace

TEST_CASE("cuMemCreate with RDMA or compression properties is charged and refused at the limit") {
  Fixture f(with_limit(kLimit));
  const auto r = f.run({"init", "createx:h:4M:rdma", "info#1", "procmem#1", "createx:big:62M:compress", "procmem#2",
                        "props:h", "release:h", "info#2", "procmem#3"});
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  CHECK(line_of(r.out, "createx:h:4M:rdma")["rc"] == "0");
  CHECK(charged(r.out, "info#1") == 4 * MiB);
  CHECK(procmem(r.out, "procmem#1") == 4 * MiB);  // the daemon's figure is the driver's
  CHECK(line_of(r.out, "createx:big:62M:compress")["rc"] == num(CUDA_ERROR_OUT_OF_MEMORY));
  CHECK(procmem(r.out, "procmem#2") == 4 * MiB);  // refused before the driver created anything
  CHECK(line_of(r.out, "props:h")["rc"] == "0");  // the driver's own handle answers
  CHECK(line_of(r.out, "release:h")["rc"] == "0");
  CHECK(charged(r.out, "info#2") == 0);
  CHECK(procmem(r.out, "procmem#3") == 0);
  const Counters c = f.daemon->counters();
  CHECK(c.grants_counted == 1);
  CHECK(c.grants_create == 0);
  CHECK(c.refusals == 1);
  CHECK(c.releases == 1);
}

TEST_CASE("cuMemCreate with RDMA properties stays charged while mapped") {
  Fixture f(with_limit(kLimit));
  const auto r = f.run({"init", "createx:h:4M:rdma", "reserve:v:4M", "map:v:0:h", "release:h", "info#mapped",
                        "unmap:v:0:4M", "info#unmapped", "addrfree:v", "procmem"});
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  CHECK(line_of(r.out, "map:v:0:h")["rc"] == "0");
  CHECK(line_of(r.out, "release:h")["rc"] == "0");
  CHECK(charged(r.out, "info#mapped") == 4 * MiB);
  CHECK(line_of(r.out, "unmap:v:0:4M")["rc"] == "0");
  CHECK(charged(r.out, "info#unmapped") == 0);
  CHECK(procmem(r.out, "procmem") == 0);
  CHECK(f.daemon->counters().releases == 1);
}

TEST_CASE("a memory pool's reserved memory is charged and released at synchronization") {
  Fixture f(with_limit(kLimit));
  const auto r = f.run({"init", "pool:p", "palloc:a:p:3M", "pattr:p#1", "info#1", "procmem#1", "palloc:b:p:70M",
                        "pattr:p#2", "procmem#2", "info#2", "pfree:a", "info#3", "streamsync", "pattr:p#4", "info#4",
                        "procmem#4", "pdestroy:p"});
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  CHECK(line_of(r.out, "palloc:a:p:3M")["rc"] == "0");
  CHECK(line_of(r.out, "pattr:p#1")["reserved"] == num(4 * MiB));
  CHECK(charged(r.out, "info#1") == 4 * MiB);
  CHECK(procmem(r.out, "procmem#1") == 4 * MiB);
  // Over the limit: the allocation is given back and the pool trimmed to what is charged.
  CHECK(line_of(r.out, "palloc:b:p:70M")["rc"] == num(CUDA_ERROR_OUT_OF_MEMORY));
  CHECK(line_of(r.out, "palloc:b:p:70M")["ptr"] == "0x0");
  CHECK(line_of(r.out, "pattr:p#2")["reserved"] == num(4 * MiB));
  CHECK(procmem(r.out, "procmem#2") == 4 * MiB);
  CHECK(charged(r.out, "info#2") == 4 * MiB);
  // Freed memory stays in the pool until a synchronization releases it (threshold 0).
  CHECK(line_of(r.out, "pfree:a")["rc"] == "0");
  CHECK(charged(r.out, "info#3") == 4 * MiB);
  CHECK(line_of(r.out, "streamsync")["rc"] == "0");
  CHECK(line_of(r.out, "pattr:p#4")["reserved"] == "0");
  CHECK(charged(r.out, "info#4") == 0);
  CHECK(procmem(r.out, "procmem#4") == 0);
  CHECK(line_of(r.out, "pdestroy:p")["rc"] == "0");
  const Counters c = f.daemon->counters();
  CHECK(c.refusals == 1);
  CHECK(c.outstanding == 0);
}

TEST_CASE("a memory pool keeps its release threshold charged until trimmed") {
  Fixture f(with_limit(kLimit));
  const auto r = f.run({"init", "pool:p:8M", "palloc:a:p:6M", "pfree:a", "sync", "pattr:p#1", "info#1", "palloc:b:p:6M",
                        "info#reuse", "pfree:b", "ptrim:p:0", "pattr:p#2", "info#2", "procmem"});
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  CHECK(line_of(r.out, "pattr:p#1")["reserved"] == num(6 * MiB));  // under the threshold: kept
  CHECK(charged(r.out, "info#1") == 6 * MiB);
  CHECK(charged(r.out, "info#reuse") == 6 * MiB);  // reused: no growth, no new charge
  CHECK(line_of(r.out, "ptrim:p:0")["rc"] == "0");
  CHECK(line_of(r.out, "pattr:p#2")["reserved"] == "0");
  CHECK(charged(r.out, "info#2") == 0);
  CHECK(procmem(r.out, "procmem") == 0);
  CHECK(f.daemon->counters().grants_counted == 1);
}

TEST_CASE("a destroyed pool stays charged until its last allocation is freed") {
  Fixture f(with_limit(kLimit));
  const auto r = f.run({"init", "pool:p", "palloc:a:p:2M", "pdestroy:p", "info#1", "pfree:a", "info#2", "procmem"});
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  CHECK(line_of(r.out, "pdestroy:p")["rc"] == "0");
  CHECK(charged(r.out, "info#1") == 2 * MiB);
  CHECK(line_of(r.out, "pfree:a")["rc"] == "0");
  CHECK(charged(r.out, "info#2") == 0);
  CHECK(procmem(r.out, "procmem") == 0);
  CHECK(f.daemon->counters().outstanding == 0);
}

TEST_CASE("the default memory pool is counted") {
  Fixture f(with_limit(kLimit));
  const auto r = f.run({"init", "defpool:d", "palloc:a:d:2M", "info#1", "procmem#1", "palloc:b:d:64M", "procmem#2",
                        "pfree:a", "sync", "info#2", "procmem#3"});
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  CHECK(line_of(r.out, "palloc:a:d:2M")["rc"] == "0");
  CHECK(charged(r.out, "info#1") == 2 * MiB);
  CHECK(procmem(r.out, "procmem#1") == 2 * MiB);
  CHECK(line_of(r.out, "palloc:b:d:64M")["rc"] == num(CUDA_ERROR_OUT_OF_MEMORY));
  CHECK(procmem(r.out, "procmem#2") == 2 * MiB);
  CHECK(charged(r.out, "info#2") == 0);
  CHECK(procmem(r.out, "procmem#3") == 0);
}

TEST_CASE("graph memory is charged at launch and released by cuDeviceGraphMemTrim") {
  Fixture f(with_limit(kLimit));
  const auto r =
      f.run({"init", "graph:g", "gnalloc:g:x:6M", "ginst:e:g", "gattr#0", "info#0", "glaunch:e", "gattr#1", "info#1",
             "procmem#1", "pfree:x", "gexecdestroy:e", "info#2", "gtrim", "gattr#3", "info#3", "procmem#3"});
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  CHECK(line_of(r.out, "ginst:e:g")["rc"] == "0");
  CHECK(line_of(r.out, "gattr#0")["reserved"] == "0");
  CHECK(charged(r.out, "info#0") == 0);  // nothing reserved before launch
  CHECK(line_of(r.out, "glaunch:e")["rc"] == "0");
  CHECK(line_of(r.out, "gattr#1")["reserved"] == num(6 * MiB));
  CHECK(charged(r.out, "info#1") == 6 * MiB);
  CHECK(procmem(r.out, "procmem#1") == 6 * MiB);
  CHECK(line_of(r.out, "pfree:x")["rc"] == "0");
  CHECK(charged(r.out, "info#2") == 6 * MiB);  // the graph memory pool keeps it
  CHECK(line_of(r.out, "gtrim")["rc"] == "0");
  CHECK(line_of(r.out, "gattr#3")["reserved"] == "0");
  CHECK(charged(r.out, "info#3") == 0);
  CHECK(procmem(r.out, "procmem#3") == 0);
}

TEST_CASE("a graph whose allocations exceed the limit is refused at instantiation") {
  Fixture f(with_limit(kLimit));
  const auto r = f.run({"init", "graph:g", "gnalloc:g:x:80M", "ginst:e:g", "gattr", "procmem"});
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  CHECK(line_of(r.out, "gnalloc:g:x:80M")["rc"] == "0");
  CHECK(line_of(r.out, "ginst:e:g")["rc"] == num(CUDA_ERROR_OUT_OF_MEMORY));
  CHECK(line_of(r.out, "gattr")["reserved"] == "0");
  CHECK(procmem(r.out, "procmem") == 0);
  CHECK(f.daemon->counters().grants_counted == 0);
}

TEST_CASE("a graph launch beyond the limit is refused before it runs") {
  Fixture f(with_limit(kLimit));
  const auto r = f.run({"init", "graph:g1", "gnalloc:g1:x:40M", "graph:g2", "gnalloc:g2:y:40M", "ginst:e1:g1",
                        "ginst:e2:g2", "glaunch:e1", "glaunch:e2", "gattr", "info", "procmem"});
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  CHECK(line_of(r.out, "ginst:e2:g2")["rc"] == "0");  // alone, each fits
  CHECK(line_of(r.out, "glaunch:e1")["rc"] == "0");
  CHECK(line_of(r.out, "glaunch:e2")["rc"] == num(CUDA_ERROR_OUT_OF_MEMORY));
  CHECK(line_of(r.out, "gattr")["reserved"] == num(40 * MiB));
  CHECK(charged(r.out, "info") == 40 * MiB);
  CHECK(procmem(r.out, "procmem") == 40 * MiB);
  CHECK(f.daemon->counters().refusals == 1);
}

TEST_CASE("cuMemAllocAsync during stream capture becomes counted graph memory") {
  Fixture f(with_limit(kLimit));
  const auto r = f.run({"init", "capture", "capalloc:c:4M", "capfree:c", "endcapture:g", "ginstup:e:g", "gattr#1",
                        "info#1", "glaunch:e", "gattr#2", "info#2", "procmem", "gtrim", "info#3"});
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  CHECK(line_of(r.out, "capture")["rc"] == "0");
  CHECK(line_of(r.out, "capalloc:c:4M")["rc"] == "0");
  CHECK(line_of(r.out, "capfree:c")["rc"] == "0");
  CHECK(line_of(r.out, "endcapture:g")["rc"] == "0");
  CHECK(line_of(r.out, "ginstup:e:g")["rc"] == "0");
  CHECK(line_of(r.out, "gattr#1")["reserved"] == num(4 * MiB));  // uploaded at instantiation
  CHECK(charged(r.out, "info#1") == 4 * MiB);
  CHECK(line_of(r.out, "glaunch:e")["rc"] == "0");
  CHECK(line_of(r.out, "gattr#2")["reserved"] == num(4 * MiB));
  CHECK(charged(r.out, "info#2") == 4 * MiB);
  CHECK(procmem(r.out, "procmem") == 4 * MiB);
  CHECK(charged(r.out, "info#3") == 0);
  CHECK(f.daemon->counters().grants_alloc == 0);  // the captured allocation was not served
}

TEST_CASE("the pre-3.2 cuMemAlloc ABI is charged first and uncharged when the driver fails") {
  Fixture f(with_limit(kLimit));
  const auto r = f.run({"where:cuMemAlloc:2000", "init", "alloc1:a:4M", "alloc1:big:80M", "info", "procmem"});
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  CHECK(line_of(r.out, "where:cuMemAlloc:2000")["lib"] == "libvlake-hook.so");
  // The simulator refuses the 32-bit ABI: the charge made before the call is given back.
  CHECK(line_of(r.out, "alloc1:a:4M")["rc"] == num(CUDA_ERROR_INVALID_CONTEXT));   // as the H100 answers
  CHECK(line_of(r.out, "alloc1:big:80M")["rc"] == num(CUDA_ERROR_OUT_OF_MEMORY));  // refused before the driver
  CHECK(charged(r.out, "info") == 0);
  CHECK(procmem(r.out, "procmem") == 0);
  const Counters c = f.daemon->counters();
  CHECK(c.grants_counted == 1);
  CHECK(c.releases == 1);
  CHECK(c.refusals == 1);
  CHECK(c.outstanding == 0);
}

TEST_CASE("relaunching an auto-free graph reuses its memory instead of charging it again") {
  Fixture f(with_limit(kLimit));
  const auto r = f.run({"init", "graph:g", "gnalloc:g:x:40M", "ginstaf:e:g", "glaunch:e#1", "glaunch:e#2", "gattr",
                        "info", "procmem", "ginst:again:g", "graph:g2", "gnalloc:g2:y:40M", "ginst:plain:g2"});
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  CHECK(line_of(r.out, "glaunch:e#1")["rc"] == "0");
  CHECK(line_of(r.out, "glaunch:e#2")["rc"] == "0");  // 40 MiB twice would not fit 64 MiB
  CHECK(line_of(r.out, "gattr")["reserved"] == num(40 * MiB));
  CHECK(charged(r.out, "info") == 40 * MiB);
  CHECK(procmem(r.out, "procmem") == 40 * MiB);
  CHECK(line_of(r.out, "ginst:again:g")["rc"] != "0");  // one exec at a time per graph with memory nodes
  // Another 40 MiB while the first is live (nothing to reuse): refused at instantiation.
  CHECK(line_of(r.out, "ginst:plain:g2")["rc"] == num(CUDA_ERROR_OUT_OF_MEMORY));
}

TEST_CASE("a graph instantiated through the CUDA 11 ABI is charged after its launch") {
  Fixture f(with_limit(kLimit));
  const auto r = f.run({"where:cuGraphInstantiate:11000", "init", "graph:g", "gnalloc:g:x:6M", "ginst11:e:g",
                        "glaunch:e", "gattr", "info#1", "procmem", "pfree:x", "gtrim", "info#2"});
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  CHECK(line_of(r.out, "where:cuGraphInstantiate:11000")["lib"] == "libcuda.so.1");  // not intercepted
  CHECK(line_of(r.out, "ginst11:e:g")["rc"] == "0");
  CHECK(line_of(r.out, "glaunch:e")["rc"] == "0");
  CHECK(line_of(r.out, "gattr")["reserved"] == num(6 * MiB));
  CHECK(charged(r.out, "info#1") == 6 * MiB);
  CHECK(procmem(r.out, "procmem") == 6 * MiB);
  CHECK(charged(r.out, "info#2") == 0);
}
