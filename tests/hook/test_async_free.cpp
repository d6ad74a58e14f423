// Stream-ordered frees and locally answered memory queries, end to end on the simulator against
// the fake daemon (docs/hook.md, "Stream-ordered frees" and "Memory queries").
#include <unistd.h>
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "daemon_case.hpp"
#include "fake_daemon.hpp"
#include "support.hpp"
#include "vlake/common/cuda_api.hpp"

using namespace hooktest;

namespace {

std::uint64_t count_of(const std::string& out, const std::string& step) {
  return std::stoull(line_of(out, step).at("count"));
}

// A unique path for a rendezvous file of this test process; removed when it goes.
struct TempPath {
  explicit TempPath(const std::string& tag) : path("/tmp/vlake-hook-test-" + std::to_string(::getpid()) + "-" + tag) {
    std::remove(path.c_str());
  }
  ~TempPath() { std::remove(path.c_str()); }
  TempPath(const TempPath&) = delete;
  TempPath& operator=(const TempPath&) = delete;
  std::string path;
};

}  // namespace

TEST_CASE("cuMemFreeAsync does not synchronize the caller and frees once the stream passed the free") {
  Fixture f(with_limit(64 * MiB));
  const bool ptds = GENERATE(false, true);
  std::vector<std::string> args;
  if (ptds) args.push_back("--ptds");
  for (const char* s :
       {"init", "async:x:6M", "fill:x:6M:4", "info#1", "calls:cuStreamSynchronize#1", "calls:cuCtxSynchronize#1",
        "calls:cuEventRecord#1", "freeasync:x", "range:x:0", "calls:cuStreamSynchronize#2", "calls:cuCtxSynchronize#2",
        "calls:cuEventRecord#2", "freeasync:x#again", "sleep:200", "info#2", "calls:cuEventQuery"}) {
    args.emplace_back(s);
  }
  const auto r = f.run(args);
  INFO("ptds " << ptds << "\nstdout:\n" << r.out << "\nstderr:\n" << r.err);
  REQUIRE(r.status == 0);
  CHECK(line_of(r.out, "info#1")["free"] == num(58 * MiB));
  CHECK(line_of(r.out, "freeasync:x")["rc"] == "0");
  // The caller's thread neither synchronized the stream nor the context: one event was recorded.
  CHECK(count_of(r.out, "calls:cuStreamSynchronize#2") == count_of(r.out, "calls:cuStreamSynchronize#1"));
  CHECK(count_of(r.out, "calls:cuCtxSynchronize#2") == count_of(r.out, "calls:cuCtxSynchronize#1"));
  CHECK(count_of(r.out, "calls:cuEventRecord#2") == count_of(r.out, "calls:cuEventRecord#1") + 1);
  // The pointer left the allocation table at once: the hook no longer answers for the whole
  // 6 MiB (stitched from two handles, the driver knows chunks at most) and a second free fails.
  CHECK(line_of(r.out, "range:x:0")["size"] != num(6 * MiB));
  CHECK(line_of(r.out, "freeasync:x#again")["rc"] == num(CUDA_ERROR_INVALID_VALUE));
  // The worker asked the event and released the grant: the daemon counts the memory free.
  CHECK(count_of(r.out, "calls:cuEventQuery") >= 1);
  CHECK(line_of(r.out, "info#2")["free"] == num(64 * MiB));
  const Counters c = f.daemon->counters();
  check_all_returned(c, 1);
}

TEST_CASE("cuMemFreeAsync with the reserve: the block is reused after the free completed and its event is pooled") {
  Fixture f(with_limit(64 * MiB));
  const auto r = f.run({"init", "async:a:2M", "freeasync:a", "sleep:100", "async:b:2M", "freeasync:b", "sleep:100",
                        "alloc:c:2M", "fill:c:2M:7", "calls:cuEventCreate", "calls:cuEventDestroy_v2", "free:c"},
                       {{"VLAKE_RESERVE", "256MiB"}});
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  REQUIRE(r.status == 0);
  const std::string p = line_of(r.out, "async:a:2M")["ptr"];
  CHECK(line_of(r.out, "freeasync:a")["rc"] == "0");
  CHECK(line_of(r.out, "async:b:2M")["ptr"] == p);  // warm: taken back from the reserve
  CHECK(line_of(r.out, "alloc:c:2M")["ptr"] == p);
  CHECK(line_of(r.out, "fill:c:2M:7")["ok"] == "1");
  CHECK(count_of(r.out, "calls:cuEventCreate") == 1);  // the second free reused the first's event
  CHECK(count_of(r.out, "calls:cuEventDestroy_v2") == 0);
  const Counters c = f.daemon->counters();
  CHECK(c.grants_alloc == 1);
}

