// vlake_state_json --state NAME --json: prints a consistent snapshot of vlaked's state segment
// as JSON (devices, tenants with per-device used = granted + non-pool + retained + unhooked: all
// it holds on the GPU, sessions, counters).
// A test tool for scripts (tests/gpu/node_slice.py); operators get vlakectl.
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "vlake/contracts/state.hpp"

using namespace vlake::state;

namespace {
std::string hex(const std::uint8_t* b, std::size_t n) {
  std::string s;
  char buf[3];
  for (std::size_t i = 0; i < n; ++i) {
    std::snprintf(buf, sizeof buf, "%02x", b[i]);
    s += buf;
  }
  return s;
}
}  // namespace

int main(int argc, char** argv) {
  std::string name;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--state") == 0 && i + 1 < argc) name = argv[++i];
  }
  if (name.empty()) {
    std::fprintf(stderr, "usage: %s --state NAME [--json]\n", argv[0]);
    return 2;
  }
  try {
    StateReader reader(name);
    const auto s = reader.snapshot();
    const auto& h = s->header;
    using ull = unsigned long long;
    std::printf("{\"daemon_pid\":%u,\"starts\":%u,\"devices\":[", h.daemon_pid, h.starts);
    bool first = true;
    for (std::uint32_t d = 0; d < kMaxDevices; ++d) {
      const auto& r = s->devices[d];
      if (r.in_use == 0) continue;
      std::printf(
          "%s{\"ordinal\":%u,\"uuid\":\"%s\",\"total\":%llu,\"pool_bytes\":%llu,"
          "\"free_bytes\":%llu,\"free_handles\":%llu,\"granted_bytes\":%llu,"
          "\"orphaned_bytes\":%llu,\"counted_bytes\":%llu,\"nonpool_bytes\":%llu,"
          "\"retained_bytes\":%llu,\"unhooked_bytes\":%llu,\"nvml_used_bytes\":%llu,\"held_fd_bytes\":%llu,"
          "\"unlisted_bytes\":%llu,\"dedup_logical_bytes\":%llu,\"dedup_physical_bytes\":%llu,"
          "\"host_bytes\":%llu}",
          first ? "" : ",", r.ordinal, hex(r.uuid, 16).c_str(), static_cast<ull>(r.total),
          static_cast<ull>(r.pool_bytes), static_cast<ull>(r.free_bytes), static_cast<ull>(r.free_handles),
          static_cast<ull>(r.granted_bytes), static_cast<ull>(r.orphaned_bytes), static_cast<ull>(r.counted_bytes),
          static_cast<ull>(r.nonpool_bytes), static_cast<ull>(r.retained_bytes), static_cast<ull>(r.unhooked_bytes),
          static_cast<ull>(r.nvml_used_bytes), static_cast<ull>(r.held_fd_bytes), static_cast<ull>(r.unlisted_bytes),
          static_cast<ull>(r.dedup_logical_bytes), static_cast<ull>(r.dedup_physical_bytes),
          static_cast<ull>(r.host_bytes));
      first = false;
    }
    std::printf("],\"tenants\":[");
    first = true;
    const auto array = [&](const char* key, auto value) {
      std::printf(",\"%s\":[", key);
      for (std::uint32_t d = 0; d < h.device_count; ++d)
        std::printf("%s%llu", d ? "," : "", static_cast<ull>(value(d)));
      std::printf("]");
    };
    for (const auto& t : s->tenants) {
      if (t.in_use == 0) continue;
      std::string name_s(t.name, strnlen(t.name, kTenantNameBytes));
      std::printf("%s{\"id\":%u,\"name\":\"%s\",\"enforce\":%u,\"unhooked_processes\":%u", first ? "" : ",", t.id,
                  name_s.c_str(), t.enforce, t.unhooked_processes);
      array("limit", [&](std::uint32_t d) { return t.limit[d]; });
      array("granted", [&](std::uint32_t d) { return t.granted[d]; });
      array("nonpool", [&](std::uint32_t d) { return t.nonpool[d]; });
      array("retained", [&](std::uint32_t d) { return t.retained[d]; });
      array("unhooked", [&](std::uint32_t d) { return t.unhooked[d]; });
      // Everything the tenant holds on the GPU, whatever the policy charges.
      array("used", [&](std::uint32_t d) { return t.granted[d] + t.nonpool[d] + t.retained[d] + t.unhooked[d]; });
      std::printf("}");
      first = false;
    }
    std::printf("],\"sessions\":[");
    first = true;
    for (const auto& ses : s->sessions) {
      if (ses.state == kSessionFree) continue;
      // The host tier (layout 11): its grants' bytes there, and how many of them are moving.
      std::uint64_t host = 0;
      std::uint32_t moving = 0;
      for (const auto& g : s->grants) {
        if (g.state == kGrantFree || g.session != ses.id) continue;
        if (g.location == kGrantOnHost) host += g.bytes;
        if (g.location == kGrantToHost || g.location == kGrantToGpu) ++moving;
      }
      std::printf(
          "%s{\"id\":%llu,\"pid\":%u,\"uid\":%u,\"tenant\":%u,\"state\":%u,\"grants\":%u,\"host_bytes\":%llu,"
          "\"moving\":%u}",
          first ? "" : ",", static_cast<ull>(ses.id), ses.pid, ses.uid, ses.tenant, ses.state, ses.grant_count,
          static_cast<ull>(host), moving);
      first = false;
    }
    const auto& c = s->counters;
    const std::pair<const char*, std::uint64_t> counters[] = {
        {"grants", c.grants},
        {"denials_over_limit", c.denials_over_limit},
        {"releases", c.releases},
        {"releases_exported", c.releases_exported},
        {"scrubs", c.scrubs},
        {"reuses", c.reuses},
        {"handles_created", c.handles_created},
        {"handles_released", c.handles_released},
        {"malformed", c.malformed},
        {"denials_session_cap", c.denials_session_cap},
        {"denials_grant_cap", c.denials_grant_cap},
        {"denials_connection_cap", c.denials_connection_cap},
        {"denials_unauthenticated", c.denials_unauthenticated},
        {"denials_tenant_table", c.denials_tenant_table},
        {"denials_unhooked", c.denials_unhooked},
        {"guard_events_rejected", c.guard_events_rejected},
        {"guard_events_limited", c.guard_events_limited},
        {"log_suppressed", c.log_suppressed},
        {"unhooked_kills", c.unhooked_kills},
        {"tenants_freed", c.tenants_freed},
        {"handles_retired_held", c.handles_retired_held},
        {"passthrough_refused", c.passthrough_refused},
        {"tier_demotes", c.tier_demotes},
        {"tier_promotes", c.tier_promotes},
        {"tier_demoted_bytes", c.tier_demoted_bytes},
        {"tier_promoted_bytes", c.tier_promoted_bytes},
        {"tier_demote_ns", c.tier_demote_ns},
        {"tier_promote_ns", c.tier_promote_ns},
        {"tier_declined", c.tier_declined},
        {"tier_busy", c.tier_busy},
        {"tier_made_on_demand", c.tier_made_on_demand},
        {"host_stock_bytes", c.host_stock_bytes},
        {"host_bound_bytes", c.host_bound_bytes},
    };
    std::printf("],\"counters\":{");
    first = true;
    for (const auto& [k, v] : counters) {
      std::printf("%s\"%s\":%llu", first ? "" : ",", k, static_cast<ull>(v));
      first = false;
    }
    std::printf("}}\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "vlake_state_json: %s\n", e.what());
    return 1;
  }
  return 0;
}
