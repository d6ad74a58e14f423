// vlaked with the full quota model, against the simulator: namespace guarantees protect memory
// from other namespaces; the quota file is hot-reloaded (rename-over, in-place edit, a
// ConfigMap's `..data` symlink swap, SIGHUP), lowered limits refuse further grants without
// revoking anything, and an invalid file is rejected, logged and counted while the old
// configuration stays in force.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "harness.hpp"
#include "tenant_figures.hpp"
#include "units.hpp"

using namespace vlake;
using namespace vlake::pooltest;
namespace st = vlake::state;

using namespace vlake::testunits;  // kMiB, kGiB, MiB (units.hpp)

namespace {

constexpr int kOk = 0;
constexpr int kOverLimit = 1;           // proto::Status::over_limit (the tenant's limit)
constexpr int kNamespaceOverLimit = 8;  // proto::Status::namespace_over_limit
constexpr int kGuarantee = 9;           // proto::Status::guarantee

const st::NamespaceRecord* ns_record(const st::State& s, const std::string& name) {
  for (const auto& n : s.namespaces) {
    if (n.in_use != 0 && name == n.name) return &n;
  }
  return nullptr;
}

// Replaces `path` atomically (write a sibling, rename over it), as editors and tools do.
void write_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp-new";
  {
    std::ofstream out(tmp);
    out << text;
  }
  REQUIRE(::rename(tmp.c_str(), path.c_str()) == 0);
}

int grant(Helper& h, std::uint64_t bytes, std::uint64_t* id = nullptr, const char* purpose = "alloc") {
  const auto kv = h.ok("grant " + std::to_string(bytes) + " " + purpose);
  if (id != nullptr) *id = num(kv, "id");
  return static_cast<int>(num(kv, "status"));
}

std::string team_config(const std::string& user_limit, const std::string& team_limit) {
  return "version: 1\n"
         "default:\n"
         "  limit: 16MiB\n"
         "namespaces:\n"
         "  - name: team\n"
         "    limit: " +
         team_limit +
         "\n"
         "    priority: 5\n"
         "    users: [4242, 4243]\n"
         "users:\n"
         "  - uid: 4242\n"
         "    limit: " +
         user_limit +
         "\n"
         "    namespace: team\n";
}

}  // namespace

