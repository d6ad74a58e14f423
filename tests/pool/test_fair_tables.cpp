// Fair tables (docs/daemon.md, "Limits"; pool/include/vlake/pool/fair_share.hpp): 8 colluding
// uids (9 for imports), each within its own caps, cannot fill vlaked's session, grant or import
// table or the connections awaiting Hello so that an honest uid is refused. vlaked runs as a process on the
// simulator; the colluders and the honest tenant are helper processes of their own uids.
#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "limits_util.hpp"

using namespace vlake;
using namespace vlake::pooltest;
using namespace vlake::pooltest::limits;
namespace st = vlake::state;

namespace {

constexpr std::uint32_t kColluders = 8;
constexpr std::uint32_t kFirstUid = 60001;
constexpr std::uint32_t kHonestUid = 4200;

// Runs `line` on every helper at once (one thread each) and returns the replies in order.
std::vector<std::string> on_all(std::vector<std::unique_ptr<Helper>>& helpers, const std::string& line,
                                std::chrono::seconds timeout = std::chrono::seconds(100)) {
  std::vector<std::string> replies(helpers.size());
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < helpers.size(); ++i) {
    threads.emplace_back([&, i] {
      try {
        replies[i] = helpers[i]->cmd(line, timeout);
      } catch (const std::exception& e) {
        replies[i] = std::string("err ") + e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  return replies;
}

std::vector<std::unique_ptr<Helper>> colluders(const DaemonProcess& d, std::uint32_t n = kColluders) {
  std::vector<std::unique_ptr<Helper>> out;
  for (std::uint32_t u = 0; u < n; ++u) out.push_back(std::make_unique<Helper>(d.node, kFirstUid + u, kFirstUid + u));
  return out;
}

}  // namespace

TEST_CASE("fair tables: 8 uids at their session caps leave an honest uid all its Hellos", "[daemon][limits][fair]") {
  DaemonProcess d("lfsess", kConfig);
  REQUIRE(d.start());  // 128 sessions per tenant, 8 × 128 = the 1024-session table
  std::vector<std::unique_ptr<Helper>> bad = colluders(d);
  // One after the other (the order that leaves least to a late tenant).
  std::uint64_t opened = 0;
  std::string why;
  for (auto& h : bad) {
    const auto kv = h->ok("sessions " + d.socket + " 128");
    opened += num(kv, "opened");
    if (num(kv, "refused") > 0) why = kv.at("why");
  }
  CHECK(opened < st::kMaxSessions);
  CHECK_THAT(why, Catch::Contains("session_table_nearly_full"));
  Helper honest(d.node, kHonestUid, kHonestUid);
  const auto kv = honest.ok("sessions " + d.socket + " 40");
  CHECK(num(kv, "opened") == 40);
  CHECK(num(kv, "refused") == 0);
  CHECK(live_sessions(*snapshot(d.state)) == opened + 40);
  CHECK(snapshot(d.state)->counters.denials_session_cap == 8 * 128 - opened);
}

TEST_CASE("fair tables: 8 uids at their grant caps leave an honest uid its grant", "[daemon][limits][fair]") {
  DaemonProcess d("lfgrant", kConfig);
  d.device_memory = "64GiB";  // 16,384 counted grants of one granule fit
  REQUIRE(d.start());         // 2048 grants per tenant, 8 × 2048 = the 16,384-grant table
  std::vector<std::unique_ptr<Helper>> bad = colluders(d);
  for (auto& h : bad) h->ok("connect " + d.socket);
  // In turn, 512 at a time each.
  std::uint64_t granted = 0;
  for (int round = 0; round < 4; ++round) {
    for (const std::string& r : on_all(bad, "counted 512 1")) {
      REQUIRE(r.rfind("ok ", 0) == 0);
      granted += num(reply_fields(r), "granted");
    }
  }
  CHECK(granted < st::kMaxGrants);
  Helper honest(d.node, kHonestUid, kHonestUid);
  honest.ok("connect " + d.socket);
  CHECK(num(honest.ok("grant " + std::to_string(2 * kMiB) + " counted"), "status") == 0);
  CHECK(live_grants(*snapshot(d.state)) == granted + 1);
  CHECK_THAT(d.log(), Catch::Contains("grant table nearly full: tenant uid:6000"));
}

TEST_CASE("fair tables: 8 uids holding every connection awaiting Hello do not keep an honest uid out",
          "[daemon][limits][fair]") {
  DaemonProcess d("lfhello", kConfig);
  // Silent connections stay until evicted (as if reopened before every timeout).
  REQUIRE(d.start({"--hello-timeout-ms", "600000"}));
  std::vector<std::unique_ptr<Helper>> bad = colluders(d);
  for (const std::string& r : on_all(bad, "silent " + d.socket + " 64")) REQUIRE(r.rfind("ok ", 0) == 0);
  // 8 × 64: the 512 awaiting Hello are all theirs (accepted before the honest ones, in order).
  // Before each honest Hello the colluders reopen what they lost, so the table is full again.
  Helper honest(d.node, kHonestUid, kHonestUid);
  std::uint64_t opened = 0;
  for (int i = 0; i < 40; ++i) {
    for (const std::string& r : on_all(bad, "silent " + d.socket + " 1")) REQUIRE(r.rfind("ok ", 0) == 0);
    opened += num(honest.ok("sessions " + d.socket + " 1"), "opened");
  }
  CHECK(opened == 40);
  CHECK(live_sessions(*snapshot(d.state)) == 40);
  // Each honest connection closed one of the colluders' oldest silent ones.
  CHECK_THAT(d.log(), Catch::Contains("closed before its Hello: the unauthenticated table is full"));
}

TEST_CASE("fair tables: 9 uids importing their own IPC handles leave an honest uid its open",
          "[daemon][limits][fair]") {
  DaemonProcess d("lfipc", kConfig);
  REQUIRE(d.start());  // 2048 grants and imports per tenant: 9 × 2047 imports overflow the 16,384-import table
  std::vector<std::unique_ptr<Helper>> bad = colluders(d, 9);
  std::uint64_t opened = 0;
  for (auto& h : bad) {
    h->ok("connect " + d.socket);
    const auto kv = reply_fields(h->cmd("ipcflood 2047 " + std::to_string(2 * kMiB), std::chrono::seconds(100)));
    opened += num(kv, "opened");
    CHECK(num(kv, "opened") + num(kv, "refused") == 2047);
  }
  CHECK(opened < st::kMaxGrants);
  Helper honest(d.node, kHonestUid, kHonestUid);
  honest.ok("connect " + d.socket);
  const auto kv = honest.ok("ipcflood 2 " + std::to_string(2 * kMiB));
  CHECK(num(kv, "opened") == 2);
  CHECK(num(kv, "refused") == 0);
  CHECK_THAT(d.log(), Catch::Contains("import table nearly full: tenant uid:6000"));
}
