// Pure parts: options, the attribution rule. (The allocation-directory format is a contract:
// tests/contracts/test_allocation.cpp.)
#include <catch2/catch.hpp>

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
  CHECK(d.hook_container_path == "/usr/lib/vlake/libvlake-hook.so");
  const char* argv[] = {
      "p",     "--unit",          "512MiB", "--gpu-visibility=cdi", "--preload", "false", "--attribution-interval",
      "500ms", "--vlaked-socket", "none"};
  const PluginOptions o = PluginOptions::parse(10, argv);
  CHECK(o.unit.value() == (512ull << 20));
  CHECK(o.gpu_visibility == GpuVisibility::cdi);
  CHECK_FALSE(o.preload);
  CHECK(o.attribution_interval.count() == 500);
  CHECK(o.vlaked_socket.empty());
  const char* bad[] = {"p", "--unit", "1GB"};
  CHECK_THROWS_WITH(PluginOptions::parse(3, bad),
                    "--unit: \"1GB\": decimal units are ambiguous; write 1GiB (1073741824 bytes)");
  const char* bad2[] = {"p", "--gpu-visibility", "all"};
  CHECK_THROWS_AS(PluginOptions::parse(3, bad2), OptionsError);
  const char* hook[] = {"p", "--hook-path", "/var/lib/vlake/lib/libvlake-hook.so", "--hook-container-path=/opt/h.so"};
  const PluginOptions h = PluginOptions::parse(4, hook);
  CHECK(h.hook_path == "/var/lib/vlake/lib/libvlake-hook.so");
  CHECK(h.hook_container_path == "/opt/h.so");
  const char* relative[] = {"p", "--hook-container-path", "lib/h.so"};
  CHECK_THROWS_WITH(PluginOptions::parse(3, relative), "--hook-container-path must be absolute, got 'lib/h.so'");
}

TEST_CASE("options: sizes and durations need units", "[scheduler]") {
  auto parse = [](const char* flag, const char* value) {
    const char* argv[] = {"p", flag, value};
    return PluginOptions::parse(3, argv);
  };
  CHECK(parse("--unit", "8GiB").unit.value() == (8ull << 30));
  CHECK(parse("--gc-grace", "30s").gc_grace.count() == 30'000);
  CHECK(parse("--health-interval", "2.5s").health_interval.count() == 2500);
  CHECK(parse("--attribution-interval", "1m").attribution_interval.count() == 60'000);
  CHECK_THROWS_WITH(parse("--unit", "8"), "--unit: \"8\": a size needs a unit; write 8B, 8KiB, 8MiB or 8GiB");
  CHECK_THROWS_WITH(parse("--gc-grace", "30"), "--gc-grace: \"30\": a duration needs a unit; write 30s or 30ms");
  CHECK_THROWS_WITH(parse("--health-interval", "0"), "--health-interval: \"0\": must be greater than zero");
  CHECK_THROWS_WITH(parse("--gc-grace", "25h"), "--gc-grace: \"25h\": must be at most 24h");
  CHECK_THROWS_AS(parse("--gc-grace", "30"), OptionsError);
}

TEST_CASE("attribution rule - exact id sets and owners kept and newest unowned first", "[scheduler]") {
  const alloc::Owner w{"ns", "a", "w"};
  const alloc::Owner x{"ns", "b", "x"};
  std::vector<AllocView> allocs{{"old", {"g::0", "g::1"}, 100, w},  // owned by w
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
