// The hook's local reserve against the fake daemon: warm reuse without daemon messages, the byte
// cap, the age limit, a refusal that empties the reserve, and the pressure protocol.
#include <dirent.h>
#include <unistd.h>
#include <catch2/catch.hpp>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "daemon_case.hpp"
#include "fake_daemon.hpp"
#include "support.hpp"

using namespace hooktest;

namespace {

Env reserve(const std::string& cap, const std::string& age = "30s") {
  return {{"VLAKE_RESERVE", cap}, {"VLAKE_RESERVE_AGE", age}};
}

}  // namespace

TEST_CASE("reserve: a freed allocation is reused with no daemon message, contents kept private") {
  Fixture f(with_limit(256 * MiB));
  const auto r = f.run({"init", "alloc:a:6M", "fill:a:6M:7", "free:a", "alloc:b:6M", "check:b:6M:7", "free:b",
                        "alloc:c:5M", "free:c", "info", "sleep:400"},
                       reserve("64MiB"));
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  REQUIRE(line_of(r.out, "alloc:a:6M")["rc"] == "0");
  REQUIRE(line_of(r.out, "alloc:b:6M")["rc"] == "0");
  // Same process, same memory: reuse inside one tenant needs no scrub.
  CHECK(line_of(r.out, "alloc:b:6M")["ptr"] == line_of(r.out, "alloc:a:6M")["ptr"]);
  CHECK(line_of(r.out, "check:b:6M:7")["ok"] == "1");
  // 5 MiB rounds to 6 MiB: the same block fits.
  CHECK(line_of(r.out, "alloc:c:5M")["ptr"] == line_of(r.out, "alloc:a:6M")["ptr"]);
  // The reserve is this process's free memory.
  CHECK(line_of(r.out, "info")["free"] == std::to_string(256 * MiB));
  const Counters c = f.daemon->counters();
  CHECK(c.grants_alloc == 1);
  CHECK(c.releases == 0);
  CHECK(c.outstanding == 0);  // process exit returned it
  CHECK((c.hello_flags & vlake::proto::kHelloPressure) != 0);
  CHECK(c.reserve_reports >= 1);
  CHECK(c.last_reserve_bytes == 6 * MiB);
  CHECK(c.last_reserve_blocks == 1);
}

TEST_CASE("reserve: a much larger block is not used for a small request") {
  Fixture f(with_limit(256 * MiB));
  const auto r = f.run({"init", "alloc:a:20M", "free:a", "alloc:b:2M", "free:b"}, reserve("64MiB"));
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  CHECK(line_of(r.out, "alloc:b:2M")["rc"] == "0");
  CHECK(line_of(r.out, "alloc:b:2M")["ptr"] != line_of(r.out, "alloc:a:20M")["ptr"]);
  CHECK(f.daemon->counters().grants_alloc == 2);
}

TEST_CASE("reserve: VLAKE_RESERVE=0 sends every alloc and free to the daemon") {
  Fixture f(with_limit(256 * MiB));
  const auto r = f.run({"init", "alloc:a:6M", "free:a", "alloc:b:6M", "free:b"}, reserve("0"));
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  const Counters c = f.daemon->counters();
  CHECK(c.grants_alloc == 2);
  CHECK(c.releases == 2);
  // Pressure is read all the same (a reclaim callback may be registered later); nothing to report.
  CHECK((c.hello_flags & vlake::proto::kHelloPressure) != 0);
  CHECK(c.reserve_reports == 0);
}

TEST_CASE("reserve: the byte cap returns the least recently freed blocks") {
  Fixture f(with_limit(256 * MiB));
  const auto r = f.run({"init", "alloc:a:6M", "alloc:b:6M", "free:a", "free:b", "sleep:300", "alloc:c:6M", "free:c"},
                       reserve("8MiB"));
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  // a left (oldest), b stayed: c reuses b.
  CHECK(line_of(r.out, "alloc:c:6M")["ptr"] == line_of(r.out, "alloc:b:6M")["ptr"]);
  const Counters c = f.daemon->counters();
  CHECK(c.grants_alloc == 2);
  CHECK(c.releases == 1);
}

TEST_CASE("reserve: idle blocks go back after VLAKE_RESERVE_AGE") {
  Fixture f(with_limit(256 * MiB));
  const auto r =
      f.run({"init", "alloc:a:6M", "free:a", "sleep:600", "alloc:b:6M", "free:b"}, reserve("64MiB", "200ms"));
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  const Counters c = f.daemon->counters();
  CHECK(c.grants_alloc == 2);
  CHECK(c.releases >= 1);
  CHECK(c.last_reserve_bytes == 0);
}

