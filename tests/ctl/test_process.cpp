// vlakectl as a process: vlaked on the simulator (tests/pool harness), two tenants granted
// memory by helper processes, and vlakectl's JSON/text output, errors, exit codes and --watch.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

#include "ctl_process.hpp"
#include "harness.hpp"
#include "json_parse.hpp"
#include "units.hpp"

using namespace vlake;
using namespace vlake::ctltest;
using namespace vlake::pooltest;

using namespace vlake::testunits;  // kMiB, kGiB, MiB (units.hpp)

namespace {

const char* const kConfig =
    "version: 1\n"
    "default:\n"
    "  limit: 256MiB\n"
    "users:\n"
    "  - uid: 4301\n"
    "    limit: 64MiB\n";

const Json& find_named(const Json& list, const std::string& name) {
  for (const Json& x : list.items) {
    if (x.at("name").str() == name) return x;
  }
  FAIL("no entry named " << name);
  throw std::logic_error("unreachable");
}

Json ctl_json(const std::vector<std::string>& args) {
  const CtlResult r = run_ctl(args);
  INFO("vlakectl stderr: " << r.err);
  REQUIRE(r.exit_code == 0);
  REQUIRE(r.err.empty());
  return parse_json(r.out);
}

}  // namespace

TEST_CASE("vlakectl: top, tenants and pool match the grants of two tenants", "[process]") {
  DaemonProcess d("ctl", kConfig);
  REQUIRE(d.start());
  Helper a(d.node, 4301, 0);
  Helper b(d.node, 4302, 0);
  REQUIRE(a.ok("connect " + d.socket).at("name") == "user:4301");
  REQUIRE(b.ok("connect " + d.socket).at("name") == "uid:4302");
  const auto a1 = a.ok("grant " + std::to_string(8 * kMiB));
  const auto a2 = a.ok("grant " + std::to_string(4 * kMiB));
  REQUIRE(num(a1, "status") == 0);
  REQUIRE(num(a2, "status") == 0);
  REQUIRE(num(b.ok("grant " + std::to_string(16 * kMiB)), "status") == 0);
  REQUIRE(num(b.ok("grant " + std::to_string(6 * kMiB) + " counted"), "status") == 0);
  REQUIRE(num(a2, "used") == 12 * kMiB);

  // top --json
  Json top = ctl_json({"--state", d.state, "top", "--json"});
  CHECK(top.at("state").str() == d.state);
  CHECK(top.at("daemon").at("pid").u64() == static_cast<std::uint64_t>(d.pid()));
  CHECK(top.at("daemon").at("running").boolean());
  REQUIRE(top.at("gpus").size() == 1);
  const Json& g = top.at("gpus").at(0);
  CHECK(g.at("index").u64() == 0);
  CHECK(g.at("total").u64() == kGiB);
  CHECK(g.at("granted").u64() == 28 * kMiB);  // handles only; the counted grant has none
  CHECK(g.at("uuid").str().rfind("GPU-", 0) == 0);
  REQUIRE(g.at("tenants").size() == 2);
  const Json& ta = find_named(g.at("tenants"), "user:4301");
  CHECK(ta.at("used").u64() == 12 * kMiB);
  CHECK(ta.at("granted").u64() == 12 * kMiB);
  CHECK(ta.at("limit").u64() == 64 * kMiB);
  CHECK(ta.at("guaranteed").is_null());
  CHECK(ta.at("sessions").u64() == 1);
  CHECK(ta.at("pids").at(0).u64() == static_cast<std::uint64_t>(a.pid()));
  CHECK(ta.at("share_percent").num() == Approx(12.0 * 100 / 1024).margin(0.006));
  const Json& tb = find_named(g.at("tenants"), "uid:4302");
  CHECK(tb.at("used").u64() == 22 * kMiB);
  CHECK(tb.at("limit").u64() == 256 * kMiB);
  CHECK(tb.at("pids").at(0).u64() == static_cast<std::uint64_t>(b.pid()));

  // tenants --json (global option after the command, state from the environment)
  const CtlResult tr = run_ctl({"tenants", "--json"}, -1, -1, {"VLAKE_STATE=" + d.state});
  INFO(tr.err);
  REQUIRE(tr.exit_code == 0);
  const Json tenants = parse_json(tr.out);
  REQUIRE(tenants.at("tenants").size() == 2);
  const Json& xa = find_named(tenants.at("tenants"), "user:4301");
  CHECK(xa.at("grant_count").u64() == 2);
  REQUIRE(xa.at("sessions").size() == 1);
  CHECK(xa.at("sessions").at(0).at("pid").u64() == static_cast<std::uint64_t>(a.pid()));
  CHECK(xa.at("sessions").at(0).at("uid").u64() == 4301);
  CHECK(xa.at("sessions").at(0).at("state").str() == "connected");
  CHECK(xa.at("sessions").at(0).at("grants").u64() == 2);
  CHECK(xa.at("gpus").at(0).at("granted").u64() == 12 * kMiB);
  const Json& xb = find_named(tenants.at("tenants"), "uid:4302");
  CHECK(xb.at("grant_count").u64() == 2);
  CHECK(xb.at("gpus").at(0).at("used").u64() == 22 * kMiB);
  CHECK(xb.at("gpus").at(0).at("limit").u64() == 256 * kMiB);

  // pool --json
  const Json pool = ctl_json({"pool", "--state=" + d.state, "--json"});
  CHECK(pool.at("daemon").at("starts").u64() == 1);
  CHECK(pool.at("sessions").u64() == 2);
  CHECK(pool.at("grants").u64() == 4);
  const Json& pg = pool.at("gpus").at(0);
  CHECK(pg.at("granted").u64() == 28 * kMiB);
  CHECK(pg.at("counted").u64() == 6 * kMiB);
  CHECK(pg.at("pool_bytes").u64() == pg.at("granted").u64() + pg.at("free").u64());
  CHECK(pg.at("total").u64() == kGiB);
  CHECK(pool.at("counters").at("grants").u64() == 4);
  CHECK(pool.at("counters").at("denials_over_limit").u64() == 0);
  CHECK(pool.at("counters").at("sessions_opened").u64() == 2);

  // Text output names the tenants with human sizes.
  const CtlResult text = run_ctl({"--state", d.state, "top"});
  INFO(text.out);
  REQUIRE(text.exit_code == 0);
  CHECK(text.out.find("GPU 0  GPU-") != std::string::npos);
  CHECK(text.out.find("total 1.0 GiB  pool: granted 28.0 MiB") != std::string::npos);
  CHECK(text.out.find("user:4301  12.0 MiB       0 B      0 B   64.0 MiB           -   1.2%  ") != std::string::npos);
  CHECK(text.out.find("s      1  " + std::to_string(a.pid())) != std::string::npos);  // IDLE in seconds, PROCS, PIDS
  CHECK(text.out.find("\x1b[") == std::string::npos);                                 // no ANSI codes in a pipe

  // A refused grant and a release show up at once.
  CHECK(num(a.ok("grant " + std::to_string(64 * kMiB)), "status") != 0);
  a.ok("release " + a2.at("id"));
  top = ctl_json({"--state", d.state, "--json", "top"});
  // The freed 4 MiB handle stays bound to a (--handle-reuse tenant): retained, and counted.
  const Json& a_after = find_named(top.at("gpus").at(0).at("tenants"), "user:4301");
  CHECK(a_after.at("granted").u64() == 8 * kMiB);
  CHECK(a_after.at("retained").u64() == 4 * kMiB);
  CHECK(a_after.at("used").u64() == 12 * kMiB);
  const Json pool2 = ctl_json({"--state", d.state, "--json", "pool"});
  CHECK(pool2.at("counters").at("denials_over_limit").u64() == 1);
  CHECK(pool2.at("counters").at("releases").u64() == 1);
  CHECK(pool2.at("gpus").at(0).at("free").u64() == 4 * kMiB);
}