TEST_CASE("daemon quota: a namespace guarantee protects its memory from other namespaces", "[daemon][quota]") {
  DaemonProcess d("guarantee", R"(version: 1
namespaces:
  - name: research
    guaranteed: 768MiB
    priority: 10
    users: [4242]
  - name: batch
    users: [4243]
)");
  REQUIRE(d.start());
  Helper research(d.node, 4242, 0);
  Helper batch(d.node, 4243, 0);
  CHECK(research.ok("connect " + d.socket).at("name") == "research/user:4242");
  const auto bkv = batch.ok("connect " + d.socket);
  CHECK(bkv.at("name") == "batch/user:4243");
  CHECK(num(bkv, "limit") == 1024 * kMiB);  // no limit of its own: the whole GPU

  // batch may borrow the unguaranteed 256 MiB, not a byte of research's 768 MiB.
  std::uint64_t b1 = 0;
  CHECK(grant(batch, 250 * kMiB, &b1, "counted") == kOk);
  CHECK(grant(batch, 6 * kMiB) == kOk);  // 256 MiB: all of the unguaranteed memory
  CHECK(grant(batch, 2 * kMiB) == kGuarantee);
  auto s = snapshot(d.state);
  CHECK(s->counters.denials_guarantee == 1);
  CHECK(s->counters.denials_over_limit == 1);
  CHECK(s->counters.denials_tenant_limit == 0);
  CHECK(s->counters.denials_namespace_limit == 0);
  CHECK_THAT(d.log(), Catch::Contains("tenant batch/user:4243: 2097152 bytes on GPU 0 refused (guarantee"));

  // research gets its guarantee although the other namespace holds memory.
  CHECK(grant(research, 700 * kMiB, nullptr, "counted") == kOk);
  CHECK(grant(research, 68 * kMiB) == kOk);
  // Above its guarantee research would borrow too: nothing unguaranteed is left.
  CHECK(grant(research, 2 * kMiB) == kGuarantee);

  s = snapshot(d.state);
  CHECK(s->counters.denials_guarantee == 2);
  CHECK(s->config.generation == 1);
  CHECK(s->config.namespace_count == 3);  // research, batch, the implicit default
  const st::NamespaceRecord* r = ns_record(*s, "research");
  const st::NamespaceRecord* b = ns_record(*s, "batch");
  const st::NamespaceRecord* def = ns_record(*s, "default");
  REQUIRE(r != nullptr);
  REQUIRE(b != nullptr);
  REQUIRE(def != nullptr);
  CHECK(r->guaranteed[0] == 768 * kMiB);
  CHECK(r->limit[0] == 1024 * kMiB);
  CHECK(r->used[0] == 768 * kMiB);
  CHECK(r->priority == 10);
  CHECK(r->tenant_count == 1);
  CHECK(r->flags == 0);
  CHECK(b->used[0] == 256 * kMiB);
  CHECK(b->guaranteed[0] == 0);
  CHECK((def->flags & st::kNamespaceImplicit) != 0);
  CHECK(s->devices[0].guaranteed_bytes == 768 * kMiB);
  CHECK(s->devices[0].borrowed_bytes == 256 * kMiB);
  const st::TenantRecord* rt = tenant(*s, "research/user:4242");
  REQUIRE(rt != nullptr);
  CHECK(rt->namespace_id == r->id);
  CHECK(rt->over_limit == 0);

  // batch gives memory back: now research may borrow it.
  CHECK(num(batch.ok("release " + std::to_string(b1)), "status") == kOk);
  CHECK(grant(research, 2 * kMiB) == kOk);
}

