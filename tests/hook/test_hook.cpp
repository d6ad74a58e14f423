// The hook in real processes: vlake_hook_tenant under LD_PRELOAD=libvlake-hook.so, on the
// simulated driver, against the fake daemon of fake_daemon.hpp.
// cuda.h as vlake's own headers include it (cuda_api.hpp: the legacy names visible), which the
// other files of this target's unity batch may include first; this file uses only its types.
#ifndef __CUDA_API_VERSION_INTERNAL
#define __CUDA_API_VERSION_INTERNAL 1
#endif
#include <cuda.h>

#include <catch2/catch.hpp>
#include <chrono>

#include "daemon_case.hpp"
#include "support.hpp"

using namespace hooktest;

namespace {

constexpr std::uint64_t kCapacity = std::uint64_t{1} << 30;  // VLAKE_SIM_DEVICE_MEMORY

}  // namespace

TEST_CASE("cudart-style resolution reaches the hook and the daemon serves alloc and free") {
  Fixture f(with_limit(64 * MiB));
  const auto r =
      f.run({"where:cuMemAlloc:3020", "where:cuMemGetInfo:2000", "where:cuStreamCreate:2000", "where:cuNoSuchCall:3020",
             "where:cuGetProcAddress:11030", "where:cuGetProcAddress:12000", "dlsym:cuGetProcAddress_v2",
             "dlsym:cuStreamCreate", "dlsym-next:dlsym", "dlsym-next:cuMemAlloc_v2", "init", "alloc:a:6M",
             "fill:a:6M:7", "range:a:5M", "attr:a:5M", "info#1", "free:a", "info#2"});
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  REQUIRE(r.status == 0);
  auto res = line_of(r.out, "resolve");
  CHECK(res["gpa2_lib"] == "libvlake-hook.so");
  CHECK(res["gpa1_lib"] == "libvlake-hook.so");
  CHECK(res["alloc_lib"] == "libvlake-hook.so");
  // cuMemcpyDtoH is intercepted (it reports kernel faults); cuStreamCreate below is not.
  CHECK(res["memcpy_lib"] == "libvlake-hook.so");
  CHECK(line_of(r.out, "where:cuMemAlloc:3020")["lib"] == "libvlake-hook.so");
  // Names and versions the hook does not intercept: the driver's answer, status included
  // (compared with the same lookups in a process without the hook).
  const auto bare = run_tenant({"where:cuMemGetInfo:2000", "where:cuNoSuchCall:3020"}, {{"LD_PRELOAD", "\x01"}});
  INFO("without the hook:\n" << bare.out);
  for (const char* step : {"where:cuMemGetInfo:2000", "where:cuNoSuchCall:3020"}) {
    auto hooked = line_of(r.out, step);
    auto plain = line_of(bare.out, step);
    REQUIRE_FALSE(plain.empty());
    CHECK(hooked["rc"] == plain["rc"]);
    CHECK(hooked["v1_rc"] == plain["v1_rc"]);
    CHECK(hooked["status"] == plain["status"]);
    CHECK(hooked["lib"] == plain["lib"]);
    CHECK(hooked["lib"] != "libvlake-hook.so");
  }
  CHECK(line_of(r.out, "where:cuNoSuchCall:3020")["status"] == num(CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND));
  CHECK(line_of(r.out, "where:cuStreamCreate:2000")["lib"] == "libcuda.so.1");
  CHECK(line_of(r.out, "where:cuGetProcAddress:11030")["lib"] == "libvlake-hook.so");
  CHECK(line_of(r.out, "where:cuGetProcAddress:12000")["lib"] == "libvlake-hook.so");
  CHECK(line_of(r.out, "dlsym:cuGetProcAddress_v2")["lib"] == "libvlake-hook.so");
  CHECK(line_of(r.out, "dlsym:cuStreamCreate")["lib"] == "libcuda.so.1");
  // RTLD_NEXT keeps its caller's view: from the executable, the next dlsym is the hook's (a
  // lookup made from inside the hook would have found the C library's).
  CHECK(line_of(r.out, "dlsym-next:dlsym")["lib"] == "libvlake-hook.so");
  CHECK(line_of(r.out, "dlsym-next:cuMemAlloc_v2")["lib"] == "libvlake-hook.so");

  CHECK(line_of(r.out, "alloc:a:6M")["rc"] == "0");
  CHECK(line_of(r.out, "fill:a:6M:7")["ok"] == "1");
  // 6 MiB came as two handles (2 + 4 MiB); the driver alone would answer with the 4 MiB chunk.
  auto range = line_of(r.out, "range:a:5M");
  CHECK(range["rc"] == "0");
  CHECK(range["base_off"] == "0");
  CHECK(range["size"] == num(6 * MiB));
  auto attr = line_of(r.out, "attr:a:5M");
  CHECK(attr["rc"] == "0");
  CHECK(attr["start_off"] == "0");
  CHECK(attr["size"] == num(6 * MiB));
  CHECK(attr["multi_rc"] == "0");
  CHECK(attr["ordinal"] == "0");
  CHECK(attr["multi_start_off"] == "0");
  CHECK(attr["multi_size"] == num(6 * MiB));
  CHECK(line_of(r.out, "info#1")["total"] == num(64 * MiB));
  CHECK(line_of(r.out, "info#1")["free"] == num(58 * MiB));
  CHECK(line_of(r.out, "free:a")["rc"] == "0");
  CHECK(line_of(r.out, "info#2")["free"] == num(64 * MiB));

  const Counters c = f.daemon->counters();
  CHECK(c.hellos == 1);
  CHECK(c.grants_alloc == 1);
  CHECK(c.last_grant_bytes == 6 * MiB);
  CHECK(c.releases == 1);
  CHECK(c.usage_queries == 2);
  CHECK(c.outstanding == 0);
  CHECK(c.used == 0);
}

