// The exporter's Collectable over a synthetic State (no daemon), the text format it produces,
// health, listen addresses, and the HTTP server in-process with a fake snapshot source
// (loopback addresses reachable on loopback only).
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <set>
#include <sstream>
#include <stdexcept>

#include <prometheus/text_serializer.h>

#include "harness.hpp"
#include "http_get.hpp"
#include "units.hpp"
#include "vlake/exporter/collector.hpp"
#include "vlake/exporter/server.hpp"

using namespace vlake;
namespace st = vlake::state;
using exptest::Exposition;
using exptest::http_get;
using exptest::parse_prometheus;
using prometheus::MetricFamily;
using prometheus::MetricType;

using namespace vlake::testunits;  // kMiB, kGiB, MiB (units.hpp)

namespace {

constexpr std::uint64_t kNow = 1'700'000'000'000'000'000ULL;
const char* const kGpu0 = "GPU-00112233-4455-6677-8899-aabbccddeeff";
const exporter::BuildInfo kBuild{"1.2.3", "abc123"};

void name(char* dst, std::size_t n, const std::string& s) {
  std::memset(dst, 0, n);
  std::memcpy(dst, s.data(), std::min(s.size(), n - 1));
}

// Two GPUs, namespaces "default" (implicit) and "research", three tenants, sessions, counters.
std::unique_ptr<st::State> synthetic() {
  auto s = std::make_unique<st::State>();
  std::memset(static_cast<void*>(s.get()), 0, sizeof(st::State));
  st::Header& h = s->header;
  h.magic = st::kMagic;
  h.layout_version = st::kLayoutVersion;
  h.daemon_pid = 1234;
  h.starts = 2;
  h.device_count = 2;
  h.sample_interval_ms = 1000;
  h.updated_unix_ns = kNow - 500'000'000ULL;  // 0.5 s old
  for (std::uint32_t d = 0; d < 2; ++d) {
    st::DeviceRecord& r = s->devices[d];
    r.in_use = 1;
    r.ordinal = d;
    for (std::uint8_t i = 0; i < 16; ++i) r.uuid[i] = static_cast<std::uint8_t>(i * 0x11 + d);
    r.total = 80 * kGiB;
    r.granularity = 2 * kMiB;
  }
  st::DeviceRecord& g0 = s->devices[0];
  g0.nvml_used_bytes = 90 * kMiB;
  g0.unlisted_bytes = 12 * kMiB;
  g0.daemon_nvml_bytes = 74 * kMiB;  // its pool handles it holds and its context
  g0.daemon_context_bytes = 10 * kMiB;
  g0.unhooked_bytes = 3 * kMiB;
  g0.retained_bytes = 6 * kMiB;
  g0.held_fd_bytes = 2 * kMiB;
  g0.pool_bytes = 100 * kMiB;
  g0.free_bytes = 40 * kMiB;
  g0.idle_released_bytes = 256 * kMiB;
  g0.free_handles = 3;
  g0.largest_free_handle = 10 * kMiB;
  // Stitched, the free pool serves 30 of its 40 MiB in one grant: fragmentation 1 - 30/40 =
  // 0.25 (not 1 - 10/40: the largest handle does not limit a grant). A tenant with no bound
  // handle gets 20 MiB.
  g0.largest_servable_bytes = 30 * kMiB;
  g0.largest_servable_unbound_bytes = 20 * kMiB;
  g0.granted_bytes = 60 * kMiB;
  g0.orphaned_bytes = 4 * kMiB;
  g0.guaranteed_bytes = 8 * kGiB;
  g0.borrowed_bytes = 2 * kMiB;
  g0.dedup_logical_bytes = 7;
  g0.dedup_physical_bytes = 5;
  st::DeviceRecord& g1 = s->devices[1];
  g1.free_bytes = 0;  // empty pool: fragmentation 0
  g1.largest_free_handle = 0;

  st::NamespaceRecord& nd = s->namespaces[0];
  nd.in_use = 1;
  nd.id = 1;
  name(nd.name, sizeof nd.name, "default");
  nd.flags = st::kNamespaceImplicit;
  st::NamespaceRecord& nr = s->namespaces[1];
  nr.in_use = 1;
  nr.id = 2;
  name(nr.name, sizeof nr.name, "research");
  nr.flags = st::kNamespaceHasLimit;
  for (int d = 0; d < 2; ++d) {
    nd.limit[d] = 80 * kGiB;
    nr.limit[d] = 16 * kGiB;
  }
  nr.guaranteed[0] = 8 * kGiB;
  nr.used[0] = 50 * kMiB;
  nd.used[0] = 10 * kMiB;
  nr.over_limit = 2;  // GPU 1

  st::TenantRecord& a = s->tenants[0];
  a.in_use = 1;
  a.id = 1;
  name(a.name, sizeof a.name, "research/user:alice");
  a.namespace_id = 2;
  a.limit[0] = 1 * kGiB;
  a.limit[1] = 2 * kGiB;
  a.granted[0] = 48 * kMiB;
  a.nonpool[0] = 2 * kMiB;
  a.over_limit = 1;  // GPU 0
  a.enforce = 1;     // refuse: memory outside vlake counts
  a.unhooked[0] = 3 * kMiB;
  a.unhooked_processes = 1;
  a.retained[0] = 6 * kMiB;
  a.over_reason[0] = st::kOverContexts;
  a.ipc_held[0] = 4 * kMiB;
  a.ipc_imported[1] = 8 * kMiB;
  a.kernel_faults[st::kFaultMapsShared] = 3;
  st::TenantRecord& b = s->tenants[3];
  b.in_use = 1;
  b.id = 4;
  name(b.name, sizeof b.name, "uid:1000");
  b.namespace_id = 1;
  b.limit[0] = b.limit[1] = 80 * kGiB;
  b.granted[0] = 10 * kMiB;
  b.granted[1] = 6 * kMiB;
  b.enforce = 0;  // account: shown, not counted
  b.unhooked[1] = 5 * kMiB;
  b.unhooked_processes = 2;
  st::TenantRecord& c = s->tenants[5];  // namespace id unknown: "default"
  c.in_use = 1;
  c.id = 6;
  name(c.name, sizeof c.name, "uid:2000");
  c.namespace_id = 99;

  // Fields by name: the record grows at its end with new layouts (the rest stays 0; start
  // time and uid 0 here).
  auto session = [](std::uint64_t id, std::uint32_t pid, std::uint32_t tenant, std::uint32_t state,
                    std::uint32_t grants) { return pooltest::session_record(id, 0, pid, 0, tenant, state, grants); };
  s->sessions[0] = session(1, 100, 1, st::kSessionConnected, 1);
  s->sessions[1] = session(2, 101, 1, st::kSessionDetached, 0);
  s->sessions[7] = session(3, 102, 4, st::kSessionConnected, 2);
  // Layout 9: activity, a process on the host, one waiting for memory, refusals.
  s->sessions[0].last_active_unix_ns = kNow - 30'000'000'000ULL;
  s->sessions[7].last_active_unix_ns = kNow - 2'000'000'000ULL;
  s->sessions[1].swap = st::kSwapHost;
  s->sessions[1].swap_device = 0;
  s->sessions[1].swap_bytes = 3 * kGiB;
  s->sessions[7].wait = st::kWaitMemory;
  s->devices[0].swapped_bytes = 3 * kGiB;

  st::Counters& k = s->counters;
  k.grants = 11;
  k.denials_tenant_limit = 1;
  k.denials_unhooked = 4;
  k.unhooked_kills = 1;
  k.passthrough_refused = 2;
  k.denials_namespace_limit = 2;
  k.denials_guarantee = 3;
  k.denials_out_of_memory = 4;
  k.denials_unknown_device = 5;
  k.denials_other = 6;
  k.denials_over_limit = 6;
  k.releases = 7;
  k.process_exits = 8;
  k.scrubs = 9;
  k.reuses = 10;
  k.handles_created = 12;
  k.handles_released = 13;
  k.malformed = 14;
  k.config_reloads = 15;
  k.config_reload_errors = 16;
  k.guard_violations_canary = 17;
  k.denials_grant_cap = 18;
  k.denials_session_cap = 19;
  k.denials_tenant_table = 20;
  k.denials_connection_cap = 21;
  k.denials_unauthenticated = 22;
  k.guard_events_rejected = 23;
  k.guard_events_limited = 24;
  k.log_suppressed = 25;
  k.tenants_freed = 26;
  k.ipc_exports = 27;
  k.ipc_opens = 28;
  k.ipc_refused = 29;
  k.guard_violations_readonly_write = 30;
  k.kernel_faults[0] = 31;
  k.kernel_faults[st::kFaultGuarded | st::kFaultMapsShared] = 32;
  k.guard_violations_fault = 99;  // no longer exported (older daemons' count)
  // 3 grants <= 50us, 2 in (100us, 250us], 1 in (0.25 s, 1 s], 1 above 1 s.
  k.grant_latency_bucket[0] = 3;
  k.grant_latency_bucket[2] = 2;
  k.grant_latency_bucket[12] = 1;
  k.grant_latency_count = 7;
  k.grant_latency_sum_ns = 2'500'000'000ULL;
  k.grant_latency_max_ns = 1'750'000'000ULL;
  s->config.rejected = 1;
  return s;
}

Exposition scrape_text(const st::State& s, std::uint64_t now = kNow, exporter::Exposure exposure = {}) {
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, exporter::build_families(s, now, kBuild, exposure));
  return parse_prometheus(out.str());
}