TEST_CASE("reserve: a refusal empties the reserve and the request is granted on the second try") {
  Fixture f(with_limit(10 * MiB));
  const auto r = f.run({"init", "alloc:a:6M", "free:a", "alloc:b:8M", "free:b"}, reserve("64MiB"));
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  CHECK(line_of(r.out, "alloc:b:8M")["rc"] == "0");
  CHECK(r.err.find("out of memory") == std::string::npos);  // no refusal line: it was served
  const Counters c = f.daemon->counters();
  CHECK(c.refusals == 1);
  CHECK(c.grants_alloc == 2);
  CHECK(c.releases >= 1);
}

TEST_CASE("reserve: a refusal that stands after emptying the reserve is reported once") {
  Fixture f(with_limit(10 * MiB));
  const auto r = f.run({"init", "alloc:a:6M", "free:a", "alloc:b:12M"}, reserve("64MiB"));
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  CHECK(line_of(r.out, "alloc:b:12M")["rc"] == "2");  // CUDA_ERROR_OUT_OF_MEMORY
  CHECK(r.err.find("out of memory on GPU 0") != std::string::npos);
  const Counters c = f.daemon->counters();
  CHECK(c.refusals == 2);
  CHECK(c.releases == 1);
}

TEST_CASE("reserve: Pressure from the daemon makes the hook return its reserve") {
  FakeDaemonOptions o = with_limit(256 * MiB);
  o.pressure_on_report = true;
  Fixture f(o);
  const auto r = f.run({"init", "alloc:a:6M", "alloc:b:2M", "free:a", "free:b", "sleep:800"}, reserve("64MiB"));
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  const Counters c = f.daemon->counters();
  CHECK(c.pressure_sent >= 1);
  CHECK(c.releases == 2);
  CHECK(c.last_reserve_bytes == 0);
}

TEST_CASE("reclaim: a Pressure the reserve cannot cover runs the registered callback and what it frees goes back") {
  FakeDaemonOptions o = with_limit(256 * MiB);
  o.pressure_on_report = true;  // answers the report that says kReportReclaim with a Pressure
  Fixture f(o);
  const auto r = f.run({"init", "alloc:a:6M", "reclaim:a", "reclaimwait:5000", "sleep:300"}, reserve("64MiB"));
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  CHECK(r.out.find("reclaim:a rc=0") != std::string::npos);
  // The fake daemon answers every report that says kReportReclaim with a Pressure, so the
  // callback may run more than once; its first run freed `a`.
  const auto wait = line_of(r.out, "reclaimwait:5000");
  CHECK(std::stoi(wait.at("count")) >= 1);
  CHECK(wait.at("freed_rc") == "0");
  const Counters c = f.daemon->counters();
  CHECK(c.reclaim_reports >= 1);
  CHECK(c.pressure_sent >= 1);
  CHECK(c.releases == 1);            // the callback's free went back to the daemon
  CHECK(c.last_reserve_bytes == 0);  // not kept in the reserve
}

TEST_CASE("reclaim: without a registered callback a Pressure only returns the reserve") {
  FakeDaemonOptions o = with_limit(256 * MiB);
  o.pressure_on_report = true;
  Fixture f(o);
  const auto r = f.run({"init", "alloc:a:6M", "alloc:b:2M", "free:b", "reclaimwait:600"}, reserve("64MiB"));
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  CHECK(r.out.find("reclaimwait:600 count=0 freed_rc=-1") != std::string::npos);
  const Counters c = f.daemon->counters();
  CHECK(c.reclaim_reports == 0);
  CHECK(c.releases == 1);  // b, returned under pressure (a stays allocated: nothing frees it)
}

TEST_CASE("reserve: a Pressure message arriving before a grant reply is kept, the reply read") {
  FakeDaemonOptions o = with_limit(256 * MiB);
  o.pressure_before_grant = 1;  // just before the reply to the first alloc grant
  Fixture f(o);
  const auto r =
      f.run({"init", "alloc:a:6M", "free:a", "alloc:b:10M", "fill:b:10M:3", "check:b:10M:3", "sleep:400", "free:b"},
            reserve("64MiB"));
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  CHECK(line_of(r.out, "alloc:b:10M")["rc"] == "0");
  CHECK(line_of(r.out, "check:b:10M:3")["ok"] == "1");
  const Counters c = f.daemon->counters();
  CHECK(c.pressure_sent == 1);
  CHECK(c.grants_alloc == 2);
  CHECK(c.releases == 1);  // a's block went back on the pressure; b stayed in the reserve
  CHECK(c.hellos == 1);    // no reconnection: the pressure was not taken for a bad reply
}