TEST_CASE("exported symbols called directly are intercepted too") {
  Fixture f(with_limit(64 * MiB));
  const auto r = f.run({"--direct", "init", "alloc:a:3M", "fill:a:3M:1", "totalmem", "free:a"});
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  CHECK(line_of(r.out, "resolve")["alloc_lib"] == "libvlake-hook.so");
  CHECK(line_of(r.out, "alloc:a:3M")["rc"] == "0");
  CHECK(line_of(r.out, "fill:a:3M:1")["ok"] == "1");
  CHECK(line_of(r.out, "totalmem")["bytes"] == num(64 * MiB));
  CHECK(line_of(r.out, "free:a")["rc"] == "0");
  const Counters c = f.daemon->counters();
  check_all_returned(c, 1);
}

TEST_CASE("over the limit: CUDA_ERROR_OUT_OF_MEMORY and one rate-limited stderr line") {
  Fixture f(with_limit(8 * MiB));
  const auto r =
      f.run({"init", "alloc:a:6M", "alloc:b:4M", "alloc:c:4M", "alloc:d:4M", "sleep:1100", "alloc:e:4M", "free:a"});
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  CHECK(line_of(r.out, "alloc:a:6M")["rc"] == "0");
  for (const char* s : {"alloc:b:4M", "alloc:c:4M", "alloc:d:4M", "alloc:e:4M"}) {
    CHECK(line_of(r.out, s)["rc"] == num(CUDA_ERROR_OUT_OF_MEMORY));
  }
  CHECK(count_lines(r.err,
                    "vlake: out of memory on GPU 0: tenant user:test holds 6 MiB of its 8 MiB "
                    "limit; request of 4 MiB refused") == 2);
  CHECK(count_lines(r.err, "out of memory") == 2);
  CHECK(count_lines(r.err, "(2 similar messages suppressed)") == 1);
  const Counters c = f.daemon->counters();
  CHECK(c.refusals == 4);
  CHECK(c.grants_alloc == 1);
  CHECK(c.outstanding == 0);
}

TEST_CASE("a full GPU is reported as such") {
  FakeDaemonOptions o = with_limit(64 * MiB);
  o.grant_status = vlake::proto::Status::out_of_memory;
  Fixture f(o);
  const auto r = f.run({"init", "alloc:a:2M"});
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  CHECK(line_of(r.out, "alloc:a:2M")["rc"] == num(CUDA_ERROR_OUT_OF_MEMORY));
  CHECK(count_lines(r.err, "vlake: out of memory on GPU 0: the GPU is full") == 1);
}