TEST_CASE("vlakectl: top --watch prints snapshots until SIGINT, then exits 0", "[process]") {
  DaemonProcess d("ctlwatch", kConfig);
  REQUIRE(d.start());
  Helper a(d.node, 4301, 0);
  a.ok("connect " + d.socket);
  CtlBackground w({"--state", d.state, "top", "--watch", "1s"});
  REQUIRE(w.wait_for("vlaked pid", 2, 10000));
  w.signal(SIGINT);
  CHECK(w.wait() == 0);
  INFO(w.out());
  CHECK(ctltest::count_of(w.out(), "vlaked pid") >= 2);
  CHECK(w.out().find("\n\nvlaked pid") != std::string::npos);  // not a TTY: blank line between
  CHECK(w.out().find("\x1b[") == std::string::npos);
  CHECK(w.out().find("user:4301") != std::string::npos);
}

TEST_CASE("vlakectl: a missing segment is exit 2 with the reason", "[process]") {
  const std::string name = pooltest::unique_name("ctl-none");
  for (const char* cmd : {"top", "tenants", "pool"}) {
    const CtlResult r = run_ctl({"--state", name, cmd});
    CHECK(r.exit_code == 2);
    CHECK(r.out.empty());
    CHECK(r.err == "vlakectl: cannot read vlaked state '" + name + "' (" + vlake::state::segment_path(name) +
                       "): no such segment — is vlaked running? (--state " + name + ")\n");
  }
  const CtlResult w = run_ctl({"--state", name, "top", "--watch", "1s"});
  CHECK(w.exit_code == 2);
  CHECK(w.err.find("no such segment") != std::string::npos);
}