TEST_CASE("daemon quota: hot reload by rename and in-place edit, lowered limits, invalid files, SIGHUP",
          "[daemon][quota]") {
  DaemonProcess d("reload", team_config("64MiB", "96MiB"));
  REQUIRE(d.start());
  Helper a(d.node, 4242, 0);
  Helper b(d.node, 4243, 0);
  const auto akv = a.ok("connect " + d.socket);
  CHECK(akv.at("name") == "team/user:4242");
  CHECK(num(akv, "limit") == 64 * kMiB);
  CHECK(num(b.ok("connect " + d.socket), "limit") == 96 * kMiB);  // no entry: the namespace's limit
  std::uint64_t a1 = 0;
  REQUIRE(grant(a, 48 * kMiB, &a1) == kOk);
  REQUIRE(grant(b, 40 * kMiB) == kOk);
  auto s = snapshot(d.state);
  CHECK(std::string(s->config.path) == d.config);
  CHECK(s->config.from_file == 1);
  CHECK(s->config.generation == 1);
  CHECK(ns_record(*s, "team")->used[0] == 88 * kMiB);

  // Lower both limits below current usage: applied within ~2 s, nothing revoked.
  write_atomically(d.config, team_config("32MiB", "64MiB"));
  REQUIRE(
      eventually([&] { return tenant_gpu0(d.state, "team/user:4242", &st::TenantRecord::limit) == 32 * kMiB; }, 2000));
  s = snapshot(d.state);
  CHECK(s->config.generation == 2);
  CHECK(s->counters.config_reloads == 1);
  CHECK(s->counters.config_reload_errors == 0);
  const st::TenantRecord* ta = tenant(*s, "team/user:4242");
  REQUIRE(ta != nullptr);
  CHECK(ta->granted[0] == 48 * kMiB);  // no revocation
  CHECK(ta->over_limit == 1u);         // bit 0: GPU 0
  const st::NamespaceRecord* team = ns_record(*s, "team");
  REQUIRE(team != nullptr);
  CHECK(team->limit[0] == 64 * kMiB);
  CHECK(team->used[0] == 88 * kMiB);
  CHECK(team->over_limit == 1u);
  CHECK(team->priority == 5);
  CHECK((team->flags & st::kNamespaceHasLimit) != 0);
  CHECK_THAT(d.log(), Catch::Contains("config reloaded (file changed)"));
  // Further grants are refused (tenant limit for a, namespace limit for b) until usage drops.
  CHECK(grant(a, 2 * kMiB) == kOverLimit);
  CHECK(grant(b, 2 * kMiB) == kNamespaceOverLimit);
  s = snapshot(d.state);
  CHECK(s->counters.denials_tenant_limit == 1);
  CHECK(s->counters.denials_namespace_limit == 1);
  CHECK(num(a.ok("usage"), "limit") == 32 * kMiB);
  CHECK(num(a.ok("release " + std::to_string(a1)), "status") == kOk);
  REQUIRE(grant(a, 16 * kMiB) == kOk);  // 16 <= 32; team 56 <= 64
  s = snapshot(d.state);
  CHECK(tenant(*s, "team/user:4242")->over_limit == 0);
  CHECK(ns_record(*s, "team")->over_limit == 0);

  // An invalid edit in place: rejected, logged, counted; the old limits stay in force.
  {
    std::ofstream out(d.config, std::ios::trunc);
    out << "version: 1\ndefault:\n  limit: 8GB\n";
  }
  REQUIRE(eventually(
      [&] {
        const auto x = snapshot(d.state);
        return std::string(x->config.last_error).find("8GB") != std::string::npos;
      },
      2000));
  s = snapshot(d.state);
  CHECK(std::string(s->config.last_error) ==
        d.config + ":3:10: bad limit \"8GB\": decimal units are ambiguous; write 8GiB (8589934592 bytes)");
  CHECK(s->counters.config_reload_errors >= 1);
  CHECK(s->config.rejected == 1);
  CHECK(s->config.error_unix_ns != 0);
  CHECK(s->config.generation == 2);
  CHECK_THAT(d.log(), Catch::Contains("quota file rejected (file changed): " + d.config + ":3:10: bad limit \"8GB\""));
  CHECK(tenant(*s, "team/user:4242")->limit[0] == 32 * kMiB);
  CHECK(grant(a, 18 * kMiB) == kOverLimit);  // 16 + 18 > 32: still the old limit
  CHECK(grant(a, 8 * kMiB) == kOk);          // 24 <= 32, team 64 <= 64

  // SIGHUP re-reads even an unchanged file: the same invalid file is rejected once more.
  const std::uint64_t errors = s->counters.config_reload_errors;
  d.signal(SIGHUP);
  REQUIRE(eventually([&] { return snapshot(d.state)->counters.config_reload_errors == errors + 1; }, 2000));
  CHECK(snapshot(d.state)->config.generation == 2);

  // A valid file again (rename-over), then SIGHUP applies it once more.
  write_atomically(d.config, team_config("40MiB", "64MiB"));
  REQUIRE(eventually([&] { return snapshot(d.state)->config.generation == 3; }, 2000));
  s = snapshot(d.state);
  CHECK(s->config.rejected == 0);
  CHECK(tenant(*s, "team/user:4242")->limit[0] == 40 * kMiB);
  d.signal(SIGHUP);
  REQUIRE(eventually([&] { return snapshot(d.state)->config.generation == 4; }, 2000));
  CHECK_THAT(d.log(), Catch::Contains("config reloaded (SIGHUP)"));
  CHECK(snapshot(d.state)->counters.config_reloads == 3);
}