TEST_CASE("cuMemGetInfo_v2 and cuDeviceTotalMem_v2 report the tenant's limit") {
  SECTION("limit below the GPU") {
    Fixture f(with_limit(64 * MiB));
    const auto r = f.run({"init", "info#1", "totalmem", "alloc:a:10M", "info#2", "free:a"});
    INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
    CHECK(line_of(r.out, "info#1")["total"] == num(64 * MiB));
    CHECK(line_of(r.out, "info#1")["free"] == num(64 * MiB));
    CHECK(line_of(r.out, "totalmem")["bytes"] == num(64 * MiB));
    CHECK(line_of(r.out, "info#2")["free"] == num(54 * MiB));
    CHECK(f.daemon->counters().usage_queries == 3);
  }
  SECTION("limit above the GPU: the GPU's figures bound it") {
    Fixture f(with_limit(4 * kCapacity));
    const auto r = f.run({"init", "info", "totalmem"});
    INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
    CHECK(line_of(r.out, "info")["total"] == num(kCapacity));
    CHECK(line_of(r.out, "info")["free"] == num(kCapacity));
    CHECK(line_of(r.out, "totalmem")["bytes"] == num(kCapacity));
  }
  SECTION("no current context: the driver's error") {
    Fixture f(with_limit(64 * MiB));
    const auto r = f.run({"init", "noctx", "info", "alloc:a:2M"});
    INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
    CHECK(line_of(r.out, "info")["rc"] == num(CUDA_ERROR_INVALID_CONTEXT));
    CHECK(line_of(r.out, "alloc:a:2M")["rc"] == num(CUDA_ERROR_INVALID_CONTEXT));
    CHECK(f.daemon->counters().grants_alloc == 0);
  }
}

TEST_CASE("cuMemAllocPitch_v2 is served with a 512-byte pitch and validates the element size") {
  Fixture f(with_limit(64 * MiB));
  const auto r = f.run({"init", "pitch:p:1000:3000:4", "fill:p:3000K:3", "range:p:0", "pitch:q:1000:10:3", "free:p"});
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  CHECK(line_of(r.out, "pitch:p:1000:3000:4")["rc"] == "0");
  CHECK(line_of(r.out, "pitch:p:1000:3000:4")["pitch"] == "1024");
  CHECK(line_of(r.out, "fill:p:3000K:3")["ok"] == "1");
  CHECK(line_of(r.out, "range:p:0")["size"] == num(1024 * 3000));
  CHECK(line_of(r.out, "pitch:q:1000:10:3")["rc"] == num(CUDA_ERROR_INVALID_VALUE));
  const Counters c = f.daemon->counters();
  CHECK(c.grants_alloc == 1);
  CHECK(c.last_grant_bytes == 4 * MiB);  // 3 000 KiB rounded up to the granularity
  CHECK(c.releases == 1);
}

TEST_CASE("cuMemAllocAsync / cuMemFreeAsync are served from the pool") {
  Fixture f(with_limit(64 * MiB));
  const bool ptds = GENERATE(false, true);
  std::vector<std::string> args;
  if (ptds) args.push_back("--ptds");
  for (const char* s : {"init", "where:cuMemAllocAsync:11020", "where:cuMemAllocAsync:11020:ptds", "async:x:6M",
                        "fill:x:6M:4", "range:x:3M", "info", "freeasync:x"}) {
    args.emplace_back(s);
  }
  const auto r = f.run(args);
  INFO("ptds " << ptds << "\nstdout:\n" << r.out << "\nstderr:\n" << r.err);
  CHECK(line_of(r.out, "where:cuMemAllocAsync:11020")["lib"] == "libvlake-hook.so");
  CHECK(line_of(r.out, "where:cuMemAllocAsync:11020:ptds")["lib"] == "libvlake-hook.so");
  CHECK(line_of(r.out, "async:x:6M")["rc"] == "0");
  CHECK(line_of(r.out, "fill:x:6M:4")["ok"] == "1");
  CHECK(line_of(r.out, "range:x:3M")["size"] == num(6 * MiB));
  CHECK(line_of(r.out, "info")["free"] == num(58 * MiB));
  CHECK(line_of(r.out, "freeasync:x")["rc"] == "0");
  const Counters c = f.daemon->counters();
  check_all_returned(c, 1);
}

TEST_CASE("cuMemAllocManaged passes through and is charged") {
  Fixture f(with_limit(64 * MiB));
  const auto r = f.run({"init", "managed:m:3M", "info#1", "free:m", "info#2", "managed:big:80M"});
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  CHECK(line_of(r.out, "managed:m:3M")["rc"] == "0");
  CHECK(line_of(r.out, "info#1")["free"] == num(60 * MiB));  // 3 MiB charged as 4 MiB
  CHECK(line_of(r.out, "free:m")["rc"] == "0");
  CHECK(line_of(r.out, "info#2")["free"] == num(64 * MiB));
  CHECK(line_of(r.out, "managed:big:80M")["rc"] == num(CUDA_ERROR_OUT_OF_MEMORY));
  const Counters c = f.daemon->counters();
  CHECK(c.grants_counted == 1);
  CHECK(c.releases == 1);
  CHECK(c.refusals == 1);
}