const MetricFamily& family(const std::vector<MetricFamily>& fs, const std::string& n) {
  for (const auto& f : fs) {
    if (f.name == n) return f;
  }
  FAIL("no family " << n);
  throw std::logic_error("unreachable");
}

std::set<std::string> label_names(const prometheus::ClientMetric& m) {
  std::set<std::string> out;
  for (const auto& l : m.label) out.insert(l.name);
  return out;
}

}  // namespace

TEST_CASE("collector: every family of docs/metrics.md, with its type and label names", "[unit]") {
  const auto s = synthetic();
  exporter::Exposure all;
  all.process_series = true;
  const auto fs = exporter::build_families(*s, kNow, kBuild, all);
  using T = MetricType;
  const std::set<std::string> none;
  const std::set<std::string> gpu{"gpu", "gpu_index"};
  // Never namespace/pod/container: Prometheus sets those on the target (docs/metrics.md, "Labels").
  const std::set<std::string> tenant{"gpu",        "gpu_index",       "tenant", "tenant_namespace",
                                     "tenant_pod", "tenant_container"};
  const std::set<std::string> tenant_only{"tenant", "tenant_namespace", "tenant_pod", "tenant_container"};
  const std::set<std::string> ns{"gpu", "gpu_index", "tenant_namespace"};
  const std::set<std::string> tenant_reason{"tenant", "tenant_namespace", "tenant_pod", "tenant_container", "reason"};
  const std::set<std::string> tenant_fault_labels{"tenant",           "tenant_namespace", "tenant_pod",
                                                  "tenant_container", "guarded",          "maps_shared"};
  struct Want {
    const char* name;
    T type;
    std::set<std::string> labels;
  };
  const std::vector<Want> want = {
      {"vlake_build_info", T::Gauge, {"version", "revision"}},
      {"vlake_daemon_up", T::Gauge, none},
      {"vlake_daemon_starts", T::Gauge, none},
      {"vlake_state_age_seconds", T::Gauge, none},
      {"vlake_gpu_memory_total_bytes", T::Gauge, gpu},
      {"vlake_pool_reserved_bytes", T::Gauge, gpu},
      {"vlake_pool_free_bytes", T::Gauge, gpu},
      {"vlake_pool_granted_bytes", T::Gauge, gpu},
      {"vlake_pool_orphaned_bytes", T::Gauge, gpu},
      {"vlake_pool_free_handles", T::Gauge, gpu},
      {"vlake_pool_fragmentation_ratio", T::Gauge, gpu},
      {"vlake_pool_largest_servable_bytes", T::Gauge, gpu},
      {"vlake_pool_largest_servable_new_tenant_bytes", T::Gauge, gpu},
      {"vlake_pool_guaranteed_bytes", T::Gauge, gpu},
      {"vlake_pool_borrowed_bytes", T::Gauge, gpu},
      {"vlake_pool_peak_bytes", T::Gauge, gpu},
      {"vlake_gpu_nvml_used_bytes", T::Gauge, gpu},
      {"vlake_gpu_unlisted_bytes", T::Gauge, gpu},
      {"vlake_gpu_unhooked_bytes", T::Gauge, gpu},
      {"vlake_gpu_retained_bytes", T::Gauge, gpu},
      {"vlake_gpu_held_descriptor_bytes", T::Gauge, gpu},
      {"vlake_pool_free_handles_by_class", T::Gauge, {"gpu", "gpu_index", "class"}},
      {"vlake_pool_warm_target_bytes", T::Gauge, gpu},
      {"vlake_pool_idle_released_bytes_total", T::Counter, gpu},
      {"vlake_hook_reserve_bytes", T::Gauge, gpu},
      {"vlake_tenant_used_bytes", T::Gauge, tenant},
      {"vlake_tenant_granted_bytes", T::Gauge, tenant},
      {"vlake_tenant_nonpool_bytes", T::Gauge, tenant},
      {"vlake_tenant_unhooked_bytes", T::Gauge, tenant},
      {"vlake_tenant_retained_bytes", T::Gauge, tenant},
      {"vlake_tenant_unhooked_processes", T::Gauge, tenant_only},
      {"vlake_tenant_limit_bytes", T::Gauge, tenant},
      {"vlake_tenant_over_limit", T::Gauge, tenant},
      {"vlake_tenant_sessions", T::Gauge, tenant_only},
      {"vlake_tenant_reserve_bytes", T::Gauge, tenant},
      {"vlake_namespace_used_bytes", T::Gauge, ns},
      {"vlake_namespace_limit_bytes", T::Gauge, ns},
      {"vlake_namespace_guaranteed_bytes", T::Gauge, ns},
      {"vlake_namespace_over_limit", T::Gauge, ns},
      {"vlake_tenants", T::Gauge, none},
      {"vlake_sessions", T::Gauge, {"state"}},
      {"vlake_grants_total", T::Counter, none},
      {"vlake_grant_denials_total", T::Counter, {"reason"}},
      {"vlake_grant_denials_unhooked_total", T::Counter, none},
      {"vlake_unhooked_kills_total", T::Counter, none},
      {"vlake_passthrough_refused_total", T::Counter, none},
      {"vlake_releases_total", T::Counter, none},
      {"vlake_process_exits_total", T::Counter, none},
      {"vlake_scrubs_total", T::Counter, none},
      {"vlake_pool_reuses_total", T::Counter, none},
      {"vlake_pool_handles_created_total", T::Counter, none},
      {"vlake_pool_handles_released_total", T::Counter, none},
      {"vlake_malformed_messages_total", T::Counter, none},
      {"vlake_requests_total", T::Counter, none},
      {"vlake_usage_queries_total", T::Counter, none},
      {"vlake_pool_grants_total", T::Counter, {"path"}},
      {"vlake_pool_stitched_handles_total", T::Counter, none},
      {"vlake_pool_stitched_cross_tenant_total", T::Counter, none},
      {"vlake_pool_pressure_messages_total", T::Counter, none},
      {"vlake_pool_parked_grants_total", T::Counter, none},
      {"vlake_pool_parked_timeouts_total", T::Counter, none},
      {"vlake_reserve_reports_total", T::Counter, none},
      {"vlake_grant_duration_seconds", T::Histogram, none},
      {"vlake_grant_duration_max_seconds", T::Gauge, none},
      {"vlake_config_reloads_total", T::Counter, none},
      {"vlake_config_reload_errors_total", T::Counter, none},
      {"vlake_config_rejected", T::Gauge, none},
      {"vlake_dedup_logical_bytes", T::Gauge, gpu},
      {"vlake_dedup_physical_bytes", T::Gauge, gpu},
      {"vlake_guard_violations_total", T::Counter, {"kind"}},
      {"vlake_kernel_faults_total", T::Counter, {"guarded", "maps_shared"}},
      {"vlake_tenant_kernel_faults_total", T::Counter, tenant_fault_labels},
      {"vlake_connection_denials_total", T::Counter, {"reason"}},
      {"vlake_guard_events_dropped_total", T::Counter, {"reason"}},
      {"vlake_log_lines_suppressed_total", T::Counter, none},
      {"vlake_tenants_freed_total", T::Counter, none},
      {"vlake_ipc_exports_total", T::Counter, none},
      {"vlake_ipc_opens_total", T::Counter, none},
      {"vlake_ipc_refused_total", T::Counter, none},
      {"vlake_tenant_denials_total", T::Counter, tenant_reason},
      {"vlake_tenant_idle_seconds", T::Gauge, tenant_only},
      {"vlake_tenant_swapped_bytes", T::Gauge, tenant},
      {"vlake_tenant_waiting_processes", T::Gauge, tenant_only},
      {"vlake_process_idle_seconds", T::Gauge, {"tenant", "pid"}},
      {"vlake_tenant_ipc_held_bytes", T::Gauge, tenant},
      {"vlake_tenant_over_limit_reason",
       T::Gauge,
       {"gpu", "gpu_index", "tenant", "tenant_namespace", "tenant_pod", "tenant_container", "reason"}},
      {"vlake_tenant_ipc_imported_bytes", T::Gauge, tenant},
      {"vlake_daemon_context_bytes", T::Gauge, gpu},
      {"vlake_daemon_gpu_used_bytes", T::Gauge, gpu},
      {"vlake_waiting_processes", T::Gauge, {"for"}},
      {"vlake_swapped_bytes", T::Gauge, gpu},
      {"vlake_swap_outs_total", T::Counter, none},
      {"vlake_swap_ins_total", T::Counter, none},
      {"vlake_swap_failures_total", T::Counter, none},
      {"vlake_swap_timeouts_total", T::Counter, none},
      {"vlake_swap_out_bytes_total", T::Counter, none},
      {"vlake_swap_in_bytes_total", T::Counter, none},
      {"vlake_swap_out_seconds_total", T::Counter, none},
      {"vlake_host_tier_bytes", T::Gauge, gpu},
      {"vlake_tenant_host_bytes", T::Gauge, tenant},
      {"vlake_process_host_bytes", T::Gauge, {"tenant", "pid"}},
      {"vlake_host_tier_stock_bytes", T::Gauge, none},
      {"vlake_host_tier_bound_bytes", T::Gauge, none},
      {"vlake_host_tier_demotes_total", T::Counter, none},
      {"vlake_host_tier_promotes_total", T::Counter, none},
      {"vlake_host_tier_demoted_bytes_total", T::Counter, none},
      {"vlake_host_tier_promoted_bytes_total", T::Counter, none},
      {"vlake_host_tier_demote_seconds_total", T::Counter, none},
      {"vlake_host_tier_promote_seconds_total", T::Counter, none},
      {"vlake_host_tier_declined_total", T::Counter, none},
      {"vlake_host_tier_busy_total", T::Counter, none},
      {"vlake_swap_in_seconds_total", T::Counter, none},
  };
  CHECK(fs.size() == want.size());
  for (const Want& w : want) {
    INFO(w.name);
    const MetricFamily& f = family(fs, w.name);
    CHECK(f.type == w.type);
    CHECK(!f.help.empty());
    REQUIRE(!f.metric.empty());
    for (const auto& m : f.metric) CHECK(label_names(m) == w.labels);
  }
  // Series counts: 2 GPUs; 3 tenants x 2 GPUs; 2 namespaces x 2 GPUs.
  CHECK(family(fs, "vlake_pool_free_bytes").metric.size() == 2);
  CHECK(family(fs, "vlake_tenant_used_bytes").metric.size() == 6);
  CHECK(family(fs, "vlake_tenant_sessions").metric.size() == 3);
  CHECK(family(fs, "vlake_namespace_used_bytes").metric.size() == 4);
  CHECK(family(fs, "vlake_grant_denials_total").metric.size() == 7);
  CHECK(family(fs, "vlake_connection_denials_total").metric.size() == 4);
  CHECK(family(fs, "vlake_guard_events_dropped_total").metric.size() == 2);
  CHECK(family(fs, "vlake_guard_violations_total").metric.size() == 2);
  CHECK(family(fs, "vlake_kernel_faults_total").metric.size() == 4);
  CHECK(family(fs, "vlake_tenant_kernel_faults_total").metric.size() == 12);  // 3 tenants x 4
  CHECK(family(fs, "vlake_sessions").metric.size() == 2);
  CHECK(family(fs, "vlake_tenant_denials_total").metric.size() == 24);  // 3 tenants x 8 reasons
  CHECK(family(fs, "vlake_tenant_idle_seconds").metric.size() == 2);    // tenants with a known activity
  CHECK(family(fs, "vlake_process_idle_seconds").metric.size() == 2);
}