TEST_CASE("vlakectl: unprivileged users read a readable segment or are told how", "[process]") {
  DaemonProcess d("ctlperm", kConfig);
  REQUIRE(d.start());
  const std::string path = vlake::state::segment_path(d.state);
  struct stat sb {};
  REQUIRE(::stat(path.c_str(), &sb) == 0);
  CHECK((sb.st_mode & 0777) == 0600);  // vlaked's default: root only
  const CtlResult denied = run_ctl({"--state", d.state, "pool"}, 4303, 4303);
  CHECK(denied.exit_code == 2);
  CHECK_THAT(denied.err, Catch::Contains("permission denied (mode 0600, owner root"));
  // An operator who lets everyone read it (--state-mode 0644).
  REQUIRE(::chmod(path.c_str(), 0644) == 0);
  CHECK(run_ctl({"--state", d.state, "--json", "pool"}, 4303, 4303).exit_code == 0);

  // The operator restricts the segment to a group: others are refused with a hint.
  REQUIRE(::chown(path.c_str(), 0, 4304) == 0);
  REQUIRE(::chmod(path.c_str(), 0640) == 0);
  const CtlResult r = run_ctl({"--state", d.state, "pool"}, 4303, 4303);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.err, Catch::StartsWith("vlakectl: cannot read vlaked state '" + d.state + "' (" + path +
                                      "): permission denied (mode 0640, owner root, group "));
  CHECK_THAT(r.err, Catch::Contains("run as root or as a member of group '"));
  CHECK_THAT(r.err, Catch::Contains("docs/vlakectl.md"));
  // A member of that group reads it.
  const CtlResult ok = run_ctl({"--state", d.state, "--json", "pool"}, 4303, 4304);
  INFO(ok.err);
  CHECK(ok.exit_code == 0);
  CHECK(parse_json(ok.out).at("daemon").at("pid").u64() == static_cast<std::uint64_t>(d.pid()));
}

