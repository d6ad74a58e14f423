// Shared steps of the daemon tests that drive vlaked through Helper tenants on the simulated GPU
// (the whole-GPU quota file and mib() are the harness's): granting / releasing a run of equal
// grants and waiting for the state segment. The grant steps
// REQUIRE every reply (a failed one ends the calling test case); not thread-safe (a Helper is
// driven from one thread).
#pragma once

#include <catch2/catch.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "harness.hpp"

namespace vlake::pooltest {

// `count` grants of `mib_each` MiB by `h`, each REQUIREd served (status 0) and, with `fill`,
// filled with that byte once served; their ids in grant order.
inline std::vector<std::string> grant_each(Helper& h, int count, std::uint64_t mib_each,
                                           std::optional<int> fill = std::nullopt) {
  std::vector<std::string> ids;
  for (int i = 0; i < count; ++i) {
    auto g = h.ok("grant " + mib(mib_each));
    REQUIRE(num(g, "status") == 0);
    if (fill) h.ok("fill " + g.at("id") + " " + std::to_string(*fill));
    ids.push_back(g.at("id"));
  }
  return ids;
}

// Re-reads the daemon's state segment `state_name` into `s` until holds(*s) (CHECKed, within
// `timeout_ms`); `s` is the last snapshot read.
template <class Holds>
void refresh_until(std::unique_ptr<state::State>& s, const std::string& state_name, Holds&& holds, int timeout_ms) {
  CHECK(eventually(
      [&] {
        s = snapshot(state_name);
        return holds(*s);
      },
      timeout_ms));
}

// Releases every grant of `ids` through `h`.
inline void release_all(Helper& h, const std::vector<std::string>& ids) {
  for (const auto& id : ids) h.ok("release " + id);
}

}  // namespace vlake::pooltest
