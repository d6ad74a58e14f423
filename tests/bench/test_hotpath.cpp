// The allocation hot path, counted (label sim): a real vlaked and a hooked tenant
// (hotpath_tenant.cpp) on the simulator. The tenant reports the simulator's per-process driver
// call counts (vlake_sim_call_count) around its alloc/free loops; the test reads the daemon's
// message counter (Counters.requests, state segment) around them.
//   - warm (local reserve on): zero VMM calls and zero daemon messages per pair;
//   - cold (VLAKE_RESERVE=0): exactly the calls and messages the uncached path makes.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "harness.hpp"
#include "vlake/contracts/state.hpp"

using vlake::pooltest::DaemonProcess;

extern char** environ;

namespace {

constexpr std::uint64_t kPairs = 20;
const std::vector<std::string> kSizes = {"2MiB", "20MiB", "256MiB"};

std::string limits_yaml(const std::string& limit) { return "version: 1\ndefault:\n  limit: " + limit + "\n"; }

std::string sim_dir() {
  std::string p = VLAKE_SIM_LIB;
  return p.substr(0, p.rfind('/'));
}

// The hooked tenant, driven over its stdin/stdout.
class Tenant {
 public:
  Tenant(const DaemonProcess& d, const std::vector<std::string>& extra_env) {
    int in[2];
    int out[2];
    REQUIRE(::pipe2(in, O_CLOEXEC) == 0);
    REQUIRE(::pipe2(out, O_CLOEXEC) == 0);
    std::vector<std::string> env;
    std::string asan_options;  // the caller's, kept: the link-order option is appended below
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string kv = *e;
      if (kv.rfind("ASAN_OPTIONS=", 0) == 0) {
        asan_options = kv.substr(13) + ":";
        continue;
      }
      if (kv.rfind("LD_PRELOAD=", 0) == 0 || kv.rfind("LD_LIBRARY_PATH=", 0) == 0 || kv.rfind("VLAKE_", 0) == 0) {
        continue;
      }
      env.push_back(kv);
    }
    for (const auto& kv : vlake::pooltest::child_env(d.node)) {
      if (kv.rfind("VLAKE_SIM_", 0) == 0) env.push_back(kv);
    }
    env.push_back(std::string("LD_PRELOAD=") + VLAKE_HOOK_LIB);
    env.push_back("LD_LIBRARY_PATH=" + sim_dir());
    env.push_back("VLAKE_SOCKET=" + d.socket);
    env.push_back("ASAN_OPTIONS=" + asan_options + "verify_asan_link_order=0");
    env.insert(env.end(), extra_env.begin(), extra_env.end());
    pid_ = ::fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      ::dup2(in[0], 0);
      ::dup2(out[1], 1);
      std::vector<char*> envp;
      for (auto& e : env) envp.push_back(e.data());
      envp.push_back(nullptr);
      std::string path = VLAKE_HOTPATH_TENANT;
      char* argv[] = {path.data(), nullptr};
      ::execve(argv[0], argv, envp.data());
      ::_exit(127);
    }
    ::close(in[0]);
    ::close(out[1]);
    in_ = in[1];
    out_ = out[0];
    const std::string banner = read_line();
    INFO("tenant banner: " << banner);
    REQUIRE(banner.rfind("ok ready", 0) == 0);
  }
  ~Tenant() {
    if (in_ >= 0) {
      const std::string q = "quit\n";
      (void)!::write(in_, q.data(), q.size());
      ::close(in_);
    }
    for (int i = 0; i < 500; ++i) {
      if (::waitpid(pid_, nullptr, WNOHANG) == pid_) {
        pid_ = -1;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (out_ >= 0) ::close(out_);
  }
  Tenant(const Tenant&) = delete;
  Tenant& operator=(const Tenant&) = delete;

  // Sends a command that must answer "ok ..."; returns its key=value pairs as numbers.
  std::map<std::string, std::uint64_t> ok(const std::string& cmd) {
    const std::string l = cmd + "\n";
    REQUIRE(::write(in_, l.data(), l.size()) == static_cast<ssize_t>(l.size()));
    const std::string reply = read_line();
    INFO(cmd << " -> " << reply);
    REQUIRE(reply.rfind("ok", 0) == 0);
    std::map<std::string, std::uint64_t> kv;
    std::istringstream in(reply.substr(2));
    std::string tok;
    while (in >> tok) {
      const auto eq = tok.find('=');
      if (eq != std::string::npos) kv[tok.substr(0, eq)] = std::stoull(tok.substr(eq + 1));
    }
    return kv;
  }

 private:
  std::string read_line() {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    for (;;) {
      const auto nl = buf_.find('\n');
      if (nl != std::string::npos) {
        std::string line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        return line;
      }
      if (std::chrono::steady_clock::now() > deadline) return "timeout";
      pollfd p{out_, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      char b[4096];
      const ssize_t n = ::read(out_, b, sizeof b);
      if (n <= 0) return "eof (tenant exited)";
      buf_.append(b, static_cast<std::size_t>(n));
    }
  }
  pid_t pid_ = -1;
  int in_ = -1;
  int out_ = -1;
  std::string buf_;
};

struct DaemonCounts {
  std::uint64_t requests = 0;
  std::uint64_t grants = 0;
  std::uint64_t releases = 0;
};

// `requests`: messages of the allocation path. ReserveReports are left out: the hook's worker
// thread sends them (reserve changes, and activity at most once a second), never the caller.
DaemonCounts counts(const DaemonProcess& d) {
  const auto s = vlake::state::StateReader(d.state).snapshot();
  return {s->counters.requests - s->counters.reserve_reports, s->counters.grants, s->counters.releases};
}

// Waits until the daemon's counters stop moving (a release or report may still be in flight).
DaemonCounts settled(const DaemonProcess& d) {
  DaemonCounts last = counts(d);
  for (int i = 0; i < 40; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const DaemonCounts now = counts(d);
    if (now.requests == last.requests && now.releases == last.releases && i >= 3) return now;
    last = now;
  }
  return last;
}

}  // namespace

TEST_CASE("warm alloc/free pairs make no VMM call and send no daemon message", "[hotpath]") {
  DaemonProcess d("hotwarm", limits_yaml("1GiB"));
  REQUIRE(d.start());
  Tenant t(d, {"VLAKE_RESERVE=768MiB", "VLAKE_RESERVE_AGE=600s"});
  for (const auto& size : kSizes) t.ok("pairs " + size + " 1");  // warm-up: fills the reserve
  const DaemonCounts before = settled(d);
  for (const auto& size : kSizes) {
    const auto kv = t.ok("pairs " + size + " " + std::to_string(kPairs));
    INFO("size " << size);
    CHECK(kv.at("vmm") == 0);
    CHECK(kv.at("cuMemMap") == 0);
    CHECK(kv.at("cuMemAlloc_v2") == 0);  // not passed through to the driver either
  }
  const DaemonCounts after = settled(d);
  INFO("daemon requests " << before.requests << " -> " << after.requests);
  CHECK(after.requests - before.requests == 0);
  CHECK(after.grants - before.grants == 0);
  CHECK(after.releases - before.releases == 0);
}

TEST_CASE("cold alloc/free pairs (VLAKE_RESERVE=0 VLAKE_KEEP_MAPPED=0) make exactly the uncached path's calls",
          "[hotpath]") {
  DaemonProcess d("hotcold", limits_yaml("1GiB"));
  REQUIRE(d.start());
  Tenant t(d, {"VLAKE_RESERVE=0", "VLAKE_KEEP_MAPPED=0"});
  for (const auto& size : kSizes) t.ok("pairs " + size + " 1");
  for (const auto& size : kSizes) {
    INFO("size " << size);
    const DaemonCounts before = settled(d);
    const auto kv = t.ok("pairs " + size + " " + std::to_string(kPairs));
    const DaemonCounts after = settled(d);
    // Per pair: one Grant and one Release message, nothing else.
    CHECK(after.requests - before.requests == 2 * kPairs);
    CHECK(after.grants - before.grants == kPairs);
    CHECK(after.releases - before.releases == kPairs);
    // Per alloc: H imports (H handles in the grant), one VA reservation, H maps, one
    // set-access over the whole range; per free: one unmap, H releases, one VA free.
    const std::uint64_t imports = kv.at("cuMemImportFromShareableHandle");
    REQUIRE(imports % kPairs == 0);
    const std::uint64_t h = imports / kPairs;
    CHECK(h >= 1);
    if (size == "2MiB") CHECK(h == 1);
    CHECK(kv.at("cuMemAddressReserve") == kPairs);
    CHECK(kv.at("cuMemMap") == h * kPairs);
    CHECK(kv.at("cuMemSetAccess") == kPairs);
    CHECK(kv.at("cuMemUnmap") == kPairs);
    CHECK(kv.at("cuMemRelease") == h * kPairs);
    CHECK(kv.at("cuMemAddressFree") == kPairs);
    CHECK(kv.at("cuMemCreate") == 0);
    CHECK(kv.at("cuMemExportToShareableHandle") == 0);
    CHECK(kv.at("cuMemAlloc_v2") == 0);
    CHECK(kv.at("cuMemFree_v2") == 0);
    CHECK(kv.at("vmm") == (3 * h + 4) * kPairs);
  }
}

TEST_CASE("cold alloc/free pairs (VLAKE_RESERVE=0) reuse the kept mapping: two messages and no driver VMM call",
          "[hotpath]") {
  // docs/hook.md, "Kept mappings": the grant goes back to vlaked on every free, the daemon hands
  // the same handle back on the next alloc and the hook finds it still mapped.
  DaemonProcess d("hotkept", limits_yaml("1GiB"));
  REQUIRE(d.start());
  Tenant t(d, {"VLAKE_RESERVE=0"});
  for (const auto& size : kSizes) t.ok("pairs " + size + " 1");
  for (const auto& size : kSizes) {
    INFO("size " << size);
    const DaemonCounts before = settled(d);
    const auto kv = t.ok("pairs " + size + " " + std::to_string(kPairs));
    const DaemonCounts after = settled(d);
    CHECK(after.requests - before.requests == 2 * kPairs);
    CHECK(after.grants - before.grants == kPairs);
    CHECK(after.releases - before.releases == kPairs);
    const std::uint64_t imports = kv.at("cuMemImportFromShareableHandle");
    if (size == "2MiB") CHECK(imports == 0);  // one granule: always one handle
    if (imports == 0) {
      // One handle per grant (the daemon's exact fit): nothing but the messages.
      CHECK(kv.at("cuMemMap") == 0);
      CHECK(kv.at("cuMemSetAccess") == 0);
      CHECK(kv.at("cuMemUnmap") == 0);
      CHECK(kv.at("cuMemRelease") == 0);
      CHECK(kv.at("vmm") == 0);
    } else {
      // A stitched grant (several handles) is never kept: the uncached path.
      CHECK(imports % kPairs == 0);
      CHECK(imports / kPairs > 1);
    }
    CHECK(kv.at("cuMemAlloc_v2") == 0);
    CHECK(kv.at("cuMemFree_v2") == 0);
  }
}
