// Accounting with namespaces and guarantees: the grant rule case by case, shared (dedup) chunks
// counted once per saving group by the guarantee rule, and a property test — many threads
// granting, sharing and releasing for random tenants under random configurations while a checker
// asserts that no tenant limit, namespace limit or guarantee is ever broken.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <initializer_list>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "units.hpp"
#include "vlake/pool/accounting.hpp"

using namespace vlake;
using namespace vlake::pool;
using namespace vlake::literals;

using namespace vlake::testunits;  // kMiB, kGiB, MiB (units.hpp)

namespace {

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
  // Per device: Σ guaranteed, Σ borrowed of the namespaces with a guarantee (held less their
  // savings), Σ held of the others (whose savings are counted together).
  struct Dev {
    std::uint64_t guaranteed = 0;
    std::uint64_t borrowed = 0;
    std::uint64_t unguaranteed_held = 0;
  };
  std::map<std::int32_t, Dev> dev;
  for (const auto& n : s.namespaces) {
    const std::string id = "namespace " + std::to_string(n.ns.value()) + " GPU " + std::to_string(n.device.value());
    if (n.usage.held() > n.usage.limit) out.push_back(id + " above its limit");
    const auto& sum = sums[{n.ns.value(), n.device.value()}];
    if (sum.granted != n.usage.granted || sum.nonpool != n.usage.nonpool || sum.reserved != n.usage.reserved) {
      out.push_back(id + ": sums differ from its tenants'");
    }
    const std::uint64_t h = n.usage.held().value();
    const std::uint64_t g = n.usage.guaranteed.value();
    const std::uint64_t saved = n.usage.dedup_saved.value();
    if (saved > h) out.push_back(id + ": saves more than it holds");
    if (g == 0 && saved != 0) out.push_back(id + ": savings of its own without a guarantee");
    Dev& x = dev[n.device.value()];
    x.guaranteed += g;
    if (g == 0) {
      x.unguaranteed_held += h;
    } else {
      const std::uint64_t p = h - std::min(h, saved);
      x.borrowed += p > g ? p - g : 0;
    }
  }
  for (const auto& d : s.devices) {
    Dev& x = dev[d.device.value()];
    if (d.unguaranteed_saved.value() > x.unguaranteed_held) {
      out.push_back("GPU " + std::to_string(d.device.value()) + ": unguaranteed savings above their usage");
    }
    x.borrowed += x.unguaranteed_held - std::min(x.unguaranteed_held, d.unguaranteed_saved.value());
    if (d.borrowed.value() != x.borrowed) {
      out.push_back("GPU " + std::to_string(d.device.value()) + ": borrowed " + std::to_string(d.borrowed.value()) +
                    " but the namespaces add up to " + std::to_string(x.borrowed));
    }
    if (d.dedup_saved + d.dedup_physical > d.dedup_logical) {
      out.push_back("GPU " + std::to_string(d.device.value()) + ": savings above logical - physical");
    }
    if (d.capacity == 0_B) continue;
    const std::uint64_t g = x.guaranteed;
    const std::uint64_t b = x.borrowed;
    const std::uint64_t unguaranteed = g >= d.capacity.value() ? 0 : d.capacity.value() - g;
    if (b > unguaranteed) {
      out.push_back("GPU " + std::to_string(d.device.value()) + ": borrowed " + std::to_string(b) + " > unguaranteed " +
                    std::to_string(unguaranteed));
    }
  }
  return out;
}

// Device 0 of `a` as a 100 MiB GPU with namespaces 1, 2, ... given these (limit, guarantee), in
// order; their ids.
struct NamespaceQuota {
  Bytes limit;
  Bytes guaranteed;
};
std::vector<NamespaceId> gpu_of_100_mib(Accounting& a, std::initializer_list<NamespaceQuota> quotas) {
  const DeviceOrdinal d{0};
  a.set_capacity(d, 100_MiB);
  std::vector<NamespaceId> ids;
  for (const NamespaceQuota& q : quotas) {
    ids.push_back(NamespaceId{static_cast<std::uint32_t>(ids.size() + 1)});
    a.set_namespace(ids.back(), d, q.limit, q.guaranteed);
  }
  return ids;
}

}  // namespace