TEST_CASE("vlakectl: usage errors and --help", "[process]") {
  CtlResult r = run_ctl({"frob"});
  CHECK(r.exit_code == 2);
  CHECK(r.out.empty());
  CHECK(r.err ==
        "vlakectl: unknown command 'frob' (top, tenants, processes, waits, pool, events or quota check FILE)\ntry "
        "'vlakectl --help'\n");
  r = run_ctl({});
  CHECK(r.exit_code == 2);
  r = run_ctl({"top", "--watch", "0"});
  CHECK(r.exit_code == 2);
  r = run_ctl({"--help"});
  CHECK(r.exit_code == 0);
  CHECK(r.out.rfind("usage: vlakectl", 0) == 0);
  CHECK(r.out.find("quota check FILE") != std::string::npos);
  CHECK(r.err.empty());
}

TEST_CASE("vlakectl: quota check on a good and a bad file", "[process]") {
  char tmpl[] = "/tmp/vlake-ctlq-XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  const std::string dir = tmpl;
  const std::string good = dir + "/vlake.yaml";
  const std::string bad = dir + "/bad.yaml";
  std::ofstream(good) << kConfig;
  std::ofstream(bad) << "version: 1\nusers:\n  - uid: 1000\n    limit: 4GiB\n  - uid: 1000\n    limit: 1GiB\n";

  CtlResult r = run_ctl({"quota", "check", good});
  CHECK(r.exit_code == 0);
  CHECK(r.out.rfind(good + ": ok\n", 0) == 0);
  CHECK(r.out.find("default limit: 256MiB") != std::string::npos);
  CHECK(r.out.find("users: 1 entry") != std::string::npos);
  CHECK(r.err.empty());

  r = run_ctl({"quota", "check", bad});
  CHECK(r.exit_code == 1);
  CHECK(r.out.empty());
  INFO(r.err);
  // The first error in the file: the duplicate uid on line 5.
  CHECK_THAT(r.err, Catch::StartsWith(bad + ":5:"));
  CHECK_THAT(r.err, Catch::Contains("1000"));
  CHECK(ctltest::count_of(r.err, "\n") == 1);

  r = run_ctl({"--json", "quota", "check", bad});
  CHECK(r.exit_code == 1);
  const Json j = parse_json(r.out);
  CHECK_FALSE(j.at("ok").boolean());
  CHECK(j.at("errors").at(0).at("line").u64() == 5);

  r = run_ctl({"quota", "check", dir + "/absent.yaml"});
  CHECK(r.exit_code == 1);
  CHECK(r.err == dir + "/absent.yaml:0:0: cannot read the file\n");

  ::unlink(good.c_str());
  ::unlink(bad.c_str());
  ::rmdir(dir.c_str());
}

#ifdef VLAKE_SIM_NVML_LIB
TEST_CASE("vlakectl: memory outside vlake of a process without a session shows per tenant", "[process]") {
  DaemonProcess d("ctl-outside", kConfig);
  REQUIRE(d.start({"--nvml", VLAKE_SIM_NVML_LIB, "--sample-interval-ms", "50"}));
  Helper outside(d.node, 4301, 0);  // never says Hello
  outside.ok("meminfo");            // has a context: NVML lists it
  outside.ok("own " + std::to_string(24 * kMiB));
  Json tenants;
  const bool seen = pooltest::eventually(
      [&] {
        tenants = ctl_json({"--state", d.state, "--json", "tenants"});
        for (const Json& t : tenants.at("tenants").items) {
          if (t.at("name").str() == "user:4301") return t.at("gpus").at(0).at("unhooked").u64() == 24 * kMiB;
        }
        return false;
      },
      5000);
  REQUIRE(seen);
  const Json& t = find_named(tenants.at("tenants"), "user:4301");
  CHECK(t.at("enforce").str() == "kill");  // the default
  CHECK(t.at("unhooked_processes").u64() == 1);
  CHECK(t.at("gpus").at(0).at("used").u64() == 24 * kMiB);  // kill: it counts
  CHECK(t.at("sessions").size() == 0);
  const CtlResult text = run_ctl({"--state", d.state, "top"});
  INFO(text.out);
  CHECK(text.out.find("outside vlake 24.0 MiB") != std::string::npos);
  CHECK(text.out.find("user:4301  24.0 MiB       0 B  24.0 MiB  64.0 MiB") != std::string::npos);
  const Json pool = ctl_json({"--state", d.state, "--json", "pool"});
  CHECK(pool.at("gpus").at(0).at("unhooked").u64() == 24 * kMiB);
  CHECK(pool.at("gpus").at(0).at("nvml_used").u64() >= 24 * kMiB);
}
#endif