TEST_CASE("overcommit: device allocations are the driver's, charged with counted grants") {
  FakeDaemonOptions o = with_limit(64 * MiB);
  o.overcommit = true;
  Fixture f(o);
  const auto r = f.run({"init", "alloc:a:3M", "fill:a:3M:7", "async:b:6M", "create:h:4M", "info#1", "free:a",
                        "freeasync:b", "release:h", "info#2", "alloc:big:80M"});
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  CHECK(line_of(r.out, "alloc:a:3M")["rc"] == "0");
  CHECK(line_of(r.out, "fill:a:3M:7")["ok"] == "1");
  CHECK(line_of(r.out, "async:b:6M")["rc"] == "0");
  CHECK(line_of(r.out, "create:h:4M")["rc"] == "0");
  // 3 MiB charged as 4, the stream-ordered pool's reservation (at least 6 MiB), 4 MiB: all
  // counted; nothing came from the pool.
  const auto used1 = 64 * MiB - std::stoull(line_of(r.out, "info#1")["free"]);
  CHECK(used1 >= 14 * MiB);
  CHECK(line_of(r.out, "free:a")["rc"] == "0");
  CHECK(line_of(r.out, "freeasync:b")["rc"] == "0");
  CHECK(line_of(r.out, "release:h")["rc"] == "0");
  CHECK(line_of(r.out, "alloc:big:80M")["rc"] == num(CUDA_ERROR_OUT_OF_MEMORY));
  const Counters c = f.daemon->counters();
  CHECK(c.grants_alloc == 0);
  CHECK(c.grants_create == 0);
  CHECK(c.grants_counted >= 3);
  CHECK(c.refusals == 1);
}