TEST_CASE("cuMemFreeAsync right before exit still gives the memory back") {
  Fixture f(with_limit(64 * MiB));
  const auto r = f.run({"init", "async:a:2M", "async:b:8M", "alloc:c:4M", "freeasync:a", "freeasync:b", "freeasync:c"});
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  REQUIRE(r.status == 0);
  for (const char* step : {"freeasync:a", "freeasync:b", "freeasync:c"}) {
    INFO(step);
    CHECK(line_of(r.out, step)["rc"] == "0");
  }
  const Counters c = f.daemon->counters();
  check_all_returned(c, 3);  // released by the worker or at exit, not left to the disconnection
}

TEST_CASE("memory freed with cuMemFreeAsync is available again once the application synchronized the stream") {
  // 40 MiB of a 64 MiB limit: each allocation needs the previous one back. The worker may not
  // have completed the free yet when the next allocation arrives: the refused allocation
  // completes the frees its stream has passed (or waits for the worker's) and asks again.
  Fixture f(with_limit(64 * MiB));
  const bool reserve = GENERATE(false, true);
  const auto r = f.run({"init", "asyncloop:200:40M", "info"}, {{"VLAKE_RESERVE", reserve ? "256MiB" : "0"}});
  INFO("reserve " << reserve << "\nstdout:\n" << r.out << "\nstderr:\n" << r.err);
  REQUIRE(r.status == 0);
  CHECK(line_of(r.out, "asyncloop:200:40M")["failures"] == "0");
  CHECK(line_of(r.out, "asyncloop:200:40M")["rc"] == "0");
  CHECK(line_of(r.out, "info")["free"] == num(64 * MiB));
  CHECK(count_lines(r.err, "out of memory") == 0);
}

TEST_CASE("cuMemGetInfo away from the limit is answered locally and exact after this process's changes") {
  Fixture f(with_limit(std::uint64_t{1} << 30));
  const auto r = f.run({"init", "alloc:a:64M", "infoloop:2000", "totalmem", "info#1", "alloc:b:100M", "info#2",
                        "free:a", "info#3", "infoloop:500"});
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  REQUIRE(r.status == 0);
  auto loop = line_of(r.out, "infoloop:2000");
  CHECK(loop["rc"] == "0");
  CHECK(loop["free"] == num(1024 * MiB - 64 * MiB));
  CHECK(loop["distinct"] == "1");
  CHECK(line_of(r.out, "totalmem")["bytes"] == num(1024 * MiB));
  CHECK(line_of(r.out, "info#1")["free"] == num(1024 * MiB - 64 * MiB));
  // This process's own grants and releases make the cached answer stale at once.
  CHECK(line_of(r.out, "info#2")["free"] == num(1024 * MiB - 164 * MiB));
  CHECK(line_of(r.out, "info#3")["free"] == num(1024 * MiB - 100 * MiB));
  CHECK(line_of(r.out, "infoloop:500")["free"] == num(1024 * MiB - 100 * MiB));
  // 2500 cuMemGetInfo, a cuDeviceTotalMem and 3 more queries: a query after each of the 3
  // changes, plus one per 100 ms the loops spanned (and a few between the steps).
  const long long ms = std::stoll(loop["ms"]) + std::stoll(line_of(r.out, "infoloop:500")["ms"]);
  const Counters c = f.daemon->counters();
  INFO("usage queries " << c.usage_queries << " in loops of " << ms << " ms");
  CHECK(c.usage_queries >= 3);
  CHECK(c.usage_queries <= 3 + 5 + ms / 100 + 2);
  CHECK(c.usage_queries <= 2500 / 10);  // far fewer round trips than calls, however slow
}

TEST_CASE("cuMemGetInfo near the limit is exact right after another process of the tenant allocated") {
  Fixture f(with_limit(512 * MiB));
  TempPath first("first");
  TempPath second("second");
  TempPath done("done");
  RunResult other;
  // The other process allocates once this one is near its limit and holds it until told.
  std::thread t([&] {
    other = run_tenant(
        {"waitfile:" + first.path, "init", "alloc:o:64M", "touch:" + second.path, "waitfile:" + done.path, "free:o"},
        {{"VLAKE_SOCKET", f.daemon->socket_path()}});
  });
  const auto r = f.run({"init", "alloc:a:400M", "info#1", "infoloop:50", "touch:" + first.path,
                        "waitfile:" + second.path, "info#2", "touch:" + done.path});
  t.join();
  INFO("stdout:\n"
       << r.out << "\nstderr:\n"
       << r.err << "\nother stdout:\n"
       << other.out << "\nother stderr:\n"
       << other.err);
  REQUIRE(r.status == 0);
  REQUIRE(other.status == 0);
  CHECK(line_of(other.out, "alloc:o:64M")["rc"] == "0");
  CHECK(line_of(r.out, "info#1")["free"] == num(112 * MiB));
  CHECK(line_of(r.out, "infoloop:50")["free"] == num(112 * MiB));
  CHECK(line_of(r.out, "info#2")["free"] == num(48 * MiB));  // no cached 112 MiB
  // Within 256 MiB of the limit every query reached the daemon.
  const Counters c = f.daemon->counters();
  CHECK(c.usage_queries >= 52);
}

