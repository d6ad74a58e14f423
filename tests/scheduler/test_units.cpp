// Pure parts: options, the allocation file format, tenant names, the attribution rule.
#include <catch2/catch.hpp>

#include "vlake/allocation/allocation.hpp"
#include "vlake/scheduler/attribution.hpp"
#include "vlake/scheduler/options.hpp"

using namespace vlake;
using namespace vlake::scheduler;

TEST_CASE("options: defaults and parsing", "[scheduler]") {
  const char* none[] = {"p"};
  const PluginOptions d = PluginOptions::parse(1, none);
  CHECK(d.resource == "vlake.io/gpu-memory");
  CHECK(d.unit.value() == (1ull << 30));
  CHECK(d.kubelet_socket() == "/var/lib/kubelet/device-plugins/kubelet.sock");
  CHECK(d.gpu_visibility == GpuVisibility::both);
  CHECK(d.preload);
  const char* argv[] = {"p", "--unit", "512MiB", "--gpu-visibility=cdi", "--preload", "false",
                        "--attribution-interval", "500ms", "--vlaked-socket", "none"};
  const PluginOptions o = PluginOptions::parse(10, argv);
  CHECK(o.unit.value() == (512ull << 20));
  CHECK(o.gpu_visibility == GpuVisibility::cdi);
  CHECK_FALSE(o.preload);
  CHECK(o.attribution_interval.count() == 500);
  CHECK(o.vlaked_socket.empty());
  const char* bad[] = {"p", "--unit", "1GB"};
  CHECK_THROWS_WITH(PluginOptions::parse(3, bad), Catch::Contains("unknown unit 'GB'"));
  const char* bad2[] = {"p", "--gpu-visibility", "all"};
  CHECK_THROWS_AS(PluginOptions::parse(3, bad2), OptionsError);
}

TEST_CASE("allocation and owner files round-trip and bad ones are rejected", "[scheduler]") {
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
  const auto u = alloc::parse_uuid(a.gpu_uuid);
  REQUIRE(u);
  std::uint8_t raw[16];
  std::copy(u->begin(), u->end(), raw);
  CHECK(alloc::format_uuid(raw) == a.gpu_uuid);
}

TEST_CASE("tenant names of allocations", "[scheduler]") {
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

TEST_CASE("attribution rule - exact id sets and owners kept and newest unowned first", "[scheduler]") {
  const alloc::Owner w{"ns", "a", "w"};
  const alloc::Owner x{"ns", "b", "x"};
  std::vector<AllocView> allocs{
      {"old", {"g::0", "g::1"}, 100, w},       // owned by w
      {"new", {"g::0", "g::1"}, 200, std::nullopt},
      {"newer", {"g::0", "g::1"}, 300, std::nullopt},
      {"lone", {"g::3"}, 50, std::nullopt}};
  // Container x (a new pod) now holds the same ids; w is gone.
  auto r = attribute(allocs, {{x, {"g::1", "g::0"}}});
  CHECK(r.present.count("old") == 0);
  REQUIRE(r.new_owner.count("newer") == 1);
  CHECK(r.new_owner.at("newer") == x);
  CHECK(r.new_owner.count("new") == 0);
  CHECK(r.present.count("lone") == 0);
  // w still listed: "old" is present; a subset of ids does not hold an allocation.
  r = attribute(allocs, {{w, {"g::0", "g::1"}}, {x, {"g::3", "g::4"}}});
  CHECK(r.present.count("old") == 1);
  CHECK(r.new_owner.count("lone") == 0);
  CHECK(r.new_owner.count("newer") == 0);  // w owns an allocation of these ids already
}
