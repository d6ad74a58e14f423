// vlake_state_json --state NAME --json: prints a consistent snapshot of vlaked's state segment
// as JSON (devices, tenants with per-device used = granted + non-pool, sessions, counters).
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
    std::printf("{\"daemon_pid\":%u,\"starts\":%u,\"devices\":[", h.daemon_pid, h.starts);
    bool first = true;
    for (std::uint32_t d = 0; d < kMaxDevices; ++d) {
      const auto& r = s->devices[d];
      if (r.in_use == 0) continue;
      std::printf(
          "%s{\"ordinal\":%u,\"uuid\":\"%s\",\"total\":%llu,\"pool_bytes\":%llu,"
          "\"free_bytes\":%llu,\"free_handles\":%llu,\"granted_bytes\":%llu,"
          "\"orphaned_bytes\":%llu,\"counted_bytes\":%llu,\"nonpool_bytes\":%llu}",
          first ? "" : ",", r.ordinal, hex(r.uuid, 16).c_str(), static_cast<unsigned long long>(r.total),
          static_cast<unsigned long long>(r.pool_bytes), static_cast<unsigned long long>(r.free_bytes),
          static_cast<unsigned long long>(r.free_handles), static_cast<unsigned long long>(r.granted_bytes),
          static_cast<unsigned long long>(r.orphaned_bytes), static_cast<unsigned long long>(r.counted_bytes),
          static_cast<unsigned long long>(r.nonpool_bytes));
      first = false;
    }
    std::printf("],\"tenants\":[");
    first = true;
    for (const auto& t : s->tenants) {
      if (t.in_use == 0) continue;
      std::string name_s(t.name, strnlen(t.name, kTenantNameBytes));
      std::printf("%s{\"id\":%u,\"name\":\"%s\",\"limit\":[", first ? "" : ",", t.id, name_s.c_str());
      for (std::uint32_t d = 0; d < h.device_count; ++d)
        std::printf("%s%llu", d ? "," : "", static_cast<unsigned long long>(t.limit[d]));
      std::printf("],\"granted\":[");
      for (std::uint32_t d = 0; d < h.device_count; ++d)
        std::printf("%s%llu", d ? "," : "", static_cast<unsigned long long>(t.granted[d]));
      std::printf("],\"nonpool\":[");
      for (std::uint32_t d = 0; d < h.device_count; ++d)
        std::printf("%s%llu", d ? "," : "", static_cast<unsigned long long>(t.nonpool[d]));
      std::printf("],\"used\":[");
      for (std::uint32_t d = 0; d < h.device_count; ++d)
        std::printf("%s%llu", d ? "," : "", static_cast<unsigned long long>(t.granted[d] + t.nonpool[d]));
      std::printf("]}");
      first = false;
    }
    std::printf("],\"sessions\":[");
    first = true;
    for (const auto& ses : s->sessions) {
      if (ses.state == kSessionFree) continue;
      std::printf("%s{\"id\":%llu,\"pid\":%u,\"uid\":%u,\"tenant\":%u,\"state\":%u,\"grants\":%u}", first ? "" : ",",
                  static_cast<unsigned long long>(ses.id), ses.pid, ses.uid, ses.tenant, ses.state, ses.grant_count);
      first = false;
    }
    const auto& c = s->counters;
    std::printf(
        "],\"counters\":{\"grants\":%llu,\"denials_over_limit\":%llu,\"releases\":%llu,"
        "\"scrubs\":%llu,\"reuses\":%llu,\"handles_created\":%llu,\"malformed\":%llu}}\n",
        static_cast<unsigned long long>(c.grants), static_cast<unsigned long long>(c.denials_over_limit),
        static_cast<unsigned long long>(c.releases), static_cast<unsigned long long>(c.scrubs),
        static_cast<unsigned long long>(c.reuses), static_cast<unsigned long long>(c.handles_created),
        static_cast<unsigned long long>(c.malformed));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "vlake_state_json: %s\n", e.what());
    return 1;
  }
  return 0;
}
