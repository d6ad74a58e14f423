// ContextBook (pool/features/contexts): what admitted CUDA contexts charge a tenant before and
// after NVML shows them, and how the context size of a GPU is learned — without a Node.
#include <catch2/catch.hpp>

#include "unit_ids.hpp"
#include "units.hpp"
#include "vlake/pool/features/contexts/context_book.hpp"

using namespace vlake;
using namespace vlake::pool;

namespace {
using namespace vlake::roomtest;   // kA, kB, kGpu0, kGpu1, kT0 (unit_ids.hpp)
using namespace vlake::testunits;  // kMiB, kGiB, MiB (units.hpp)
const TenantId alice{1};
const TenantId bob{2};
}  // namespace

TEST_CASE("contexts: the size is the default until measured, then vlaked's own context, tenants never move it",
          "[contexts]") {
  ContextBook b(std::nullopt, Bytes{512 * kMiB});
  CHECK(b.size(kGpu0) == Bytes{512 * kMiB});
  CHECK(std::string(b.source(kGpu0)) == "default");
  b.observe_daemon(kGpu0, Bytes{500 * kMiB});
  CHECK(b.size(kGpu0) == Bytes{500 * kMiB});
  CHECK(std::string(b.source(kGpu0)) == "daemon");
  b.observe_daemon(kGpu0, Bytes{700 * kMiB});  // a handle built off the loop: the least reading counts
  CHECK(b.size(kGpu0) == Bytes{500 * kMiB});
  CHECK(b.size(kGpu1) == Bytes{512 * kMiB});  // per GPU

  // Tenants' readings race their own counted memory (on the H200 a size learned from them
  // charged a 518 MiB context 14 MiB, and 774 MiB in another run), and tenants are untrusted: no
  // reading of theirs, from however many processes, moves the size.
  for (std::uint64_t s = 10; s < 30; ++s) {
    b.admit(s, alice, kGpu0);
    b.observe(s, kGpu0, true, Bytes{(s % 2 == 0 ? 14 : 20000) * kMiB});
  }
  CHECK(b.size(kGpu0) == Bytes{500 * kMiB});
  CHECK(std::string(b.source(kGpu0)) == "daemon");
  // A low reading is not a low charge: the admitted size stays until NVML shows more.
  CHECK(b.extra(alice, kGpu0) == Bytes{10 * (500 - 14) * kMiB});
}

TEST_CASE("contexts: a fixed size is never learned", "[contexts]") {
  ContextBook b(Bytes{256 * kMiB}, Bytes{512 * kMiB});
  b.observe_daemon(kGpu0, Bytes{500 * kMiB});
  b.admit(1, alice, kGpu0);
  b.observe(1, kGpu0, true, Bytes{518 * kMiB});
  CHECK(b.size(kGpu0) == Bytes{256 * kMiB});
  CHECK(std::string(b.source(kGpu0)) == "fixed");
}

TEST_CASE("contexts: an admitted context counts until NVML shows it, then the charge follows the measurement",
          "[contexts]") {
  ContextBook b(Bytes{500 * kMiB}, Bytes{0});
  b.measured(alice, kGpu0, Bytes{0});
  b.admit(1, alice, kGpu0);
  b.admit(2, alice, kGpu0);
  CHECK(b.contexts_of(alice, kGpu0) == 2);
  CHECK(b.extra(alice, kGpu0) == Bytes{1000 * kMiB});
  CHECK(b.charge(alice, kGpu0) == Bytes{1000 * kMiB});
  CHECK(b.charge(alice, kGpu1) == Bytes{0});
  CHECK(b.charge(bob, kGpu0) == Bytes{0});
  // A reading lists process 1 with a bigger context than the size: its figure is charged.
  b.observe(1, kGpu0, true, Bytes{600 * kMiB});
  b.observe(2, kGpu0, false, Bytes{0});
  b.measured(alice, kGpu0, Bytes{600 * kMiB});
  CHECK(b.charge(alice, kGpu0) == Bytes{1100 * kMiB});
  // A smaller figure than admitted: the admitted size stays (the context may still be growing).
  b.observe(2, kGpu0, true, Bytes{100 * kMiB});
  b.measured(alice, kGpu0, Bytes{700 * kMiB});
  CHECK(b.charge(alice, kGpu0) == Bytes{1100 * kMiB});
  // Released: only NVML's figure is left, until the next reading drops it too.
  CHECK(b.release(2, kGpu0));
  CHECK_FALSE(b.release(2, kGpu0));
  CHECK(b.charge(alice, kGpu0) == Bytes{700 * kMiB});
  // The session moves (a reload) or ends: its admission follows or goes.
  b.move(1, bob);
  CHECK(b.contexts_of(alice, kGpu0) == 0);
  CHECK(b.contexts_of(bob, kGpu0) == 1);
  CHECK(b.forget(1) == bob);
  CHECK(b.forget(1) == std::nullopt);
  CHECK(b.empty());
}
