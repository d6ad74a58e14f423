// What the allocation policy reports (alloc/seams.hpp): refusals, logged and rate-limited.
#include "alloc/seams.hpp"
#include "hook.hpp"

#include "alloc/internal.hpp"
#include "ipc.hpp"
#include "profile.hpp"
#include "share.hpp"
#include "write_span.hpp"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>

namespace vlake::hook {

using proto::GrantPurpose;
using proto::Status;

std::string suppressed_note(std::uint64_t n) {
  if (n == 0) return {};
  return " (" + std::to_string(n) + " similar message" + (n == 1 ? "" : "s") + " suppressed)";
}

namespace {

// The wording of an out-of-memory refusal: "<cause><holder> <tenant> holds <used> of its <limit>
// <what>"; `counts`: used and limit are numbers of grants, not bytes.
struct Refusal {
  const char* cause;
  const char* holder;
  bool counts;
  const char* what;
};

// The wording for a status the daemon refuses an allocation with; nullptr for any other status.
const Refusal* refusal_of(Status status) {
  static constexpr Refusal kOverLimit{"", "tenant", false, "limit"};
  static constexpr Refusal kNamespaceOverLimit{"", "the namespace of tenant", false, "limit"};
  static constexpr Refusal kLimitReached{"", "tenant", true,
                                         "grants (vlaked's grant cap, its cap on grants waiting for memory, or its "
                                         "fair share of the grant table)"};
  static constexpr Refusal kGuarantee{"the rest of the GPU is guaranteed to other namespaces; ", "tenant", false,
                                      "limit"};
  static constexpr Refusal kOutOfMemory{"the GPU is full (the node pool has no memory left); ", "tenant", false,
                                        "limit"};
  switch (status) {
    case Status::over_limit: return &kOverLimit;
    case Status::namespace_over_limit: return &kNamespaceOverLimit;
    case Status::limit_reached: return &kLimitReached;
    case Status::guarantee: return &kGuarantee;
    case Status::out_of_memory: return &kOutOfMemory;
    default: return nullptr;
  }
}

}  // namespace

void report_refusal(State& s, const GrantResult& g, int dev, std::uint64_t requested, const char* what_of) {
  std::uint64_t suppressed = 0;
  if (!s.refusals.allow(suppressed)) return;
  const std::string tenant = s.client.tenant_name();
  const std::string note = suppressed_note(suppressed);
  if (const Refusal* why = refusal_of(g.status)) {
    const std::string used = why->counts ? std::to_string(g.used) : format_bytes(g.used);
    const std::string limit = why->counts ? std::to_string(g.limit) : format_bytes(g.limit);
    log(LogLevel::error, "out of memory on GPU %d: %s%s %s holds %s of its %s %s; %s %s refused%s", dev, why->cause,
        why->holder, tenant.c_str(), used.c_str(), limit.c_str(), why->what, what_of ? what_of : "request of",
        format_bytes(requested).c_str(), note.c_str());
  } else {
    log(LogLevel::error, "%s %s on GPU %d refused by vlaked (status %d)%s", what_of ? what_of : "allocation of",
        format_bytes(requested).c_str(), dev, static_cast<int>(g.status), note.c_str());
  }
}

}  // namespace vlake::hook
