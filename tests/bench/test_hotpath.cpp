// The allocation hot path, counted (label sim): a real vlaked and a hooked tenant
// (hotpath_tenant.cpp) on the simulator. The tenant reports the simulator's per-process driver
// call counts (vlake_sim_call_count) around its alloc/free loops; the test reads the daemon's
// message counter (Counters.requests, state segment) around them.
//   - warm (local reserve on): zero VMM calls and zero daemon messages per pair;
//   - cold (VLAKE_RESERVE=0): exactly the calls and messages the uncached path makes.
#include <catch2/catch.hpp>

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "harness.hpp"
#include "vlake/contracts/state.hpp"

using vlake::pooltest::DaemonProcess;

namespace {

constexpr std::uint64_t kPairs = 20;
const std::vector<std::string> kSizes = {"2MiB", "20MiB", "256MiB"};

std::string limits_yaml(const std::string& limit) { return "version: 1\ndefault:\n  limit: " + limit + "\n"; }

// The hooked tenant, driven over its stdin/stdout.
class Tenant {
 public:
  Tenant(const DaemonProcess& d, const std::vector<std::string>& extra_env) {
    vlake::testsupport::Env env = vlake::pooltest::hooked_env(d);
    for (const auto& kv : extra_env) env.set(kv);
    vlake::testsupport::Spawn spec;
    spec.argv = {VLAKE_HOTPATH_TENANT};
    spec.env = env.strings();
    spec.in = vlake::testsupport::Stream::pipe;
    spec.err = vlake::testsupport::Stream::inherit;
    proc_ = std::make_unique<vlake::testsupport::Process>(spec);
    const std::string banner = read_line();
    INFO("tenant banner: " << banner);
    REQUIRE(banner.rfind("ok ready", 0) == 0);
  }
  ~Tenant() {
    proc_->write("quit\n");
    proc_->close_stdin();
    proc_->wait(5000);  // SIGKILLed by ~Process if it lingers
  }
  Tenant(const Tenant&) = delete;
  Tenant& operator=(const Tenant&) = delete;

  // Sends a command that must answer "ok ..."; returns its key=value pairs as numbers.
  std::map<std::string, std::uint64_t> ok(const std::string& cmd) {
    REQUIRE(proc_->write(cmd + "\n"));
    const std::string reply = read_line();
    INFO(cmd << " -> " << reply);
    REQUIRE(reply.rfind("ok", 0) == 0);
    std::map<std::string, std::uint64_t> kv;
    for (const auto& [k, v] : vlake::pooltest::reply_fields(reply)) kv[k] = std::stoull(v);
    return kv;
  }

 private:
  std::string read_line() {
    const auto line = proc_->read_line(60000);
    if (line) return *line;
    return proc_->reading() ? "timeout" : "eof (tenant exited)";
  }
  std::unique_ptr<vlake::testsupport::Process> proc_;
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

// Runs kPairs cold alloc/free pairs of `size` in the tenant and checks the daemon saw one Grant
// and one Release message per pair, nothing else; returns the tenant's call counts.
std::map<std::string, std::uint64_t> cold_pairs(const DaemonProcess& d, Tenant& t, const std::string& size) {
  const DaemonCounts before = settled(d);
  auto kv = t.ok("pairs " + size + " " + std::to_string(kPairs));
  const DaemonCounts after = settled(d);
  CHECK(after.requests - before.requests == 2 * kPairs);
  CHECK(after.grants - before.grants == kPairs);
  CHECK(after.releases - before.releases == kPairs);
  return kv;
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
    const auto kv = cold_pairs(d, t, size);
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
    const auto kv = cold_pairs(d, t, size);
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
