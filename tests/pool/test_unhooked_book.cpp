// Memory outside vlake (docs/daemon.md, "Memory outside vlake"): UnhookedBook's per-tenant
// figures, the `enforce: kill` grace and the process-to-tenant cache, without a Node (the
// attribution of NVML readings is tested in test_node.cpp).
#include <catch2/catch.hpp>

#include <chrono>
#include <vector>

#include "unit_ids.hpp"
#include "vlake/pool/features/unhooked/unhooked_book.hpp"

using namespace vlake;
using namespace vlake::pool;
using namespace std::chrono_literals;
using namespace vlake::literals;

namespace {
using namespace vlake::roomtest;  // kA, kB, kGpu0, kGpu1, kT0 (unit_ids.hpp)

UnhookedBook::Bytes on_gpu0(std::uint64_t b) {
  UnhookedBook::Bytes out{};
  out[0] = b;
  return out;
}
}  // namespace

TEST_CASE("unhooked book: figures per tenant, a change is bytes or the number of processes", "[pool][unhooked]") {
  UnhookedBook book;
  CHECK(book.of(kA).empty());
  CHECK(book.record(kA, on_gpu0(100), {{10, 1000, 100_MiB}}));
  CHECK(book.of(kA).bytes[0] == 100);
  CHECK_FALSE(book.of(kA).empty());
  CHECK(book.of(kB).empty());                                         // other tenants are unaffected
  CHECK_FALSE(book.record(kA, on_gpu0(100), {{11, 1001, 100_MiB}}));  // same count, same bytes
  CHECK(book.record(kA, on_gpu0(120), {{11, 1001, 100_MiB}}));
  CHECK(book.record(kA, on_gpu0(120), {}));
  CHECK(book.record(kA, on_gpu0(0), {}));
  CHECK(book.of(kA).empty());
  book.record(kB, on_gpu0(5), {});
  book.forget(kB);
  CHECK(book.of(kB).empty());
}

TEST_CASE("unhooked book: newcomers are the processes the previous reading did not have", "[pool][unhooked]") {
  UnhookedBook book;
  const std::vector<UnhookedProcess> first{{10, 1000, 1_MiB}};
  CHECK(book.newcomers(kA, first).size() == 1);
  book.record(kA, on_gpu0(1), first);
  CHECK(book.newcomers(kA, first).empty());
  const std::vector<UnhookedProcess> more{{10, 1000, 1_MiB}, {11, 1001, 2_MiB}};
  const std::vector<UnhookedProcess> fresh = book.newcomers(kA, more);
  REQUIRE(fresh.size() == 1);
  CHECK(fresh[0].pid == 11);
  // As many as before: nobody is counted new (a process replaced another).
  CHECK(book.newcomers(kA, {{12, 1002, 1_MiB}}).empty());
}

TEST_CASE("unhooked book: over a limit for the grace, the processes are killed once", "[pool][unhooked]") {
  UnhookedBook book;
  using V = UnhookedBook::Verdict;
  CHECK(book.over_limit(kA, false, kT0, 1000ms) == V::none);
  CHECK(book.over_limit(kA, true, kT0, 1000ms) == V::grace);
  CHECK(book.of(kA).over_since == kT0);
  CHECK(book.over_limit(kA, true, kT0 + 999ms, 1000ms) == V::none);
  CHECK(book.over_limit(kA, true, kT0 + 1000ms, 1000ms) == V::kill);
  CHECK_FALSE(book.of(kA).over_since.has_value());  // the grace starts again
  CHECK(book.over_limit(kA, true, kT0 + 1001ms, 1000ms) == V::grace);
  // Back under the limit: the grace is reset.
  CHECK(book.over_limit(kA, false, kT0 + 1500ms, 1000ms) == V::none);
  CHECK(book.over_limit(kA, true, kT0 + 2100ms, 1000ms) == V::grace);
  // No grace: killed at once.
  CHECK(book.over_limit(kB, true, kT0, 0ms) == V::kill);
}

TEST_CASE("unhooked book: the tenant of a process is cached by pid and start time", "[pool][unhooked]") {
  UnhookedBook book;
  CHECK_FALSE(book.cached(10, 1000).has_value());
  book.remember(10, 1000, kA);
  book.remember(11, 1001, kB);
  CHECK(book.cached(10, 1000) == kA);
  CHECK_FALSE(book.cached(10, 2000).has_value());  // the pid was reused
  book.prune([](std::uint32_t pid, std::uint64_t) { return pid == 11; });
  CHECK_FALSE(book.cached(10, 1000).has_value());
  CHECK(book.cached(11, 1001) == kB);
  book.clear_cache();
  CHECK_FALSE(book.cached(11, 1001).has_value());
}
