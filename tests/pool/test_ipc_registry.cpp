// CUDA IPC bookkeeping (docs/ipc.md): IpcRegistry's tokens, imports and held grants, without a
// Node (who may open what is the Node's, tested in test_node.cpp).
#include <catch2/catch.hpp>

#include <algorithm>
#include <memory>
#include <optional>
#include <stdexcept>
#include <unordered_set>
#include <vector>

#include "vlake/pool/features/ipc/ipc_registry.hpp"

using namespace vlake;
using namespace vlake::pool;

namespace {

// A random source that answers `values` in turn.
IpcRegistry::Random sequence(std::vector<std::uint64_t> values) {
  auto next = std::make_shared<std::size_t>(0);
  return [values = std::move(values), next]() {
    if (*next >= values.size()) throw std::runtime_error("out of values");
    return values[(*next)++];
  };
}

}  // namespace

TEST_CASE("ipc registry: a grant's token and secret are drawn once, tokens unique and non-zero", "[pool][ipc]") {
  IpcRegistry reg;
  bool fresh = false;
  const IpcRegistry::Export& a = reg.export_grant(1, sequence({0, 11, 0, 12}), &fresh);
  CHECK(fresh);
  CHECK(a.token == 11);  // 0 is never a token
  CHECK(a.secret == 12);
  // The same grant again: the same values, nothing drawn.
  const IpcRegistry::Export& again = reg.export_grant(1, sequence({}), &fresh);
  CHECK_FALSE(fresh);
  CHECK(again.token == 11);
  // Another grant: a token already in use is drawn again.
  const IpcRegistry::Export& b = reg.export_grant(2, sequence({11, 21, 22}));
  CHECK(b.token == 21);
  CHECK(b.secret == 22);
  CHECK(reg.find(11, 12) == std::optional<std::uint64_t>(1));
  CHECK(reg.find(21, 22) == std::optional<std::uint64_t>(2));
  CHECK_FALSE(reg.find(11, 22).has_value());  // wrong secret
  CHECK_FALSE(reg.find(99, 12).has_value());  // unknown token
  CHECK(reg.known_token(11));
  CHECK_FALSE(reg.known_token(99));
  // A failing random source records nothing.
  CHECK_THROWS(reg.export_grant(3, sequence({31})));
  CHECK(reg.export_grant(3, sequence({31, 32}), &fresh).token == 31);
  CHECK(fresh);
  // The grant ends: its token dies with it.
  reg.forget_grant(1);
  CHECK_FALSE(reg.known_token(11));
  CHECK_FALSE(reg.find(11, 12).has_value());
}

TEST_CASE("ipc registry: imports count per grant and mark it imported for good", "[pool][ipc]") {
  IpcRegistry reg;
  CHECK_FALSE(reg.ever_imported(5));
  const std::uint64_t i1 = reg.open(100, TenantId{1}, 5).id;
  const std::uint64_t i2 = reg.open(101, TenantId{2}, 5).id;
  const std::uint64_t i3 = reg.open(100, TenantId{1}, 6).id;
  CHECK(i1 != i2);
  CHECK(reg.imports().size() == 3);
  CHECK(reg.imports().at(i2).tenant == TenantId{2});
  CHECK(reg.imports_open(5) == 2);
  CHECK(reg.ever_imported(5));
  std::vector<std::uint64_t> of100 = reg.imports_of_session(100);
  std::sort(of100.begin(), of100.end());
  CHECK(of100 == std::vector<std::uint64_t>{i1, i3});
  const auto c = reg.close(i1);
  REQUIRE(c.has_value());
  CHECK(c->grant == 5);
  CHECK_FALSE(c->finish);                  // not released by its owner
  CHECK_FALSE(reg.close(i1).has_value());  // closed already
  CHECK(reg.imports_open(5) == 1);
  CHECK(reg.ever_imported(5));
}

TEST_CASE("ipc registry: a released grant is held until its last import closes", "[pool][ipc]") {
  IpcRegistry reg;
  CHECK_FALSE(reg.hold(7));  // no imports: finished at once
  CHECK_FALSE(reg.released(7));
  const std::uint64_t i1 = reg.open(100, TenantId{1}, 7).id;
  const std::uint64_t i2 = reg.open(101, TenantId{1}, 7).id;
  CHECK(reg.hold(7));
  CHECK(reg.released(7));
  const auto first = reg.close(i1);
  REQUIRE(first.has_value());
  CHECK_FALSE(first->finish);
  const auto last = reg.close(i2);
  REQUIRE(last.has_value());
  CHECK(last->finish);
  reg.forget_grant(7);
  CHECK_FALSE(reg.released(7));
  CHECK_FALSE(reg.ever_imported(7));
}

TEST_CASE("ipc registry: per-session grant counts and released grants follow opens, closes and ends", "[pool][ipc]") {
  // What the state publisher reads instead of walking every import and grant.
  IpcRegistry reg;
  const std::uint64_t a1 = reg.open(100, TenantId{1}, 5).id;
  const std::uint64_t a2 = reg.open(100, TenantId{1}, 5).id;
  const std::uint64_t b1 = reg.open(100, TenantId{1}, 6).id;
  const std::uint64_t c1 = reg.open(101, TenantId{2}, 5).id;
  REQUIRE(reg.per_session().count(100) == 1);
  const auto& s100 = reg.per_session().at(100);
  CHECK(s100.count == 3);
  CHECK(s100.grants.size() == 2);
  CHECK(s100.grants.at(5) == 2);
  CHECK(s100.grants.at(6) == 1);
  CHECK(reg.per_session().at(101).grants.at(5) == 1);
  CHECK(reg.released_grants().empty());

  REQUIRE(reg.close(a1).has_value());
  CHECK(reg.per_session().at(100).grants.at(5) == 1);
  REQUIRE(reg.close(b1).has_value());
  CHECK(reg.per_session().at(100).grants.count(6) == 0);  // its last import of 6 closed
  CHECK(reg.hold(5));
  CHECK(reg.released_grants() == std::unordered_set<std::uint64_t>{5});
  REQUIRE(reg.close(a2).has_value());
  CHECK(reg.per_session().count(100) == 0);  // the session holds no import any more
  const auto last = reg.close(c1);
  REQUIRE(last.has_value());
  CHECK(last->finish);
  reg.forget_grant(5);
  CHECK(reg.released_grants().empty());
  CHECK(reg.per_session().empty());
}
