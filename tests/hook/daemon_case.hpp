// Shorthands of the hook tests that run the test tenant against the fake daemon: byte counts,
// numbers as the tenant prints them, the daemon's options for a tenant limit, and the check
// that every grant came back.
#pragma once

#include <catch2/catch.hpp>
#include <cstdint>
#include <string>

#include "fake_daemon.hpp"
#include "units.hpp"

namespace hooktest {

using namespace vlake::testunits;  // kMiB, kGiB, MiB (units.hpp)

// `v` as the tenant's step lines print it (decimal).
inline std::string num(std::uint64_t v) { return std::to_string(v); }

// The fake daemon's defaults with the tenant's limit `limit` (bytes).
inline FakeDaemonOptions with_limit(std::uint64_t limit) {
  FakeDaemonOptions o;
  o.limit = limit;
  return o;
}

// The daemon granted `grants` allocations and every one came back.
inline void check_all_returned(const Counters& c, int grants) {
  CHECK(c.grants_alloc == grants);
  CHECK(c.releases == grants);
  CHECK(c.outstanding == 0);
}

}  // namespace hooktest
