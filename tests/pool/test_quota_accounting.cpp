// Accounting with namespaces and guarantees: the grant rule case by case, and a property test
// — many threads granting and releasing for random tenants under random configurations while
// a checker asserts that no tenant limit, namespace limit or guarantee is ever broken.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "vlake/pool/accounting.hpp"

using namespace vlake;
using namespace vlake::pool;
using namespace vlake::literals;

namespace {

constexpr std::uint64_t kMiB = 1ULL << 20;

// Every invariant of the grant rule over one consistent snapshot; returns what is broken.
std::vector<std::string> broken(const Accounting::Snapshot& s) {
  std::vector<std::string> out;
  std::map<std::pair<std::uint32_t, std::int32_t>, Accounting::NamespaceUsage> sums;  // (ns, dev)
  for (const auto& e : s.tenants) {
    const Bytes held = e.usage.granted + e.usage.nonpool + e.usage.reserved;
    if (held > e.usage.limit) out.push_back("tenant " + std::to_string(e.tenant.value()) + " above its limit");
    auto& sum = sums[{e.ns.value(), e.device.value()}];
    sum.granted += e.usage.granted;
    sum.nonpool += e.usage.nonpool;
    sum.reserved += e.usage.reserved;
  }
  std::map<std::int32_t, std::pair<std::uint64_t, std::uint64_t>> dev;  // guaranteed, borrowed
  for (const auto& n : s.namespaces) {
    const std::string id = "namespace " + std::to_string(n.ns.value()) + " GPU " + std::to_string(n.device.value());
    if (n.usage.held() > n.usage.limit) out.push_back(id + " above its limit");
    const auto& sum = sums[{n.ns.value(), n.device.value()}];
    if (sum.granted != n.usage.granted || sum.nonpool != n.usage.nonpool || sum.reserved != n.usage.reserved) {
      out.push_back(id + ": sums differ from its tenants'");
    }
    const std::uint64_t h = n.usage.held().value();
    const std::uint64_t g = n.usage.guaranteed.value();
    dev[n.device.value()].first += g;
    dev[n.device.value()].second += h > g ? h - g : 0;
  }
  for (const auto& d : s.devices) {
    if (d.capacity == 0_B) continue;
    const auto [g, b] = dev[d.device.value()];
    const std::uint64_t unguaranteed = g >= d.capacity.value() ? 0 : d.capacity.value() - g;
    if (b > unguaranteed) {
      out.push_back("GPU " + std::to_string(d.device.value()) + ": borrowed " + std::to_string(b) + " > unguaranteed " +
                    std::to_string(unguaranteed));
    }
  }
  return out;
}

}  // namespace

TEST_CASE("quota accounting: tenant, namespace and guarantee rules, distinct reasons", "[pool][accounting][quota]") {
  Accounting a;
  const DeviceOrdinal d{0};
  const NamespaceId research{1};
  const NamespaceId batch{2};
  const NamespaceId other{3};
  a.set_capacity(d, 100_MiB);
  a.set_namespace(research, d, 60_MiB, 40_MiB);  // limit 60, guaranteed 40
  a.set_namespace(batch, d, 100_MiB, 20_MiB);
  a.set_namespace(other, d, 100_MiB, 0_B);  // U = 100 - 60 = 40
  const TenantId r1{1};
  const TenantId r2{2};
  const TenantId b1{3};
  const TenantId o1{4};
  for (TenantId t : {r1, r2, b1, o1}) a.set_limit(t, d, 100_MiB);
  a.set_limit(r2, d, 10_MiB);
  a.assign(r1, research);
  a.assign(r2, research);
  a.assign(b1, batch);
  a.assign(o1, other);
  CHECK(a.namespace_of(r1) == research);

  Refusal why = Refusal::none;
  // Tenant limit first.
  CHECK_FALSE(a.reserve(r2, d, 11_MiB, nullptr, &why).has_value());
  CHECK(why == Refusal::tenant_limit);
  // `other` borrows the whole unguaranteed 40 MiB; one byte more would eat a guarantee.
  auto o = a.reserve(o1, d, 40_MiB, nullptr, &why);
  REQUIRE(o);
  CHECK(why == Refusal::none);
  o->commit();
  CHECK_FALSE(a.reserve(o1, d, 1_MiB, nullptr, &why).has_value());
  CHECK(why == Refusal::guarantee);
  // research still gets its whole guarantee, batch too (within guarantee: no borrowing).
  auto r = a.reserve(r1, d, 40_MiB, nullptr, &why);
  REQUIRE(r);
  r->commit();
  auto b = a.reserve(b1, d, 20_MiB);
  REQUIRE(b);
  b->commit();
  // Above its guarantee research would borrow: nothing unguaranteed is left.
  CHECK_FALSE(a.reserve(r2, d, 2_MiB, nullptr, &why).has_value());
  CHECK(why == Refusal::guarantee);
  // `other` gives back 30 MiB: research borrows 20 of it up to its 60 MiB namespace limit.
  CHECK(a.uncharge(o1, d, 30_MiB));
  auto r2a = a.reserve(r2, d, 10_MiB);
  REQUIRE(r2a);
  r2a->commit();
  auto r1b = a.reserve(r1, d, 10_MiB);
  REQUIRE(r1b);
  r1b->commit();
  CHECK(a.namespace_usage(research, d).used() == 60_MiB);
  CHECK_FALSE(a.reserve(r1, d, 1_MiB, nullptr, &why).has_value());
  CHECK(why == Refusal::namespace_limit);
  CHECK(a.device_usage(d).guaranteed == 60_MiB);
  CHECK(a.device_usage(d).borrowed == 30_MiB);  // research 20 + other 10

  // Non-pool usage counts for the namespace too.
  a.set_nonpool(b1, d, 5_MiB);
  CHECK(a.namespace_usage(batch, d).used() == 25_MiB);
  // Moving a tenant moves its usage.
  a.assign(b1, other);
  CHECK(a.namespace_usage(batch, d).used() == 0_B);
  CHECK(a.namespace_usage(other, d).used() == 35_MiB);
  CHECK(broken(a.snapshot_all()).empty() == false);  // other now borrows 35 > 40 - 30 left: a fact, not a grant
  a.assign(b1, batch);
  CHECK(broken(a.snapshot_all()).empty());

  // Lowering a limit below usage revokes nothing; grants are refused until usage drops.
  a.set_namespace(research, d, 50_MiB, 40_MiB);
  CHECK(a.namespace_usage(research, d).used() == 60_MiB);
  CHECK_FALSE(a.reserve(r1, d, 1_MiB, nullptr, &why).has_value());
  CHECK(why == Refusal::namespace_limit);
  CHECK(a.uncharge(r1, d, 20_MiB));  // 40 held
  CHECK(a.reserve(r1, d, 10_MiB, nullptr, &why).has_value());

  // A device without a capacity has no guarantee rule; a namespace never configured has no limit.
  const DeviceOrdinal d1{1};
  a.set_limit(o1, d1, 1_GiB);
  CHECK(a.reserve(o1, d1, 1_GiB).has_value());
  CHECK_FALSE(a.reserve(o1, d1, Bytes{~0ULL}).has_value());  // no overflow
}