TEST_CASE("cuMemCreate: the grant is released only after every reference and mapping is gone") {
  Fixture f(with_limit(64 * MiB));
  SECTION("released but still mapped: no release until unmap") {
    const auto r =
        f.run({"init", "create:h:4M", "reserve:v:8M", "map:v:2M:h", "retain:h2:v:3M", "release:h", "release:h2"});
    INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
    CHECK(line_of(r.out, "create:h:4M")["rc"] == "0");
    CHECK(line_of(r.out, "map:v:2M:h")["rc"] == "0");
    CHECK(line_of(r.out, "retain:h2:v:3M")["rc"] == "0");
    CHECK(line_of(r.out, "retain:h2:v:3M")["handle"] == line_of(r.out, "create:h:4M")["handle"]);
    CHECK(line_of(r.out, "release:h")["rc"] == "0");
    CHECK(line_of(r.out, "release:h2")["rc"] == "0");
    const Counters c = f.daemon->counters();
    CHECK(c.grants_create == 1);
    CHECK(c.releases == 0);     // still mapped when the process exited
    CHECK(c.outstanding == 0);  // taken back when the process went away
  }
  SECTION("unmapped after the last release") {
    const auto r = f.run({"init", "create:h:4M", "reserve:v:8M", "map:v:2M:h", "retain:h2:v:3M", "release:h",
                          "release:h2", "unmap:v:0:8M", "addrfree:v", "sleep:50"});
    INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
    CHECK(line_of(r.out, "unmap:v:0:8M")["rc"] == "0");
    CHECK(line_of(r.out, "addrfree:v")["rc"] == "0");
    const Counters c = f.daemon->counters();
    CHECK(c.grants_create == 1);
    CHECK(c.releases == 1);
    CHECK(c.releases_exported == 0);
  }
  SECTION("released with mappings gone first") {
    const auto r =
        f.run({"init", "create:h:4M", "reserve:v:4M", "map:v:0:h", "fill:v:4M:2", "unmap:v:0:4M", "release:h"});
    INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
    CHECK(line_of(r.out, "fill:v:4M:2")["ok"] == "1");
    CHECK(line_of(r.out, "release:h")["rc"] == "0");
    CHECK(f.daemon->counters().releases == 1);
  }
  SECTION("properties are the application's") {
    const auto r = f.run(
        {"init", "create:h:2M", "props:h", "create:n:2M:nofd", "props:n", "create:odd:3M", "release:h", "release:n"});
    INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
    auto p = line_of(r.out, "props:h");
    CHECK(p["rc"] == "0");
    CHECK(p["type"] == num(CU_MEM_ALLOCATION_TYPE_PINNED));
    CHECK(p["loc_type"] == num(CU_MEM_LOCATION_TYPE_DEVICE));
    CHECK(p["loc_id"] == "0");
    CHECK(p["handle_types"] == num(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    CHECK(line_of(r.out, "props:n")["handle_types"] == num(CU_MEM_HANDLE_TYPE_NONE));
    CHECK(line_of(r.out, "create:odd:3M")["rc"] == num(CUDA_ERROR_INVALID_VALUE));
    const Counters c = f.daemon->counters();
    CHECK(c.grants_create == 2);
    CHECK(c.releases == 2);
  }
}

TEST_CASE("cuMemExportToShareableHandle of a pool handle returns a usable descriptor") {
  Fixture f(with_limit(64 * MiB));
  const auto r = f.run({"init", "create:h:4M", "reserve:v:4M", "map:v:0:h", "export:h:v:0", "create:n:2M:nofd",
                        "export:n", "release:h", "unmap:v:0:4M", "release:n"});
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  auto e = line_of(r.out, "export:h:v:0");
  CHECK(e["rc"] == "0");
  CHECK(e["fd_ok"] == "1");
  CHECK(e["same_memory"] == "1");
  CHECK(e["import_rc"] == "0");
  CHECK(line_of(r.out, "export:n")["rc"] == num(CUDA_ERROR_INVALID_VALUE));
  CHECK(line_of(r.out, "unmap:v:0:4M")["rc"] == "0");
  const Counters c = f.daemon->counters();
  CHECK(c.releases == 2);
  CHECK(c.releases_exported == 1);
  CHECK(c.outstanding == 0);
}

TEST_CASE("daemon unreachable: refuse (default) or passthrough") {
  const std::string missing = fresh_socket_path();
  SECTION("refuse") {
    const auto r = run_tenant({"init", "alloc:a:2M", "create:h:2M", "info"}, {{"VLAKE_SOCKET", missing}});
    INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
    CHECK(line_of(r.out, "alloc:a:2M")["rc"] == num(CUDA_ERROR_OUT_OF_MEMORY));
    CHECK(line_of(r.out, "create:h:2M")["rc"] == num(CUDA_ERROR_OUT_OF_MEMORY));
    CHECK(line_of(r.out, "info")["total"] == num(kCapacity));  // not virtualized, not failed
    CHECK(count_lines(r.err, "vlake: cannot reach vlaked at " + missing) == 1);
    CHECK(count_lines(r.err, "VLAKE_ON_UNREACHABLE=passthrough") == 1);
  }
  SECTION("passthrough") {
    const auto r = run_tenant({"init", "alloc:a:2M", "fill:a:2M:5", "alloc:b:2M", "free:a", "free:b"},
                              {{"VLAKE_SOCKET", missing}, {"VLAKE_ON_UNREACHABLE", "passthrough"}});
    INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
    CHECK(line_of(r.out, "alloc:a:2M")["rc"] == "0");
    CHECK(line_of(r.out, "fill:a:2M:5")["ok"] == "1");
    CHECK(line_of(r.out, "alloc:b:2M")["rc"] == "0");
    CHECK(line_of(r.out, "free:a")["rc"] == "0");
    CHECK(line_of(r.out, "free:b")["rc"] == "0");
    CHECK(count_lines(r.err, "without accounting") == 1);
  }
}

TEST_CASE("daemon restart: the hook reconnects with its old session and retries") {
  FakeDaemonOptions o = with_limit(64 * MiB);
  o.drop_on_request = 2;  // the second request finds the connection closed
  Fixture f(o);
  const auto r = f.run({"init", "alloc:a:2M", "alloc:b:2M", "free:a", "free:b"}, {{"VLAKE_LOG", "info"}});
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  CHECK(line_of(r.out, "alloc:a:2M")["rc"] == "0");
  CHECK(line_of(r.out, "alloc:b:2M")["rc"] == "0");
  CHECK(line_of(r.out, "free:a")["rc"] == "0");
  CHECK(line_of(r.out, "free:b")["rc"] == "0");
  const Counters c = f.daemon->counters();
  CHECK(c.drops == 1);
  CHECK(c.hellos == 2);
  CHECK(c.hellos_with_old_session == 1);
  CHECK(c.rebinds == 1);
  CHECK(c.grants_alloc == 2);
  CHECK(c.releases == 2);
  CHECK(c.releases_unknown == 0);
}

TEST_CASE("daemon gone for good: reconnect gives up after VLAKE_RECONNECT_TIMEOUT") {
  FakeDaemonOptions o = with_limit(64 * MiB);
  o.drop_on_request = 2;
  o.vanish_on_drop = true;
  Fixture f(o);
  const auto start = std::chrono::steady_clock::now();
  const auto r = f.run({"init", "alloc:a:2M", "alloc:b:2M"}, {{"VLAKE_RECONNECT_TIMEOUT", "400ms"}});
  const auto took = std::chrono::steady_clock::now() - start;
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  CHECK(line_of(r.out, "alloc:a:2M")["rc"] == "0");
  CHECK(line_of(r.out, "alloc:b:2M")["rc"] == num(CUDA_ERROR_OUT_OF_MEMORY));
  CHECK(count_lines(r.err, "vlake: cannot reach vlaked") == 1);
  CHECK(took >= std::chrono::milliseconds(400));
  CHECK(took < std::chrono::seconds(5));
}

TEST_CASE("a daemon that does not answer makes the call fail after VLAKE_TIMEOUT, it never hangs") {
  FakeDaemonOptions o = with_limit(64 * MiB);
  o.stall = true;
  Fixture f(o);
  const auto start = std::chrono::steady_clock::now();
  const auto r = f.run({"init", "alloc:a:2M", "info"}, {{"VLAKE_TIMEOUT", "300ms"}});
  const auto took = std::chrono::steady_clock::now() - start;
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  CHECK(line_of(r.out, "alloc:a:2M")["rc"] == num(CUDA_ERROR_OUT_OF_MEMORY));
  CHECK(count_lines(r.err, "no reply within VLAKE_TIMEOUT") == 1);
  CHECK(line_of(r.out, "info")["total"] == num(kCapacity));  // the driver's figure
  CHECK(took >= std::chrono::milliseconds(300));
  CHECK(took < std::chrono::seconds(5));
}

TEST_CASE("fork: the child connects afresh and does not use the parent's connection") {
  Fixture f(with_limit(64 * MiB));
  SECTION("parent connected (NVML), child uses CUDA") {
    const auto r = f.run({"nvml#1", "fork", "init", "alloc:a:2M", "fill:a:2M:9", "free:a", "endfork", "nvml#2"});
    INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
    CHECK(line_of(r.out, "nvml#1")["rc"] == "0");
    CHECK(line_of(r.out, "child alloc:a:2M")["rc"] == "0");
    CHECK(line_of(r.out, "child fill:a:2M:9")["ok"] == "1");
    CHECK(line_of(r.out, "child free:a")["rc"] == "0");
    CHECK(line_of(r.out, "fork")["rc"] == "0");
    CHECK(line_of(r.out, "nvml#2")["rc"] == "0");
    const Counters c = f.daemon->counters();
    CHECK(c.hellos == 2);
    CHECK(c.hello_pids.size() == 2);
    CHECK(c.hellos_with_old_session == 0);
    CHECK(c.grants_alloc == 1);
    CHECK(c.releases == 1);
    CHECK(c.usage_queries == 4);  // each nvml step asks for both memory queries
  }
  SECTION("parent holds grants; the child cannot use CUDA and gives nothing back") {
    const auto r = f.run({"init", "alloc:a:2M", "fork", "alloc:b:2M", "free:a", "endfork", "fill:a:2M:1", "free:a"});
    INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
    CHECK(line_of(r.out, "child alloc:b:2M")["rc"] == num(CUDA_ERROR_NOT_INITIALIZED));
    CHECK(line_of(r.out, "fill:a:2M:1")["ok"] == "1");
    CHECK(line_of(r.out, "free:a")["rc"] == "0");
    const Counters c = f.daemon->counters();
    CHECK(c.hellos == 1);
    CHECK(c.grants_alloc == 1);
    CHECK(c.releases == 1);
    CHECK(c.releases_unknown == 0);
  }
}

TEST_CASE("VLAKE_DISABLE=1 passes everything through where the daemon allows it") {
  FakeDaemonOptions o = with_limit(4 * MiB);
  o.allow_disable = true;
  Fixture f(o);
  const auto r = f.run({"init", "alloc:a:2M", "fill:a:2M:8", "alloc:b:8M", "info", "totalmem", "create:h:2M",
                        "release:h", "free:a", "free:b"},
                       {{"VLAKE_DISABLE", "1"}});
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  CHECK(line_of(r.out, "alloc:a:2M")["rc"] == "0");
  CHECK(line_of(r.out, "fill:a:2M:8")["ok"] == "1");
  CHECK(line_of(r.out, "alloc:b:8M")["rc"] == "0");  // over the 4 MiB limit: not the hook's business
  CHECK(line_of(r.out, "info")["total"] == num(kCapacity));
  CHECK(line_of(r.out, "totalmem")["bytes"] == num(kCapacity));
  CHECK(line_of(r.out, "create:h:2M")["rc"] == "0");
  CHECK(line_of(r.out, "free:a")["rc"] == "0");
  const Counters c = f.daemon->counters();
  CHECK(c.hellos == 1);  // the one that asked
  CHECK((c.hello_flags & vlake::proto::kHelloPassthrough) != 0);
  CHECK(c.grants_alloc == 0);
  CHECK(c.usage_queries == 0);
}

TEST_CASE("VLAKE_DISABLE=1 that the quota file does not allow leaves the hook on") {
  Fixture f(with_limit(4 * MiB));
  const auto r = f.run({"init", "alloc:a:2M", "alloc:b:8M", "info", "free:a"}, {{"VLAKE_DISABLE", "1"}});
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  CHECK(line_of(r.out, "alloc:a:2M")["rc"] == "0");
  CHECK(line_of(r.out, "alloc:b:8M")["rc"] == num(CUDA_ERROR_OUT_OF_MEMORY));
  CHECK(line_of(r.out, "info")["total"] == num(4 * MiB));
  CHECK(count_lines(r.err, "VLAKE_DISABLE is set but the quota file does not allow it for tenant user:test") == 1);
  const Counters c = f.daemon->counters();
  CHECK(c.hellos == 1);  // the session of the Hello that asked is kept
  CHECK(c.grants_alloc == 1);
  CHECK(c.refusals == 1);
}

TEST_CASE("VLAKE_DISABLE=1 without a reachable daemon passes everything through") {
  const auto r = run_tenant({"init", "alloc:a:2M", "fill:a:2M:5", "free:a"},
                            {{"VLAKE_SOCKET", fresh_socket_path()}, {"VLAKE_DISABLE", "1"}});
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  CHECK(line_of(r.out, "alloc:a:2M")["rc"] == "0");
  CHECK(line_of(r.out, "fill:a:2M:5")["ok"] == "1");
  CHECK(line_of(r.out, "free:a")["rc"] == "0");
  CHECK(count_lines(r.err, "cannot reach vlaked") == 0);
}

TEST_CASE("threads allocating concurrently") {
  Fixture f(with_limit(256 * MiB));
  const auto r = f.run({"init", "threads:8:25:3M", "info"});
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  auto t = line_of(r.out, "threads:8:25:3M");
  CHECK(t["rc"] == "0");
  CHECK(t["errors"] == "0");
  CHECK(t["overlaps"] == "0");
  CHECK(line_of(r.out, "info")["free"] == num(256 * MiB));
  const Counters c = f.daemon->counters();
  check_all_returned(c, 200);
  CHECK(c.hellos == 1);
}

TEST_CASE("NVML memory queries report the tenant's limit and usage") {
  Fixture f(with_limit(64 * MiB));
  const auto r = f.run({"init", "alloc:a:6M", "nvml", "free:a"});
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  auto n = line_of(r.out, "nvml");
  CHECK(n["rc"] == "0");
  CHECK(n["mem_lib"] == "libvlake-hook.so");
  CHECK(n["mem2_lib"] == "libvlake-hook.so");
  CHECK(n["total"] == num(64 * MiB));
  CHECK(n["used"] == num(6 * MiB));
  CHECK(n["free"] == num(58 * MiB));
  CHECK(n["v2_total"] == num(64 * MiB));
  CHECK(n["v2_used"] == num(6 * MiB));
  CHECK(n["v2_free"] == num(58 * MiB));
  CHECK(n["v2_reserved"] == "0");
}