TEST_CASE("daemon quota: a ConfigMap symlink swap is noticed at once, tenants move between namespaces",
          "[daemon][quota]") {
  DaemonProcess d("configmap");
  // The layout the kubelet gives a mounted ConfigMap.
  const std::string cm = d.dir + "/cm";
  REQUIRE(::mkdir(cm.c_str(), 0755) == 0);
  REQUIRE(::mkdir((cm + "/..2024_01_01").c_str(), 0755) == 0);
  std::ofstream(cm + "/..2024_01_01/vlake.yaml") << team_config("64MiB", "96MiB");
  REQUIRE(::symlink("..2024_01_01", (cm + "/..data").c_str()) == 0);
  REQUIRE(::symlink("..data/vlake.yaml", (cm + "/vlake.yaml").c_str()) == 0);
  d.config = cm + "/vlake.yaml";
  // The periodic check every 5 s would be too late for the deadlines below: inotify must see it.
  REQUIRE(d.start({"--sample-interval-ms", "5000"}));

  auto swap = [&](const std::string& version, const std::string& text) {
    REQUIRE(::mkdir((cm + "/" + version).c_str(), 0755) == 0);
    std::ofstream(cm + "/" + version + "/vlake.yaml") << text;
    REQUIRE(::symlink(version.c_str(), (cm + "/..data_tmp").c_str()) == 0);
    REQUIRE(::rename((cm + "/..data_tmp").c_str(), (cm + "/..data").c_str()) == 0);
  };

  Helper a(d.node, 4242, 0);
  CHECK(a.ok("connect " + d.socket).at("name") == "team/user:4242");
  std::uint64_t a1 = 0;
  REQUIRE(grant(a, 48 * kMiB, &a1) == kOk);

  swap("..2024_01_02", team_config("32MiB", "96MiB"));
  REQUIRE(eventually([&] { return tenant(*snapshot(d.state), "team/user:4242")->limit[0] == 32 * kMiB; }, 2000));
  CHECK(grant(a, 2 * kMiB) == kOverLimit);
  CHECK(snapshot(d.state)->counters.config_reloads == 1);

  // Next version: namespace "team" is gone, 4242 is in "ml". Its session moves, grants and all.
  swap("..2024_01_03", "version: 1\nnamespaces:\n  - name: ml\n    limit: 80MiB\n    users: [4242]\n");
  REQUIRE(eventually([&] { return ns_record(*snapshot(d.state), "ml") != nullptr; }, 2000));
  const auto s = snapshot(d.state);
  CHECK(ns_record(*s, "team") == nullptr);
  const st::NamespaceRecord* ml = ns_record(*s, "ml");
  const st::TenantRecord* moved = tenant(*s, "ml/user:4242");
  REQUIRE(moved != nullptr);
  CHECK(moved->granted[0] == 48 * kMiB);
  CHECK(moved->limit[0] == 80 * kMiB);
  CHECK(moved->namespace_id == ml->id);
  CHECK(ml->used[0] == 48 * kMiB);
  CHECK(tenant(*s, "team/user:4242")->granted[0] == 0);
  CHECK(s->config.generation == 3);
  CHECK(s->config.namespace_count == 2);
  CHECK(num(a.ok("usage"), "limit") == 80 * kMiB);
  CHECK(grant(a, 32 * kMiB) == kOk);
  CHECK(grant(a, 2 * kMiB) == kOverLimit);  // 82 > 80
  // The moved grant is released from its new tenant.
  CHECK(num(a.ok("release " + std::to_string(a1)), "status") == kOk);
  CHECK(tenant(*snapshot(d.state), "ml/user:4242")->granted[0] == 32 * kMiB);
}

TEST_CASE("daemon quota: guarantees larger than the GPU stop start-up with a positioned error", "[daemon][quota]") {
  DaemonProcess d("bigguarantee",
                  "version: 1\nnamespaces:\n  - name: a\n    guaranteed: 600MiB\n  - name: b\n"
                  "    guaranteed: 600MiB\n");
  CHECK_FALSE(d.start());
  CHECK_THAT(d.log(), Catch::Contains("bad quota file: " + d.config +
                                      ":6:17: guarantees add up to 1200MiB, more than the GPU's 1GiB"));
}
