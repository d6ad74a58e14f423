// Soaks of the limits against hostile tenants (docs/daemon.md, "Limits"; CTest label `soak`):
// 5,000 tenants cycling through one vlaked, and 10,000 idle connections.
#include <catch2/catch.hpp>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "limits_util.hpp"

using namespace vlake;
using namespace vlake::pooltest;
using namespace vlake::pooltest::limits;
namespace st = vlake::state;
using proto::Status;

TEST_CASE("limits soak: 5,000 tenants cycle through one daemon without a refusal for table space",
          "[daemon][limits][soak]") {
  DaemonProcess d("lsoak", kConfig);
  REQUIRE(d.start());
  constexpr std::uint32_t kTenants = 5000;
  constexpr std::uint32_t kBatch = 50;  // live at once, at most
  const auto t0 = std::chrono::steady_clock::now();
  int served = 0;
  int limited = 0;
  for (std::uint32_t i = 0; i < kTenants; i += kBatch) {
    std::vector<Tenant> batch;
    for (std::uint32_t k = 0; k < kBatch; ++k) batch.push_back(Tenant::fork_one(d.socket, 100000 + i + k, true));
    for (Tenant& t : batch) {
      const int code = t.finish();
      served += code == kServed ? 1 : 0;
      limited += code == kLimitReached ? 1 : 0;
    }
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  REQUIRE(eventually([&] { return snapshot(d.state)->counters.tenants_freed == kTenants; }, 20000));
  const auto s = snapshot(d.state);
  const std::size_t log_bytes = file_size(d.log_path);
  WARN("5,000 tenants in " << secs << " s; " << limited << " refused; log " << log_bytes << " bytes; "
                           << s->counters.log_suppressed << " log lines suppressed");
  CHECK(served == static_cast<int>(kTenants));
  CHECK(limited == 0);
  CHECK(s->counters.denials_tenant_table == 0);
  CHECK(s->counters.denials_other == 0);
  CHECK(s->counters.sessions_opened == kTenants);
  CHECK(tenant_records(*s) == 0);
  CHECK(log_bytes < 1024 * 1024);
  CHECK(secs < 120);
}

TEST_CASE("limits soak: 10,000 idle connections leave another tenant served and the log small",
          "[daemon][limits][soak]") {
  raise_nofile(12000);
  DaemonProcess d("lidle", kConfig);
  REQUIRE(d.start({"--hello-timeout-ms", "2000"}));
  constexpr int kConnections = 10000;
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::unique_ptr<PoolClient>> idle;
  idle.reserve(kConnections);
  for (int i = 0; i < kConnections; ++i) idle.push_back(std::make_unique<PoolClient>(d.socket));
  const double connect_secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // While all 10,000 are open on this side, another tenant is served within a second.
  const auto t1 = std::chrono::steady_clock::now();
  Tenant other = Tenant::fork_one(d.socket, 4107, false);
  const double served_secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  CHECK(other.finish() == kServed);
  CHECK(served_secs < 1.0);
  REQUIRE(eventually([&] { return snapshot(d.state)->counters.denials_unauthenticated == kConnections; }, 10000));
  const std::size_t log_bytes = file_size(d.log_path);
  WARN("10,000 idle connections opened in " << connect_secs << " s; another tenant served in " << served_secs
                                            << " s; log " << log_bytes << " bytes");
  CHECK(log_bytes < 1024 * 1024);
}