TEST_CASE("reserve: threads allocating and freeing concurrently never share a block") {
  Fixture f(with_limit(512 * MiB));
  const auto r = f.run({"init", "threads:8:50:3M", "info"}, reserve("256MiB"));
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  auto t = line_of(r.out, "threads:8:50:3M");
  CHECK(t["rc"] == "0");
  CHECK(t["errors"] == "0");
  CHECK(t["overlaps"] == "0");
  const Counters c = f.daemon->counters();
  CHECK(c.grants_alloc <= 16);  // at most 8 live at a time, plus reuse
  CHECK(c.outstanding == 0);
}

TEST_CASE("reserve: VLAKE_RESERVE_STATS writes the reuse statistics at exit") {
  char dir[] = "/tmp/vlake-reserve-stats-XXXXXX";
  REQUIRE(::mkdtemp(dir) != nullptr);
  const std::string prefix = std::string(dir) + "/stats";
  Fixture f(with_limit(256 * MiB));
  // a: reused after ~300 ms; b: reused at once; the 40M request misses (and so does each first one).
  const auto r = f.run({"init", "alloc:a:6M", "alloc:b:4M", "free:a", "sleep:300", "free:b", "alloc:c:6M", "alloc:d:4M",
                        "alloc:e:40M", "free:c", "free:d", "free:e"},
                       {{"VLAKE_RESERVE", "64MiB"}, {"VLAKE_RESERVE_STATS", prefix}});
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  REQUIRE(r.status == 0);
  std::vector<std::string> files;
  if (DIR* d = ::opendir(dir)) {
    while (const dirent* e = ::readdir(d)) {
      if (e->d_name[0] != '.') files.emplace_back(e->d_name);
    }
    ::closedir(d);
  }
  REQUIRE(files.size() == 1);
  CHECK_THAT(files[0], Catch::StartsWith("stats.") && Catch::EndsWith(".json"));
  const std::string path = std::string(dir) + "/" + files[0];
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  std::string json = text.str();
  REQUIRE_FALSE(json.empty());
  CHECK(json.back() == '\n');
  json.pop_back();
  ::unlink(path.c_str());
  ::rmdir(dir);
  CHECK_THAT(json, Catch::Contains("\"reserve_cap\":67108864"));
  CHECK_THAT(json, Catch::Contains("\"reuse_bytes\":" + std::to_string(10 * MiB) + ","));
  CHECK_THAT(json, Catch::Contains("\"misses\":3,"));
  CHECK_THAT(json, Catch::Contains("\"puts\":5,"));
  // a: idle >= 256 ms (bucket 9: [256, 512) ms or later), 10 MiB freed at or after it
  // (bucket 4: (8, 16] MiB); b: under 256 ms, only itself (4 MiB: bucket 2).
  CHECK_THAT(json, Catch::Matches(R"(.*"reuses":\[.*\[(9|10|11),4,1\].*)"));
  CHECK_THAT(json, Catch::Matches(R"(.*"reuses":\[\[[0-8],2,1\].*)"));
  CHECK(f.daemon->counters().grants_alloc == 3);
}

TEST_CASE("reserve: VLAKE_PREFETCH fetches the missing size ahead and the next allocation of it is warm") {
  Fixture f(with_limit(256 * MiB));
  Env env = reserve("64MiB");
  env.emplace_back("VLAKE_PREFETCH", "4");
  const auto r = f.run({"init", "alloc:a:2M", "sleep:300", "alloc:b:2M", "sleep:300", "free:a", "free:b", "info"}, env);
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  REQUIRE(line_of(r.out, "alloc:a:2M")["rc"] == "0");
  REQUIRE(line_of(r.out, "alloc:b:2M")["rc"] == "0");
  CHECK(line_of(r.out, "alloc:b:2M")["ptr"] != line_of(r.out, "alloc:a:2M")["ptr"]);
  const Counters c = f.daemon->counters();
  // a's grant, the block fetched after a's miss (b's), and its replacement after b used it.
  CHECK(c.grants_alloc == 3);
  CHECK(c.last_reserve_bytes >= 2 * MiB);
}

TEST_CASE("reserve: VLAKE_PREFETCH fetches nothing when the tenant has no room for it") {
  Fixture f(with_limit(6 * MiB));  // after a 2 MiB grant, 4 MiB left: less than 4 x 2 MiB
  Env env = reserve("64MiB");
  env.emplace_back("VLAKE_PREFETCH", "4");
  const auto r = f.run({"init", "alloc:a:2M", "sleep:300", "alloc:b:2M", "free:a", "free:b"}, env);
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  CHECK(line_of(r.out, "alloc:b:2M")["rc"] == "0");
  CHECK(f.daemon->counters().grants_alloc == 2);
}