TEST_CASE("quota accounting: tenant, namespace and guarantee rules, distinct reasons", "[pool][accounting][quota]") {
  Accounting a;
  const DeviceOrdinal d{0};
  // research: limit 60, guaranteed 40; batch: guaranteed 20; other: none (U = 100 - 60 = 40).
  const std::vector<NamespaceId> ns = gpu_of_100_mib(a, {{60_MiB, 40_MiB}, {100_MiB, 20_MiB}, {100_MiB, 0_B}});
  const NamespaceId research = ns[0];
  const NamespaceId batch = ns[1];
  const NamespaceId other = ns[2];
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

namespace {

// `n` shared chunks of 2 MiB with ids first, first + 1, ...
std::vector<SharedRef> chunks(std::uint64_t first, int n) {
  std::vector<SharedRef> v;
  for (int i = 0; i < n; ++i) v.push_back(SharedRef{first + static_cast<std::uint64_t>(i), 2_MiB});
  return v;
}

// Reserves and commits `n` bytes for `t`; false if refused (`why` says by which rule).
bool take(Accounting& a, TenantId t, DeviceOrdinal d, Bytes n, Refusal* why = nullptr) {
  auto r = a.reserve(t, d, n, nullptr, why);
  if (!r) return false;
  r->commit();
  return true;
}

}  // namespace

TEST_CASE("quota accounting: the guarantee rule counts shared chunks once and limits count what tenants map",
          "[pool][accounting][quota][dedup]") {
  // 100 MiB GPU; `serve` (guaranteed 20, limit 80) runs four replicas of 20 MiB of weights,
  // `batch` (no guarantee) wants what their sharing saved, `team` keeps its 10 MiB guarantee.
  Accounting a;
  const DeviceOrdinal d{0};
  const std::vector<NamespaceId> ns =
      gpu_of_100_mib(a, {{80_MiB, 20_MiB}, {100_MiB, 0_B}, {100_MiB, 10_MiB}});  // U = 100 - 30 = 70
  const NamespaceId serve = ns[0];
  const NamespaceId batch = ns[1];
  const NamespaceId team = ns[2];
  const std::vector<TenantId> replicas = {TenantId{1}, TenantId{2}, TenantId{3}, TenantId{4}};
  const TenantId b1{5};
  const TenantId t1{6};
  for (TenantId t : replicas) {
    a.set_limit(t, d, 20_MiB);
    a.assign(t, serve);
    REQUIRE(take(a, t, d, 20_MiB));
  }
  a.set_limit(b1, d, 100_MiB);
  a.assign(b1, batch);
  a.set_limit(t1, d, 100_MiB);
  a.assign(t1, team);
  // Unshared: serve borrows 60 of the 70 unguaranteed; batch gets 10.
  Refusal why = Refusal::none;
  CHECK(a.device_usage(d).borrowed == 60_MiB);
  CHECK_FALSE(a.reserve(b1, d, 12_MiB, nullptr, &why).has_value());
  CHECK(why == Refusal::guarantee);

  // The four share the same 10 chunks: one physical copy.
  for (TenantId t : replicas) a.share(t, d, chunks(100, 10));
  const auto shared = a.device_usage(d);
  CHECK(shared.dedup_logical == 80_MiB);
  CHECK(shared.dedup_physical == 20_MiB);
  CHECK(shared.dedup_saved == 60_MiB);
  CHECK(a.namespace_usage(serve, d).dedup_saved == 60_MiB);
  CHECK(shared.borrowed == 0_B);  // serve's 20 MiB physical are within its guarantee
  // Every replica and the namespace are still charged what they map.
  for (TenantId t : replicas) CHECK(a.usage(t, d).used() == 20_MiB);
  CHECK(a.namespace_usage(serve, d).used() == 80_MiB);
  CHECK_FALSE(a.reserve(replicas[0], d, 2_MiB, nullptr, &why).has_value());
  CHECK(why == Refusal::tenant_limit);
  a.set_limit(replicas[0], d, 40_MiB);
  CHECK_FALSE(a.reserve(replicas[0], d, 2_MiB, nullptr, &why).has_value());
  CHECK(why == Refusal::namespace_limit);  // 80 MiB logical: the namespace limit counts what tenants map

  // batch is granted all of the unguaranteed memory, the 60 MiB sharing saved included; not a
  // byte of team's guarantee.
  CHECK(take(a, b1, d, 70_MiB, &why));
  CHECK_FALSE(a.reserve(b1, d, 2_MiB, nullptr, &why).has_value());
  CHECK(why == Refusal::guarantee);
  CHECK(take(a, t1, d, 10_MiB));
  CHECK(broken(a.snapshot_all()).empty());
  // Physically: serve 20 + batch 70 + team 10 = the GPU.

  // Sharers exit one by one: serve's physical bytes never rise, nothing breaks.
  for (std::size_t i = 0; i < replicas.size(); ++i) {
    CHECK(a.uncharge(replicas[i], d, 20_MiB, chunks(100, 10)));
    INFO("after " << i + 1 << " exits");
    const auto u = a.device_usage(d);
    const std::uint64_t left = replicas.size() - i - 1;
    CHECK(u.dedup_logical == Bytes{left * 20 * kMiB});
    CHECK(u.dedup_physical == (left > 0 ? 20_MiB : 0_B));
    CHECK(u.dedup_saved == Bytes{(left > 0 ? left - 1 : 0) * 20 * kMiB});
    CHECK(broken(a.snapshot_all()).empty());
  }
  // Exactly zero, and serve gets its whole guarantee back.
  const auto end = a.device_usage(d);
  CHECK(end.dedup_logical == 0_B);
  CHECK(end.dedup_physical == 0_B);
  CHECK(end.dedup_saved == 0_B);
  CHECK(end.unguaranteed_saved == 0_B);
  CHECK(a.namespace_usage(serve, d).used() == 0_B);
  CHECK(a.namespace_usage(serve, d).dedup_saved == 0_B);
  CHECK(take(a, replicas[1], d, 20_MiB));
  CHECK(broken(a.snapshot_all()).empty());
  for (TenantId t : replicas) CHECK(a.remove_tenant(t) == (t != replicas[1]));
}

TEST_CASE("quota accounting: savings inside a guarantee are not lent and a chunk counts once per saving group",
          "[pool][accounting][quota][dedup]") {
  Accounting a;
  const DeviceOrdinal d{0};
  const std::vector<NamespaceId> ns =
      gpu_of_100_mib(a, {{100_MiB, 40_MiB}, {100_MiB, 0_B}, {100_MiB, 0_B}, {100_MiB, 10_MiB}});  // U = 50
  const NamespaceId gua = ns[0];                                                                  // guaranteed 40
  const NamespaceId b = ns[1];                                                                    // no guarantee
  const NamespaceId c = ns[2];                                                                    // no guarantee
  const NamespaceId h = ns[3];                                                                    // guaranteed 10
  const TenantId a1{1}, a2{2}, b1{3}, c1{4}, h1{5};
  for (TenantId t : {a1, a2, b1, c1, h1}) a.set_limit(t, d, 100_MiB);
  a.assign(a1, gua);
  a.assign(a2, gua);
  a.assign(b1, b);
  a.assign(c1, c);
  a.assign(h1, h);
  Refusal why = Refusal::none;

  // Two tenants of `gua` share 20 MiB: 20 MiB physical of its 40 MiB guarantee. The savings stay
  // gua's: b and c still get only the 50 unguaranteed MiB.
  REQUIRE(take(a, a1, d, 20_MiB));
  REQUIRE(take(a, a2, d, 20_MiB));
  a.share(a1, d, chunks(1, 10));
  a.share(a2, d, chunks(1, 10));
  CHECK(a.namespace_usage(gua, d).dedup_saved == 20_MiB);
  CHECK(a.device_usage(d).borrowed == 0_B);
  CHECK(take(a, b1, d, 40_MiB));
  CHECK(take(a, c1, d, 10_MiB));
  CHECK_FALSE(a.reserve(b1, d, 2_MiB, nullptr, &why).has_value());
  CHECK(why == Refusal::guarantee);
  // gua may fill its guarantee physically: 20 MiB more although it holds 40 logical already.
  CHECK(take(a, a1, d, 20_MiB));
  CHECK_FALSE(a.reserve(a1, d, 2_MiB, nullptr, &why).has_value());
  CHECK(why == Refusal::guarantee);
  // a2 exits: its savings go with its charge; the GPU still adds up.
  CHECK(a.uncharge(a2, d, 20_MiB, chunks(1, 10)));
  CHECK(a.namespace_usage(gua, d).dedup_saved == 0_B);
  CHECK(broken(a.snapshot_all()).empty());
  // h1 still gets its guarantee.
  CHECK(take(a, h1, d, 10_MiB));
  CHECK(broken(a.snapshot_all()).empty());

  // b1 and c1 (namespaces without a guarantee) share 10 MiB: counted once for both, so b1 gets
  // the 10 MiB saved.
  a.share(b1, d, chunks(50, 5));
  a.share(c1, d, chunks(50, 5));
  CHECK(a.device_usage(d).unguaranteed_saved == 10_MiB);
  CHECK(take(a, b1, d, 10_MiB));
  CHECK_FALSE(a.reserve(b1, d, 2_MiB, nullptr, &why).has_value());
  CHECK(why == Refusal::guarantee);
  CHECK(broken(a.snapshot_all()).empty());
  // a1 (gua) maps the same chunks: no saving for either group (gua pays its own copy).
  a.share(a1, d, chunks(50, 5));
  auto u = a.device_usage(d);
  CHECK(u.dedup_logical == 20_MiB + 30_MiB);  // chunks 1.. once (a1), chunks 50.. three times
  CHECK(u.dedup_physical == 20_MiB + 10_MiB);
  CHECK(u.unguaranteed_saved == 10_MiB);
  CHECK(a.namespace_usage(gua, d).dedup_saved == 0_B);
  CHECK(u.dedup_saved == 10_MiB);
  CHECK(broken(a.snapshot_all()).empty());

  // A reload gives `c` a guarantee: c1's references form a group of their own and b's savings
  // go. Like any guarantee added while others borrow, a fact: b is refused until usage drops.
  a.set_namespace(c, d, 100_MiB, 5_MiB);
  u = a.device_usage(d);
  CHECK(u.unguaranteed_saved == 0_B);
  CHECK(u.dedup_saved == 0_B);
  CHECK_FALSE(broken(a.snapshot_all()).empty());
  CHECK_FALSE(a.reserve(b1, d, 2_MiB, nullptr, &why).has_value());
  CHECK(why == Refusal::guarantee);
  // c1 moves to b: b's tenants save together again; back to c: they do not.
  a.assign(c1, b);
  CHECK(a.device_usage(d).unguaranteed_saved == 10_MiB);
  a.assign(c1, c);
  CHECK(a.device_usage(d).unguaranteed_saved == 0_B);
  a.set_namespace(c, d, 100_MiB, 0_B);
  CHECK(a.device_usage(d).unguaranteed_saved == 10_MiB);
  CHECK(broken(a.snapshot_all()).empty());

  // References the tenant does not hold are reported (and change nothing); a tenant with
  // references is not forgotten.
  CHECK_FALSE(a.uncharge(b1, d, 0_B, chunks(999, 1)));
  CHECK(a.usage(b1, d).granted == 50_MiB);
  CHECK_FALSE(a.uncharge(c1, d, 0_B, chunks(50, 1)));  // references worth more than the bytes
  a.share(c1, d, chunks(50, 1));
  CHECK_FALSE(a.remove_tenant(c1));
  CHECK(a.uncharge(c1, d, 10_MiB, chunks(50, 5)));
  CHECK(a.remove_tenant(c1));
  CHECK(a.device_usage(d).unguaranteed_saved == 0_B);
  // Everyone exits: exactly zero.
  CHECK(a.uncharge(b1, d, 50_MiB, chunks(50, 5)));
  auto both = chunks(1, 10);
  for (const SharedRef& r : chunks(50, 5)) both.push_back(r);
  CHECK(a.uncharge(a1, d, 40_MiB, both));
  CHECK(a.uncharge(h1, d, 10_MiB));
  u = a.device_usage(d);
  CHECK(u.dedup_logical == 0_B);
  CHECK(u.dedup_physical == 0_B);
  CHECK(u.dedup_saved == 0_B);
  CHECK(u.borrowed == 0_B);
  for (NamespaceId n : {gua, b, c, h}) {
    CHECK(a.namespace_usage(n, d).held() == 0_B);
    CHECK(a.namespace_usage(n, d).dedup_saved == 0_B);
  }
  CHECK(broken(a.snapshot_all()).empty());
}

TEST_CASE("quota accounting: property — concurrent grants and shares never break a limit or a guarantee",
          "[pool][accounting][quota]") {
  constexpr int kRounds = 6;
  constexpr int kDevices = 2;
  constexpr int kThreads = 8;
  constexpr int kOps = 6000;
  std::map<Refusal, std::uint64_t> reasons;
  std::uint64_t total_checks = 0;
  std::uint64_t total_saved = 0;
  constexpr std::uint64_t kChunk = 2 * kMiB;
  constexpr std::uint64_t kChunks = 6;
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
    // Shared chunks (2 MiB, ids 1..kChunks per GPU) each worker's grants map: at most its bytes.
    std::vector<std::map<std::pair<std::uint32_t, std::int32_t>, std::vector<std::uint64_t>>> refs(kThreads);
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
          auto& shared = refs[static_cast<std::size_t>(w)][{t, d}];
          const std::uint64_t op = r() % 10;
          if (op < 5) {
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
          } else if (op < 7) {
            // A share: part of what it holds now maps a shared chunk.
            if (h >= (shared.size() + 1) * kChunk) {
              const std::uint64_t chunk = 1 + r() % kChunks;
              a.share(TenantId{t}, DeviceOrdinal{d}, {SharedRef{chunk, Bytes{kChunk}}});
              shared.push_back(chunk);
            }
          } else if (h > 0) {
            // A release: the references of the released bytes go with them (and the bytes
            // released are at least theirs, as when a grant ends).
            std::uint64_t n = std::min<std::uint64_t>(h, (1 + r() % 24) * kMiB);
            std::vector<SharedRef> dropped;
            while (shared.size() * kChunk > h - n) {
              dropped.push_back(SharedRef{shared.back(), Bytes{kChunk}});
              shared.pop_back();
            }
            n = std::max<std::uint64_t>(n, dropped.size() * kChunk);
            if (!a.uncharge(TenantId{t}, DeviceOrdinal{d}, Bytes{n}, dropped))
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

    // What sharing saves, by saving group, equals the workers' references.
    for (int d = 0; d < kDevices; ++d) {
      std::map<std::uint64_t, std::map<std::uint64_t, std::uint64_t>> by_chunk;  // chunk -> group -> refs
      std::uint64_t logical = 0;
      for (const auto& m : refs) {
        for (const auto& [key, v] : m) {
          if (key.second != d) continue;
          const std::uint32_t ns = a.namespace_of(TenantId{key.first}).value();
          const std::uint64_t group = guaranteed[{ns, d}] > 0 ? ns : 0;
          for (std::uint64_t c : v) ++by_chunk[c][group];
          logical += v.size() * kChunk;
        }
      }
      std::map<std::uint64_t, std::uint64_t> saved;  // group -> bytes
      for (const auto& [c, groups] : by_chunk) {
        for (const auto& [g, n] : groups) saved[g] += (n - 1) * kChunk;
      }
      const auto du = a.device_usage(DeviceOrdinal{d});
      CHECK(du.dedup_logical.value() == logical);
      CHECK(du.dedup_physical.value() == by_chunk.size() * kChunk);
      CHECK(du.unguaranteed_saved.value() == saved[0]);
      for (int n = 1; n <= namespaces; ++n) {
        const auto ns = static_cast<std::uint32_t>(n);
        CHECK(a.namespace_usage(NamespaceId{ns}, DeviceOrdinal{d}).dedup_saved.value() == saved[ns]);
      }
      total_saved += du.dedup_saved.value();
    }

    // Guarantees are real: fill every GPU with storm tenants until everything is refused, then
    // each namespace's probe still gets the rest of its guarantee, in physical bytes (what it
    // holds less what its tenants' sharing saves).
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
        const auto nu = a.namespace_usage(NamespaceId{ns}, DeviceOrdinal{d});
        const std::uint64_t used = nu.held().value() - nu.dedup_saved.value();
        // (Its limit counts logical bytes: a probe that would pass it is not a guarantee case.)
        if (used >= g || nu.held().value() + (g - used) > ns_limit[{ns, d}]) continue;
        INFO("namespace " << n << " GPU " << d << " guaranteed " << g << " holds " << nu.held().value() << " saves "
                          << nu.dedup_saved.value());
        auto res = a.reserve(TenantId{static_cast<std::uint32_t>(tenants + n)}, DeviceOrdinal{d}, Bytes{g - used});
        CHECK(res.has_value());
      }
    }
  }
  CHECK(total_checks >= 50 * kRounds);
  // Sharing was exercised (savings inside a guarantee: the cases above).
  CHECK(total_saved > 0);
  // Every rule was actually contended.
  CHECK(reasons[Refusal::tenant_limit] > 0);
  CHECK(reasons[Refusal::namespace_limit] > 0);
  CHECK(reasons[Refusal::guarantee] > 0);
  CHECK(reasons[Refusal::none] == 0);  // no uncharge was ever clamped
}