TEST_CASE("collector: idle, swapped, waiting and refused, per tenant and process", "[unit]") {
  auto s = synthetic();
  s->counters.swap_outs = 3;
  s->counters.swap_in_ns = 1'500'000'000ULL;
  for (st::TenantRecord& r : s->tenants) {
    if (r.id == 1) {
      r.denials[st::kRefusalTenantLimit - 1] = 5;
      r.denials[st::kRefusalRestoreTimeout - 1] = 1;
    }
  }
  exporter::Exposure all;
  all.process_series = true;
  const Exposition e = scrape_text(*s, kNow, all);
  const std::map<std::string, std::string> alice{{"tenant", "research/user:alice"}};
  CHECK(e.value("vlake_tenant_idle_seconds", alice) == Approx(30.0));  // its most recent process
  CHECK(e.value("vlake_process_idle_seconds", {{"pid", "100"}}) == Approx(30.0));
  CHECK(e.value("vlake_process_idle_seconds", {{"pid", "102"}}) == Approx(2.0));
  CHECK(e.value("vlake_tenant_swapped_bytes", {{"tenant", "research/user:alice"}, {"gpu_index", "0"}}) == 3.0 * kGiB);
  CHECK(e.value("vlake_tenant_swapped_bytes", {{"tenant", "research/user:alice"}, {"gpu_index", "1"}}) == 0);
  CHECK(e.value("vlake_swapped_bytes", {{"gpu_index", "0"}}) == 3.0 * kGiB);
  CHECK(e.value("vlake_waiting_processes", {{"for", "memory"}}) == 1);
  CHECK(e.value("vlake_waiting_processes", {{"for", "restore"}}) == 0);
  CHECK(e.value("vlake_tenant_waiting_processes", alice) == 0);
  CHECK(e.value("vlake_tenant_denials_total", {{"tenant", "research/user:alice"}, {"reason", "tenant_limit"}}) == 5);
  CHECK(e.value("vlake_tenant_denials_total", {{"tenant", "research/user:alice"}, {"reason", "restore_timeout"}}) == 1);
  CHECK(e.value("vlake_tenant_denials_total", {{"tenant", "research/user:alice"}, {"reason", "guarantee"}}) == 0);
  CHECK(e.value("vlake_swap_outs_total") == 3);
  CHECK(e.value("vlake_swap_in_seconds_total") == Approx(1.5));
}