#ifdef VLAKE_SIM_NVML_LIB
TEST_CASE("vlakectl: vlaked's context is the daemon's, retained bytes the tenant's, as the simulator counts them",
          "[process]") {
  // vlaked's own primary context takes 8 MiB of the simulated GPU (the H100: ~518 MiB).
  DaemonProcess d("ctl-exact", kConfig);
  d.env = {"VLAKE_SIM_CONTEXT_MEMORY=8MiB"};
  // Freed handles stay in the pool (bound to their tenant) for the whole test.
  REQUIRE(d.start({"--nvml", VLAKE_SIM_NVML_LIB, "--sample-interval-ms", "50", "--pool-idle-release", "off"}));
  Helper root(d.node);        // a tenant running as root (uid:0), where vlaked's context used to show
  Helper a(d.node, 4301, 0);  // user:4301, limit 64 MiB
  REQUIRE(root.ok("connect " + d.socket).at("name") == "uid:0");
  REQUIRE(a.ok("connect " + d.socket).at("name") == "user:4301");
  root.ok("meminfo");  // both have a context: NVML lists them
  a.ok("meminfo");
  a.ok("own " + std::to_string(8 * kMiB));  // device memory of its own, outside the pool: non-pool
  REQUIRE(num(root.ok("grant " + std::to_string(4 * kMiB)), "status") == 0);
  const auto a8 = a.ok("grant " + std::to_string(8 * kMiB));
  const auto a4 = a.ok("grant " + std::to_string(4 * kMiB));
  REQUIRE(num(a8, "status") == 0);
  REQUIRE(num(a4, "status") == 0);
  // a frees both: the handles stay bound to it (--handle-reuse tenant), retained and charged.
  a.ok("release " + a8.at("id"));
  a.ok("release " + a4.at("id"));

  Json top;
  Json tenants;
  Json pool;
  const auto gpu_of = [](const Json& t) -> const Json& { return t.at("gpus").at(0); };
  const bool settled = pooltest::eventually(
      [&] {
        top = ctl_json({"--state", d.state, "--json", "top"});
        tenants = ctl_json({"--state", d.state, "--json", "tenants"});
        pool = ctl_json({"--state", d.state, "--json", "pool"});
        const Json& g = top.at("gpus").at(0);
        if (g.at("daemon").at("context").u64() != 8 * kMiB || tenants.at("tenants").size() != 2) return false;
        return gpu_of(find_named(tenants.at("tenants"), "user:4301")).at("nonpool").u64() == 8 * kMiB;
      },
      10000);
  INFO(top.at("gpus").at(0).at("daemon").at("context").u64());
  REQUIRE(settled);

  // vlaked's own context is the daemon's, not uid:0's.
  const Json& g = top.at("gpus").at(0);
  CHECK(g.at("daemon").at("pid").u64() == static_cast<std::uint64_t>(d.pid()));
  CHECK(g.at("daemon").at("context").u64() == 8 * kMiB);
  CHECK(g.at("daemon").at("nvml").u64() >= 8 * kMiB);
  const Json& r = gpu_of(find_named(tenants.at("tenants"), "uid:0"));
  CHECK(r.at("granted").u64() == 4 * kMiB);
  CHECK(r.at("nonpool").u64() == 0);  // vlaked's context is not in it
  CHECK(r.at("used").u64() == 4 * kMiB);
  // a's freed memory: retained, charged, shown.
  const Json& ua = gpu_of(find_named(tenants.at("tenants"), "user:4301"));
  CHECK(ua.at("granted").u64() == 0);
  CHECK(ua.at("retained").u64() == 12 * kMiB);
  CHECK(ua.at("used").u64() == 12 * kMiB + 8 * kMiB);
  CHECK(find_named(top.at("gpus").at(0).at("tenants"), "user:4301").at("retained").u64() == 12 * kMiB);

  // Against the simulator's own count of the GPU's used memory (cuMemGetInfo in a process):
  // every byte is a tenant's (granted, retained, its contexts), vlaked's context, or free pool
  // memory bound to no tenant.
  const std::uint64_t sim_used = num(root.ok("meminfo"), "used");
  std::uint64_t tenants_used = 0;
  std::uint64_t retained = 0;
  for (const Json& t : tenants.at("tenants").items) {
    tenants_used += gpu_of(t).at("used").u64();
    retained += gpu_of(t).at("retained").u64();
  }
  const std::uint64_t unbound_free = pool.at("gpus").at(0).at("free").u64() - retained;
  CHECK(sim_used == tenants_used + g.at("daemon").at("context").u64() + unbound_free);

  // The text views: a row for vlaked (its pid) in top, a RETAINED column, and vlaked named as
  // not a tenant in `tenants`.
  const CtlResult text = run_ctl({"--state", d.state, "top"});
  INFO(text.out);
  CHECK(text.out.find("RETAINED") != std::string::npos);
  CHECK(text.out.find("user:4301  20.0 MiB  12.0 MiB") != std::string::npos);
  CHECK(text.out.find("  vlaked      8.0 MiB") != std::string::npos);
  CHECK(text.out.find(std::to_string(d.pid())) != std::string::npos);
  const CtlResult tt = run_ctl({"--state", d.state, "tenants"});
  INFO(tt.out);
  CHECK(tt.out.find("vlaked (pid " + std::to_string(d.pid()) + ", not a tenant) on GPU 0: context 8.0 MiB") !=
        std::string::npos);

  // The over-limit marker says why. A limit of 16 MiB: its pool memory (12 MiB retained) fits,
  // its context takes it above.
  const auto reload = [&](const std::string& limit, const std::string& reason) {
    std::ofstream(d.config) << "version: 1\ndefault:\n  limit: 256MiB\nusers:\n  - uid: 4301\n    limit: " << limit
                            << "\n";
    d.signal(SIGHUP);
    return pooltest::eventually(
        [&] {
          const Json t = ctl_json({"--state", d.state, "--json", "tenants"});
          const Json& u = gpu_of(find_named(t.at("tenants"), "user:4301"));
          return u.at("over_limit").boolean() && u.at("over_reason").str() == reason;
        },
        10000);
  };
  CHECK(reload("16MiB", "contexts"));
  CtlResult over = run_ctl({"--state", d.state, "top"});
  INFO(over.out);
  CHECK(over.out.find("user:4301  20.0 MiB+") != std::string::npos);
  CHECK(over.out.find("+ above its limit through its processes' CUDA contexts") != std::string::npos);
  CHECK(over.out.find("lowered by a reload") == std::string::npos);
  // 8 MiB: its pool memory alone is above: the limit was lowered.
  CHECK(reload("8MiB", "limit_lowered"));
  over = run_ctl({"--state", d.state, "top"});
  INFO(over.out);
  CHECK(over.out.find("user:4301  20.0 MiB*") != std::string::npos);
  CHECK(over.out.find("* above its limit, lowered by a reload") != std::string::npos);
}
#endif
