// The dedup table (docs/dedup.md): Dedup's plans, shared chunks and their references on one
// device pool of the simulated driver, without a Node (the share protocol is tested in
// test_node_share.cpp, whole processes in tests/dedup/).
#include <catch2/catch.hpp>

#include <unistd.h>

#include <map>
#include <memory>
#include <stdexcept>
#include <vector>

#include "sim_gpu.hpp"
#include "unit_ids.hpp"
#include "vlake/pool/features/dedup/dedup.hpp"

using namespace vlake;
using namespace vlake::pool;
using namespace vlake::literals;

namespace {

using namespace vlake::roomtest;  // kA, kB, kGpu0, kGpu1, kT0 (unit_ids.hpp)

struct Table {
  pooltest::SimGpu gpu{"dedup"};
  Logger log{LogLevel::error};
  DevicePool pool{gpu.driver(), DeviceOrdinal{0}, log};
  Dedup dedup{gpu.driver(), log};

  // A grant of `bytes` for `tenant` whose chunk k (2 MiB) holds byte `first + k`.
  std::vector<std::unique_ptr<PoolHandle>> grant(TenantId tenant, Bytes bytes, std::uint8_t first) {
    DevicePool::Served s = pool.serve(bytes, tenant);
    std::uint8_t k = first;
    for (const auto& h : s.handles) {
      for (std::uint64_t off = 0; off < h->size.value(); off += (2_MiB).value(), ++k) {
        gpu.driver().fill_u8(DevicePtr{h->va.value() + off}, k, 2_MiB);
      }
    }
    return std::move(s.handles);
  }
  void give_back(std::vector<std::unique_ptr<PoolHandle>>& handles, TenantId tenant) {
    for (auto& h : handles) pool.put_back(std::move(h), tenant);
    handles.clear();
  }
};

}  // namespace

TEST_CASE("dedup table: equal chunks of two grants become one shared chunk, counted per reference", "[pool][dedup]") {
  Table t;
  auto a = t.grant(kA, 8_MiB, 1);
  auto b = t.grant(kB, 8_MiB, 1);  // the same four chunks
  const Dedup::Plan& pa = t.dedup.plan(100, 1, t.pool, kA, "team", a, 0_MiB, 8_MiB);
  CHECK(pa.shared == 8_MiB);
  CHECK(pa.merged == 0_MiB);  // nothing to match yet
  REQUIRE(t.dedup.pending(100) != nullptr);
  REQUIRE(t.dedup.commit(100, a, t.pool, kA));
  CHECK(t.dedup.pending(100) == nullptr);
  CHECK(t.dedup.is_shared(1));
  CHECK(t.dedup.chunks() == 4);
  const Dedup::Plan& pb = t.dedup.plan(101, 2, t.pool, kB, "team", b, 0_MiB, 8_MiB);
  CHECK(pb.merged == 8_MiB);  // every chunk matched one of grant 1's
  REQUIRE(t.dedup.commit(101, b, t.pool, kB));
  CHECK(t.dedup.chunks() == 4);
  CHECK(t.dedup.physical_bytes(DeviceOrdinal{0}) == 8_MiB);
  CHECK(t.dedup.logical_bytes(DeviceOrdinal{0}) == 16_MiB);
  CHECK(t.dedup.refs(2).size() == 4);
  // Grant 1 ends: the chunks stay for grant 2.
  t.dedup.release_grant(1, t.pool);
  CHECK_FALSE(t.dedup.is_shared(1));
  CHECK(t.dedup.chunks() == 4);
  CHECK(t.dedup.logical_bytes(DeviceOrdinal{0}) == 8_MiB);
  t.dedup.release_grant(2, t.pool);
  CHECK(t.dedup.chunks() == 0);
  CHECK(t.dedup.physical_bytes(DeviceOrdinal{0}) == 0_MiB);
  t.give_back(a, kA);
  t.give_back(b, kB);
}

TEST_CASE("dedup table: chunks match only within their trust domain, and an aborted plan leaves nothing",
          "[pool][dedup]") {
  Table t;
  auto a = t.grant(kA, 4_MiB, 7);
  auto b = t.grant(kB, 4_MiB, 7);
  REQUIRE(t.dedup.plan(100, 1, t.pool, kA, "one", a, 0_MiB, 4_MiB).shared == 4_MiB);
  REQUIRE(t.dedup.commit(100, a, t.pool, kA));
  const Dedup::Plan& other = t.dedup.plan(101, 2, t.pool, kB, "two", b, 0_MiB, 4_MiB);
  CHECK(other.merged == 0_MiB);  // same bytes, another domain
  CHECK(t.dedup.chunks() == 4);  // its own two chunks, pending
  t.dedup.abort(101, t.pool, kB);
  CHECK(t.dedup.pending(101) == nullptr);
  CHECK_FALSE(t.dedup.is_shared(2));
  CHECK(t.dedup.chunks() == 2);
  t.dedup.release_grant(1, t.pool);
  CHECK(t.dedup.chunks() == 0);
  t.give_back(a, kA);
  t.give_back(b, kB);
}

TEST_CASE("dedup table: a range that is not chunk-aligned is refused and changes nothing", "[pool][dedup]") {
  Table t;
  auto a = t.grant(kA, 4_MiB, 1);
  CHECK_THROWS_AS(t.dedup.plan(100, 1, t.pool, kA, "team", a, 1_MiB, 2_MiB), std::invalid_argument);
  CHECK(t.dedup.pending(100) == nullptr);
  CHECK(t.dedup.chunks() == 0);
  t.give_back(a, kA);
}