TEST_CASE("collector: values from the state", "[unit]") {
  const auto s = synthetic();
  const Exposition e = scrape_text(*s);
  CHECK(e.value("vlake_build_info", {{"version", "1.2.3"}, {"revision", "abc123"}}) == 1);
  CHECK(e.value("vlake_daemon_up") == 1);
  CHECK(e.value("vlake_daemon_starts") == 2);
  CHECK(e.value("vlake_state_age_seconds") == Approx(0.5));
  const std::map<std::string, std::string> g0{{"gpu", kGpu0}, {"gpu_index", "0"}};
  const std::map<std::string, std::string> g1{{"gpu_index", "1"}};
  CHECK(e.value("vlake_gpu_memory_total_bytes", g0) == 80.0 * kGiB);
  CHECK(e.value("vlake_pool_reserved_bytes", g0) == 100.0 * kMiB);
  CHECK(e.value("vlake_pool_free_bytes", g0) == 40.0 * kMiB);
  CHECK(e.value("vlake_pool_idle_released_bytes_total", g0) == 256.0 * kMiB);
  CHECK(e.value("vlake_pool_granted_bytes", g0) == 60.0 * kMiB);
  CHECK(e.value("vlake_pool_orphaned_bytes", g0) == 4.0 * kMiB);
  CHECK(e.value("vlake_pool_free_handles", g0) == 3);
  CHECK(e.value("vlake_pool_fragmentation_ratio", g0) == Approx(0.25));
  CHECK(e.value("vlake_pool_fragmentation_ratio", g1) == 0);
  CHECK(e.value("vlake_pool_largest_servable_bytes", g0) == 30.0 * kMiB);
  CHECK(e.value("vlake_pool_largest_servable_new_tenant_bytes", g0) == 20.0 * kMiB);
  CHECK(e.value("vlake_pool_largest_servable_bytes", g1) == 0);
  CHECK(e.value("vlake_pool_guaranteed_bytes", g0) == 8.0 * kGiB);
  CHECK(e.value("vlake_pool_borrowed_bytes", g0) == 2.0 * kMiB);
  CHECK(e.value("vlake_dedup_logical_bytes", g0) == 7);
  CHECK(e.value("vlake_dedup_physical_bytes", g0) == 5);

  const std::map<std::string, std::string> alice0{{"tenant", "research/user:alice"},
                                                  {"tenant_namespace", "research"},
                                                  {"tenant_pod", ""},
                                                  {"tenant_container", ""},
                                                  {"gpu_index", "0"}};
  // granted 48 + retained 6 + non-pool 2 + unhooked 3 (enforce: refuse charges it): what vlaked counts.
  CHECK(e.value("vlake_tenant_used_bytes", alice0) == 59.0 * kMiB);
  CHECK(e.value("vlake_tenant_ipc_held_bytes", alice0) == 4.0 * kMiB);
  CHECK(e.value("vlake_tenant_ipc_imported_bytes", {{"tenant", "research/user:alice"}, {"gpu_index", "1"}}) ==
        8.0 * kMiB);
  CHECK(e.value("vlake_tenant_over_limit_reason", alice0) == 1);
  CHECK(e.find("vlake_tenant_over_limit_reason", {{"reason", "contexts"}}).size() == 1);
  CHECK(e.find("vlake_tenant_over_limit_reason").size() == 1);  // only tenants above a limit
  CHECK(e.value("vlake_daemon_context_bytes", g0) == 10.0 * kMiB);
  CHECK(e.value("vlake_daemon_gpu_used_bytes", g0) == 74.0 * kMiB);
  CHECK(e.value("vlake_tenant_unhooked_bytes", alice0) == 3.0 * kMiB);
  CHECK(e.value("vlake_tenant_unhooked_processes", {{"tenant", "uid:1000"}}) == 2);
  CHECK(e.value("vlake_tenant_unhooked_bytes", {{"tenant", "uid:1000"}, {"gpu_index", "1"}}) == 5.0 * kMiB);
  CHECK(e.value("vlake_gpu_nvml_used_bytes", g0) == 90.0 * kMiB);
  CHECK(e.value("vlake_gpu_unlisted_bytes", g0) == 12.0 * kMiB);
  CHECK(e.value("vlake_gpu_unhooked_bytes", g0) == 3.0 * kMiB);
  CHECK(e.value("vlake_tenant_retained_bytes", alice0) == 6.0 * kMiB);
  CHECK(e.value("vlake_gpu_retained_bytes", g0) == 6.0 * kMiB);
  CHECK(e.value("vlake_gpu_held_descriptor_bytes", g0) == 2.0 * kMiB);
  CHECK(e.value("vlake_grant_denials_unhooked_total") == 4);
  CHECK(e.value("vlake_unhooked_kills_total") == 1);
  CHECK(e.value("vlake_passthrough_refused_total") == 2);
  CHECK(e.value("vlake_tenant_granted_bytes", alice0) == 48.0 * kMiB);
  CHECK(e.value("vlake_tenant_nonpool_bytes", alice0) == 2.0 * kMiB);
  CHECK(e.value("vlake_tenant_limit_bytes", alice0) == 1.0 * kGiB);
  CHECK(e.value("vlake_tenant_over_limit", alice0) == 1);
  CHECK(e.value("vlake_tenant_over_limit", {{"tenant", "research/user:alice"}, {"gpu_index", "1"}}) == 0);
  CHECK(e.value("vlake_tenant_limit_bytes", {{"tenant", "research/user:alice"}, {"gpu_index", "1"}}) == 2.0 * kGiB);
  CHECK(e.value("vlake_tenant_used_bytes",
                {{"tenant", "uid:1000"}, {"tenant_namespace", "default"}, {"gpu_index", "1"}}) == 6.0 * kMiB);
  CHECK(e.value("vlake_tenant_used_bytes",
                {{"tenant", "uid:2000"}, {"tenant_namespace", "default"}, {"gpu_index", "0"}}) == 0);
  CHECK(e.value("vlake_tenant_sessions", {{"tenant", "research/user:alice"}}) == 2);
  CHECK(e.value("vlake_tenant_sessions", {{"tenant", "uid:1000"}}) == 1);
  CHECK(e.value("vlake_tenant_sessions", {{"tenant", "uid:2000"}}) == 0);

  CHECK(e.value("vlake_namespace_used_bytes", {{"tenant_namespace", "research"}, {"gpu_index", "0"}}) == 50.0 * kMiB);
  CHECK(e.value("vlake_namespace_limit_bytes", {{"tenant_namespace", "research"}, {"gpu_index", "1"}}) == 16.0 * kGiB);
  CHECK(e.value("vlake_namespace_limit_bytes", {{"tenant_namespace", "default"}, {"gpu_index", "1"}}) == 80.0 * kGiB);
  CHECK(e.value("vlake_namespace_guaranteed_bytes", {{"tenant_namespace", "research"}, {"gpu_index", "0"}}) ==
        8.0 * kGiB);
  CHECK(e.value("vlake_namespace_over_limit", {{"tenant_namespace", "research"}, {"gpu_index", "1"}}) == 1);
  CHECK(e.value("vlake_namespace_over_limit", {{"tenant_namespace", "research"}, {"gpu_index", "0"}}) == 0);

  CHECK(e.value("vlake_tenants") == 3);
  CHECK(e.value("vlake_sessions", {{"state", "connected"}}) == 2);
  CHECK(e.value("vlake_sessions", {{"state", "detached"}}) == 1);
  CHECK(e.value("vlake_grants_total") == 11);
  CHECK(e.value("vlake_grant_denials_total", {{"reason", "tenant_limit"}}) == 1);
  CHECK(e.value("vlake_grant_denials_total", {{"reason", "namespace_limit"}}) == 2);
  CHECK(e.value("vlake_grant_denials_total", {{"reason", "guarantee"}}) == 3);
  CHECK(e.value("vlake_grant_denials_total", {{"reason", "out_of_memory"}}) == 4);
  CHECK(e.value("vlake_grant_denials_total", {{"reason", "unknown_device"}}) == 5);
  CHECK(e.value("vlake_grant_denials_total", {{"reason", "other"}}) == 6);
  CHECK(e.value("vlake_releases_total") == 7);
  CHECK(e.value("vlake_process_exits_total") == 8);
  CHECK(e.value("vlake_scrubs_total") == 9);
  CHECK(e.value("vlake_pool_reuses_total") == 10);
  CHECK(e.value("vlake_pool_handles_created_total") == 12);
  CHECK(e.value("vlake_pool_handles_released_total") == 13);
  CHECK(e.value("vlake_malformed_messages_total") == 14);
  CHECK(e.value("vlake_config_reloads_total") == 15);
  CHECK(e.value("vlake_config_reload_errors_total") == 16);
  CHECK(e.value("vlake_config_rejected") == 1);
  CHECK(e.value("vlake_guard_violations_total", {{"kind", "canary"}}) == 17);
  CHECK(e.value("vlake_guard_violations_total", {{"kind", "readonly_write"}}) == 30);
  CHECK(e.find("vlake_guard_violations_total", {{"kind", "fault"}}).empty());
  CHECK(e.value("vlake_kernel_faults_total", {{"guarded", "false"}, {"maps_shared", "false"}}) == 31);
  CHECK(e.value("vlake_kernel_faults_total", {{"guarded", "true"}, {"maps_shared", "true"}}) == 32);
  CHECK(e.value("vlake_kernel_faults_total", {{"guarded", "true"}, {"maps_shared", "false"}}) == 0);
  CHECK(e.value("vlake_tenant_kernel_faults_total",
                {{"tenant", "research/user:alice"}, {"guarded", "false"}, {"maps_shared", "true"}}) == 3);
  CHECK(e.value("vlake_grant_denials_total", {{"reason", "grant_cap"}}) == 18);
  CHECK(e.value("vlake_connection_denials_total", {{"reason", "session_cap"}}) == 19);
  CHECK(e.value("vlake_connection_denials_total", {{"reason", "tenant_table"}}) == 20);
  CHECK(e.value("vlake_connection_denials_total", {{"reason", "connection_cap"}}) == 21);
  CHECK(e.value("vlake_connection_denials_total", {{"reason", "unauthenticated"}}) == 22);
  CHECK(e.value("vlake_guard_events_dropped_total", {{"reason", "rejected"}}) == 23);
  CHECK(e.value("vlake_guard_events_dropped_total", {{"reason", "limited"}}) == 24);
  CHECK(e.value("vlake_log_lines_suppressed_total") == 25);
  CHECK(e.value("vlake_tenants_freed_total") == 26);
  CHECK(e.value("vlake_ipc_exports_total") == 27);
  CHECK(e.value("vlake_ipc_opens_total") == 28);
  CHECK(e.value("vlake_ipc_refused_total") == 29);
  CHECK(e.types.at("vlake_grant_duration_seconds") == "histogram");
  CHECK(e.types.at("vlake_grants_total") == "counter");
}