// VLAKE_SIM_EVENT_LAG_MS: the simulated GPU reports work complete only that long after it was
// queued (events, stream and context synchronizations), as a busy GPU would.

TEST_CASE(
    "cuMemFreeAsync on a busy GPU: the memory is neither reused nor released before the stream reached the free") {
  Fixture f(with_limit(64 * MiB));
  const bool reserve = GENERATE(false, true);
  const auto r = f.run({"init", "async:a:2M", "calls:cuEventQuery#before", "freeasync:a", "async:b:2M", "info#pending",
                        "sleep:700", "calls:cuEventQuery#after", "info#done", "async:c:2M"},
                       {{"VLAKE_SIM_EVENT_LAG_MS", "300"}, {"VLAKE_RESERVE", reserve ? "256MiB" : "0"}});
  INFO("reserve " << reserve << "\nstdout:\n" << r.out << "\nstderr:\n" << r.err);
  REQUIRE(r.status == 0);
  const std::string a = line_of(r.out, "async:a:2M")["ptr"];
  CHECK(line_of(r.out, "freeasync:a")["rc"] == "0");
  // While the stream has not reached the free, the memory stays charged and unused.
  CHECK(line_of(r.out, "async:b:2M")["ptr"] != a);
  CHECK(line_of(r.out, "info#pending")["free"] == num(60 * MiB));
  // The worker polled the event (it answered CUDA_ERROR_NOT_READY) and completed the free: in
  // the reserve it counts as free and is reused; without, it went back to the daemon.
  CHECK(count_of(r.out, "calls:cuEventQuery#after") - count_of(r.out, "calls:cuEventQuery#before") >= 3);
  CHECK(line_of(r.out, "info#done")["free"] == num(62 * MiB));
  const Counters c = f.daemon->counters();
  if (reserve) {
    CHECK(line_of(r.out, "async:c:2M")["ptr"] == a);
    CHECK(c.grants_alloc == 2);
  } else {
    CHECK(c.grants_alloc == 3);
    CHECK(c.releases >= 1);
  }
}

TEST_CASE("cuMemFreeAsync on a busy GPU: free then synchronize then allocate at the limit succeeds") {
  Fixture f(with_limit(64 * MiB));
  const bool reserve = GENERATE(false, true);
  const auto r = f.run({"init", "asyncloop:10:40M", "info"},
                       {{"VLAKE_SIM_EVENT_LAG_MS", "20"}, {"VLAKE_RESERVE", reserve ? "256MiB" : "0"}});
  INFO("reserve " << reserve << "\nstdout:\n" << r.out << "\nstderr:\n" << r.err);
  REQUIRE(r.status == 0);
  CHECK(line_of(r.out, "asyncloop:10:40M")["failures"] == "0");
  CHECK(count_lines(r.err, "out of memory") == 0);
}

TEST_CASE("cuMemFreeAsync on a busy GPU at exit: frees get one second and exit never hangs on a stream") {
  Fixture f(with_limit(64 * MiB));
  SECTION("the stream reaches the free within the second: released by the process") {
    const auto r =
        f.run({"init", "async:a:2M", "async:b:6M", "freeasync:a", "freeasync:b"}, {{"VLAKE_SIM_EVENT_LAG_MS", "300"}});
    INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
    REQUIRE(r.status == 0);
    const Counters c = f.daemon->counters();
    CHECK(c.releases == 2);
    CHECK(c.outstanding == 0);
  }
  SECTION("it does not: left to the daemon, which takes the grants back at the disconnection") {
    const auto start = std::chrono::steady_clock::now();
    const auto r = f.run({"init", "async:a:2M", "freeasync:a"}, {{"VLAKE_SIM_EVENT_LAG_MS", "8000"}});
    const auto took = std::chrono::steady_clock::now() - start;
    INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
    REQUIRE(r.status == 0);
    CHECK(took < std::chrono::seconds(6));
    const Counters c = f.daemon->counters();
    CHECK(c.releases == 0);
    CHECK(c.outstanding == 0);
  }
}
