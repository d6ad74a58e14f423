// The Kubernetes allocation-directory format (contracts/allocation.hpp), shared by the device
// plugin (writer) and vlaked (reader): files round-trip, bad ones are refused, tenant names.
#include <catch2/catch.hpp>

#include <optional>
#include <string>

#include "vlake/contracts/allocation.hpp"

using namespace vlake;

TEST_CASE("allocation: allocation and owner files round-trip and bad ones are rejected", "[contracts][allocation]") {
  alloc::Allocation a;
  a.id = alloc::new_id();
  CHECK(alloc::valid_id(a.id));
  a.gpu_uuid = "GPU-2bd0e1d3-5c8a-4f1e-9d7b-0a1b2c3d4e5f";
  a.device_ids = {a.gpu_uuid + "::0", a.gpu_uuid + "::1"};
  a.bytes = Bytes{2ull << 30};
  a.created = 1718000000;
  const auto b = alloc::parse_allocation(alloc::format_allocation(a), "x");
  CHECK(b.id == a.id);
  CHECK(b.gpu_uuid == a.gpu_uuid);
  CHECK(b.device_ids == a.device_ids);
  CHECK(b.bytes == a.bytes);
  CHECK(b.created == a.created);
  CHECK_THROWS_WITH(alloc::parse_allocation("version=2\nid=0123456789abcdef\n", "f"), Catch::Contains("version"));
  CHECK_THROWS_WITH(alloc::parse_allocation("version=1\nid=../etc\n", "f"), Catch::Contains("bad id"));
  const alloc::Owner o{"research", "train-0", "worker"};
  CHECK(alloc::parse_owner(alloc::format_owner(o), "x") == o);
  CHECK_THROWS_AS(alloc::parse_owner("version=1\nnamespace=a/b\npod=p\ncontainer=c\n", "x"), alloc::FormatError);
  const auto u = Uuid::parse(a.gpu_uuid);
  REQUIRE(u);
  CHECK(u->to_string() == a.gpu_uuid);
  alloc::Allocation no_prefix = a;  // the file always spells the "GPU-" form
  no_prefix.gpu_uuid = a.gpu_uuid.substr(4);
  CHECK_THROWS_WITH(alloc::parse_allocation(alloc::format_allocation(no_prefix), "f"), Catch::Contains("bad gpu_uuid"));
}

TEST_CASE("allocation: tenant names of allocations", "[contracts][allocation]") {
  CHECK(alloc::tenant_name("0123456789abcdef", std::nullopt) == "alloc:0123456789abcdef");
  const alloc::Owner o{"research", "train-0", "worker"};
  CHECK(alloc::tenant_name("0123456789abcdef", o) == "pod:research/train-0/worker");
  CHECK(alloc::owner_from_tenant_name("pod:research/train-0/worker") == o);
  const alloc::Owner longer{"ns", std::string(200, 'p'), "c"};
  const std::string n = alloc::tenant_name("0123456789abcdef", longer);
  CHECK(n.size() <= alloc::kMaxTenantName);
  CHECK(n.rfind("pod:ns/ppp", 0) == 0);
  const alloc::Owner longer2{"ns", std::string(199, 'p') + "q", "c"};
  CHECK(alloc::tenant_name("0123456789abcdef", longer2) != n);
}