TEST_CASE("collector: the grant latency histogram is cumulative with the contract's buckets", "[unit]") {
  const auto s = synthetic();
  const Exposition e = scrape_text(*s);
  const std::vector<std::pair<std::string, double>> want = {
      {"5e-05", 3}, {"0.0001", 3}, {"0.00025", 5}, {"0.0005", 5}, {"0.001", 5}, {"0.0025", 5}, {"0.005", 5},
      {"0.01", 5},  {"0.025", 5},  {"0.05", 5},    {"0.1", 5},    {"0.25", 5},  {"1", 6},      {"+Inf", 7}};
  const auto buckets = e.find("vlake_grant_duration_seconds_bucket");
  REQUIRE(buckets.size() == want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    INFO("bucket " << i);
    const double le = buckets[i].labels.at("le") == "+Inf" ? -1 : std::stod(buckets[i].labels.at("le"));
    const double want_le = want[i].first == "+Inf" ? -1 : std::stod(want[i].first);
    CHECK(le == Approx(want_le));
    CHECK(buckets[i].value == want[i].second);
  }
  CHECK(e.value("vlake_grant_duration_seconds_count") == 7);
  CHECK(e.value("vlake_grant_duration_seconds_sum") == Approx(2.5));
  CHECK(e.types.at("vlake_grant_duration_max_seconds") == "gauge");
  CHECK(e.value("vlake_grant_duration_max_seconds") == Approx(1.75));
}