TEST_CASE("quota accounting: property — concurrent grants never break a limit or a guarantee",
          "[pool][accounting][quota]") {
  constexpr int kRounds = 6;
  constexpr int kDevices = 2;
  constexpr int kThreads = 8;
  constexpr int kOps = 6000;
  std::map<Refusal, std::uint64_t> reasons;
  std::uint64_t total_checks = 0;
  for (int round = 0; round < kRounds; ++round) {
    INFO("round " << round);
    std::mt19937_64 rng(0x5eed0000ULL + static_cast<std::uint64_t>(round));
    auto pick = [&](std::uint64_t lo, std::uint64_t hi) { return lo + rng() % (hi - lo + 1); };
    Accounting a;
    const int namespaces = static_cast<int>(pick(1, 5));
    const int tenants = static_cast<int>(pick(4, 12));
    std::map<std::pair<std::uint32_t, std::int32_t>, std::uint64_t> guaranteed;  // (ns, dev)
    std::map<std::pair<std::uint32_t, std::int32_t>, std::uint64_t> ns_limit;
    std::vector<std::uint64_t> capacity(kDevices);
    for (int d = 0; d < kDevices; ++d) {
      capacity[static_cast<std::size_t>(d)] = pick(128, 512) * kMiB;
      const std::uint64_t c = capacity[static_cast<std::size_t>(d)];
      a.set_capacity(DeviceOrdinal{d}, Bytes{c});
      // Guarantees sum to at most C - 16 MiB (non-pool usage set below stays unguaranteed).
      std::uint64_t left = c - 16 * kMiB;
      for (int n = 1; n <= namespaces; ++n) {
        const std::uint64_t g = rng() % 3 == 0 ? 0 : std::min(left, pick(0, c / 2) / kMiB * kMiB);
        left -= g;
        const std::uint64_t limit = rng() % 4 == 0 ? c : std::max(g, pick(c / 8, c) / kMiB * kMiB);
        a.set_namespace(NamespaceId{static_cast<std::uint32_t>(n)}, DeviceOrdinal{d}, Bytes{limit}, Bytes{g});
        guaranteed[{static_cast<std::uint32_t>(n), d}] = g;
        ns_limit[{static_cast<std::uint32_t>(n), d}] = limit;
      }
    }
    // Storm tenants 1..tenants; one probe tenant per namespace (tenants+n) kept out of the storm.
    for (int t = 1; t <= tenants + namespaces; ++t) {
      const bool probe = t > tenants;
      const auto ns = static_cast<std::uint32_t>(
          probe ? t - tenants : static_cast<int>(pick(1, static_cast<std::uint64_t>(namespaces))));
      a.assign(TenantId{static_cast<std::uint32_t>(t)}, NamespaceId{ns});
      for (int d = 0; d < kDevices; ++d) {
        const std::uint64_t c = capacity[static_cast<std::size_t>(d)];
        a.set_limit(TenantId{static_cast<std::uint32_t>(t)}, DeviceOrdinal{d},
                    Bytes{probe ? c : pick(4, c / kMiB / 2) * kMiB});
        if (!probe) a.set_nonpool(TenantId{static_cast<std::uint32_t>(t)}, DeviceOrdinal{d}, Bytes{(rng() % 2) * kMiB});
      }
    }
    REQUIRE(broken(a.snapshot_all()).empty());

    std::atomic<bool> stop{false};
    std::atomic<std::uint64_t> checks{0};
    std::vector<std::string> first_violation;
    std::thread checker([&] {
      while (!stop.load()) {
        auto b = broken(a.snapshot_all());
        if (!b.empty() && first_violation.empty()) first_violation = b;
        ++checks;
      }
    });
    std::vector<std::map<std::pair<std::uint32_t, std::int32_t>, std::uint64_t>> held(kThreads);
    std::vector<std::map<Refusal, std::uint64_t>> why_counts(kThreads);
    std::vector<std::thread> workers;
    for (int w = 0; w < kThreads; ++w) {
      workers.emplace_back([&, w] {
        std::mt19937_64 r(static_cast<std::uint64_t>(round) * 1000 + static_cast<std::uint64_t>(w));
        auto& mine = held[static_cast<std::size_t>(w)];
        // At least kOps operations, and on until the checker has looked many times meanwhile.
        for (int i = 0; i < kOps || checks.load() < 50; ++i) {
          const auto t = static_cast<std::uint32_t>(1 + r() % static_cast<std::uint64_t>(tenants));
          const auto d = static_cast<std::int32_t>(r() % kDevices);
          auto& h = mine[{t, d}];
          if (r() % 10 < 6) {
            const Bytes n{(1 + r() % 24) * kMiB};
            Refusal why = Refusal::none;
            auto res = a.reserve(TenantId{t}, DeviceOrdinal{d}, n, nullptr, &why);
            if (!res) {
              ++why_counts[static_cast<std::size_t>(w)][why];
              continue;
            }
            if (r() % 5 == 0) {
              res->rollback();
            } else {
              res->commit();
              h += n.value();
            }
          } else if (h > 0) {
            const std::uint64_t n = std::min<std::uint64_t>(h, (1 + r() % 24) * kMiB);
            if (!a.uncharge(TenantId{t}, DeviceOrdinal{d}, Bytes{n}))
              ++why_counts[static_cast<std::size_t>(w)][Refusal::none];
            h -= n;
          }
        }
      });
    }
    for (auto& t : workers) t.join();
    stop = true;
    checker.join();
    INFO((first_violation.empty() ? std::string() : first_violation.front()));
    CHECK(first_violation.empty());
    CHECK(checks.load() >= 50);
    total_checks += checks.load();
    for (const auto& m : why_counts) {
      for (const auto& [k, v] : m) reasons[k] += v;
    }
    CHECK(broken(a.snapshot_all()).empty());

    // The books equal what the threads believe they hold.
    for (int t = 1; t <= tenants; ++t) {
      for (int d = 0; d < kDevices; ++d) {
        std::uint64_t sum = 0;
        for (const auto& h : held) {
          if (auto it = h.find({static_cast<std::uint32_t>(t), d}); it != h.end()) sum += it->second;
        }
        const auto u = a.usage(TenantId{static_cast<std::uint32_t>(t)}, DeviceOrdinal{d});
        CHECK(u.granted.value() == sum);
        CHECK(u.reserved == 0_B);
      }
    }

    // Guarantees are real: fill every GPU with storm tenants until everything is refused, then
    // each namespace's probe still gets the rest of its guarantee.
    for (int d = 0; d < kDevices; ++d) {
      for (int step = 0; step < 4096; ++step) {
        bool any = false;
        for (int t = 1; t <= tenants; ++t) {
          if (auto res = a.reserve(TenantId{static_cast<std::uint32_t>(t)}, DeviceOrdinal{d}, Bytes{kMiB})) {
            res->commit();
            any = true;
          }
        }
        if (!any) break;
      }
      REQUIRE(broken(a.snapshot_all()).empty());
      for (int n = 1; n <= namespaces; ++n) {
        const auto ns = static_cast<std::uint32_t>(n);
        const std::uint64_t g = guaranteed[{ns, d}];
        const std::uint64_t used = a.namespace_usage(NamespaceId{ns}, DeviceOrdinal{d}).held().value();
        if (used >= g) continue;
        INFO("namespace " << n << " GPU " << d << " guaranteed " << g << " holds " << used);
        auto res = a.reserve(TenantId{static_cast<std::uint32_t>(tenants + n)}, DeviceOrdinal{d}, Bytes{g - used});
        CHECK(res.has_value());
      }
    }
  }
  CHECK(total_checks >= 50 * kRounds);
  // Every rule was actually contended.
  CHECK(reasons[Refusal::tenant_limit] > 0);
  CHECK(reasons[Refusal::namespace_limit] > 0);
  CHECK(reasons[Refusal::guarantee] > 0);
  CHECK(reasons[Refusal::none] == 0);  // no uncharge was ever clamped
}