TEST_CASE("collector: fragmentation ratio cases", "[unit]") {
  // (largest servable, free bytes)
  CHECK(exporter::fragmentation_ratio(0, 0) == 0);                // empty pool
  CHECK(exporter::fragmentation_ratio(8 * kMiB, 8 * kMiB) == 0);  // one grant can take it all
  CHECK(exporter::fragmentation_ratio(2 * kMiB, 8 * kMiB) == Approx(0.75));
  // Nothing servable: vlaked never publishes it (every free handle serves some tenant).
  CHECK(exporter::fragmentation_ratio(0, 8 * kMiB) == 1);
  CHECK(exporter::fragmentation_ratio(1, 3) == Approx(2.0 / 3.0));
  CHECK(exporter::fragmentation_ratio(9, 8) == 0);  // inconsistent input: clamped
}

TEST_CASE("collector: daemon_up and health follow the refresh age and a clean stop", "[unit]") {
  auto s = synthetic();
  // 3 sample intervals of 1 s.
  CHECK(exporter::evaluate_health(*s, s->header.updated_unix_ns + 2'900'000'000ULL).up);
  const auto stale = exporter::evaluate_health(*s, s->header.updated_unix_ns + 3'100'000'000ULL);
  CHECK_FALSE(stale.up);
  CHECK_THAT(stale.reason, Catch::Contains("has not refreshed its state for 3.100 s (limit 3.000 s)"));
  CHECK(scrape_text(*s, s->header.updated_unix_ns + 3'100'000'000ULL).value("vlake_daemon_up") == 0);
  CHECK(scrape_text(*s, s->header.updated_unix_ns + 3'100'000'000ULL).value("vlake_state_age_seconds") == Approx(3.1));
  s->header.sample_interval_ms = 50;
  CHECK_FALSE(exporter::evaluate_health(*s, s->header.updated_unix_ns + 200'000'000ULL).up);
  CHECK(exporter::evaluate_health(*s, s->header.updated_unix_ns + 100'000'000ULL).up);
  s->header.clean = 1;
  const auto stopped = exporter::evaluate_health(*s, s->header.updated_unix_ns);
  CHECK_FALSE(stopped.up);
  CHECK_THAT(stopped.reason, Catch::Contains("stopped"));
}

TEST_CASE("collector: Collect() without a snapshot answers build_info and daemon_up 0", "[unit]") {
  exporter::StateCollector c([]() -> std::unique_ptr<st::State> { throw st::StateError("no such segment"); },
                             [] { return kNow; }, kBuild);
  const auto fs = c.Collect();
  REQUIRE(fs.size() == 2);
  CHECK(fs[0].name == "vlake_build_info");
  CHECK(fs[1].name == "vlake_daemon_up");
  CHECK(fs[1].metric.at(0).gauge.value == 0);
  const auto h = c.health();
  CHECK_FALSE(h.up);
  CHECK(h.reason == "cannot read the state segment: no such segment");
}

TEST_CASE("exporter: listen addresses", "[unit]") {
  CHECK(exporter::parse_listen_address(":19400") == "19400");
  CHECK(exporter::parse_listen_address("127.0.0.1:19400") == "127.0.0.1:19400");
  CHECK(exporter::parse_listen_address("0.0.0.0:1") == "0.0.0.0:1");
  for (const char* bad : {"19400", "127.0.0.1:0", ":65536", ":x", "host:", "local host:80", "[::1:80"}) {
    INFO(bad);
    CHECK_THROWS_AS(exporter::parse_listen_address(bad), std::invalid_argument);
  }
}

TEST_CASE("exporter: HTTP server over a fake snapshot source", "[unit]") {
  auto state = synthetic();
  std::shared_ptr<const st::State> shared(std::move(state));
  std::uint64_t now = kNow;
  auto collector = std::make_shared<exporter::StateCollector>([shared] { return std::make_unique<st::State>(*shared); },
                                                              [&now] { return now; }, kBuild);
  const int port = exptest::free_port();
  exporter::MetricsServer server("127.0.0.1:" + std::to_string(port), collector);

  const auto m = http_get(port, "/metrics");
  CHECK(m.status == 200);
  CHECK_THAT(m.headers.at("content-type"), Catch::StartsWith("text/plain; version=0.0.4"));
  const Exposition e = parse_prometheus(m.body);
  CHECK(e.value("vlake_tenants") == 3);
  CHECK(e.value("vlake_pool_fragmentation_ratio", {{"gpu_index", "0"}}) == Approx(0.25));

  auto h = http_get(port, "/healthz");
  CHECK(h.status == 200);
  CHECK(h.body == "ok\n");
  now = kNow + 10'000'000'000ULL;  // 10 s without a refresh
  h = http_get(port, "/healthz");
  CHECK(h.status == 503);
  CHECK_THAT(h.body, Catch::Contains("has not refreshed its state"));
  CHECK(parse_prometheus(http_get(port, "/metrics").body).value("vlake_daemon_up") == 0);

  CHECK(http_get(port, "/").status == 404);
  CHECK(http_get(port, "/metricsx").status == 404);
  CHECK(http_get(port, "/metrics/x").status == 404);
  CHECK(http_get(port, "/other").status == 404);
  CHECK(http_get(port, "/metrics", "POST").status == 405);

  // The same port again: a clear error.
  try {
    exporter::MetricsServer second("127.0.0.1:" + std::to_string(port), collector);
    FAIL("a second server on the same port started");
  } catch (const std::runtime_error& err) {
    CHECK_THAT(err.what(), Catch::Contains("cannot listen on 127.0.0.1:" + std::to_string(port)));
  }
}

namespace {

// The first IPv4 address of an interface that is up and not loopback; "" if there is none.
std::string non_loopback_ipv4() {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return "";
  std::string found;
  for (const ifaddrs* i = list; i != nullptr && found.empty(); i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    if ((i->ifa_flags & IFF_UP) == 0 || (i->ifa_flags & IFF_LOOPBACK) != 0) continue;
    sockaddr_in a{};
    std::memcpy(&a, i->ifa_addr, sizeof a);
    char text[INET_ADDRSTRLEN] = {};
    if (::inet_ntop(AF_INET, &a.sin_addr, text, sizeof text) != nullptr) found = text;
  }
  ::freeifaddrs(list);
  return found;
}

// Whether a TCP connection to host:port (an address of this host) is accepted; at most 2 s.
bool connects(const std::string& host, int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  const timeval limit{2, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof limit);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  REQUIRE(::inet_pton(AF_INET, host.c_str(), &a.sin_addr) == 1);
  const bool ok = ::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

}  // namespace

// vlaked's default --metrics-address is 127.0.0.1:19400 (tests/pool's options test): such a
// server must not be reachable on the host's other addresses. Where the host has no other IPv4
// address, only loopback is checked (a warning says so).
TEST_CASE("exporter: a loopback address is reachable on loopback only", "[unit]") {
  std::shared_ptr<const st::State> shared(synthetic());
  auto collector = std::make_shared<exporter::StateCollector>([shared] { return std::make_unique<st::State>(*shared); },
                                                              [] { return kNow; }, kBuild);
  const int port = exptest::free_port();
  exporter::MetricsServer loopback("127.0.0.1:" + std::to_string(port), collector);
  CHECK(connects("127.0.0.1", port));
  const std::string other = non_loopback_ipv4();
  if (other.empty()) {
    WARN("this host has no non-loopback IPv4 address: only loopback checked");
    return;
  }
  INFO("non-loopback address " << other);
  CHECK_FALSE(connects(other, port));
  // The probe can tell: a server on every interface is reachable there.
  const int all_port = exptest::free_port();
  exporter::MetricsServer all(":" + std::to_string(all_port), collector);
  CHECK(connects(other, all_port));
  CHECK(connects("127.0.0.1", all_port));
}
