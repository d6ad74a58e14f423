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

void report_refusal(State& s, const GrantResult& g, int dev, std::uint64_t requested) {
  std::uint64_t suppressed = 0;
  if (!s.refusals.allow(suppressed)) return;
  const std::string tenant = s.client.tenant_name();
  const std::string note = suppressed_note(suppressed);
  if (g.status == Status::over_limit) {
    log(LogLevel::error, "out of memory on GPU %d: tenant %s holds %s of its %s limit; request of %s refused%s", dev,
        tenant.c_str(), format_bytes(g.used).c_str(), format_bytes(g.limit).c_str(), format_bytes(requested).c_str(),
        note.c_str());
  } else if (g.status == Status::namespace_over_limit) {
    log(LogLevel::error,
        "out of memory on GPU %d: the namespace of tenant %s holds %s of its %s limit; request of "
        "%s refused%s",
        dev, tenant.c_str(), format_bytes(g.used).c_str(), format_bytes(g.limit).c_str(),
        format_bytes(requested).c_str(), note.c_str());
  } else if (g.status == Status::limit_reached) {
    log(LogLevel::error,
        "out of memory on GPU %d: tenant %s holds %llu of its %llu grants (vlaked's grant cap, or its grant table "
        "is full); request of %s refused%s",
        dev, tenant.c_str(), static_cast<unsigned long long>(g.used), static_cast<unsigned long long>(g.limit),
        format_bytes(requested).c_str(), note.c_str());
  } else if (g.status == Status::guarantee) {
    log(LogLevel::error,
        "out of memory on GPU %d: the rest of the GPU is guaranteed to other namespaces; tenant %s "
        "holds %s of its %s limit; request of %s refused%s",
        dev, tenant.c_str(), format_bytes(g.used).c_str(), format_bytes(g.limit).c_str(),
        format_bytes(requested).c_str(), note.c_str());
  } else if (g.status == Status::out_of_memory) {
    log(LogLevel::error,
        "out of memory on GPU %d: the GPU is full (the node pool has no memory left); tenant %s "
        "holds %s of its %s limit; request of %s refused%s",
        dev, tenant.c_str(), format_bytes(g.used).c_str(), format_bytes(g.limit).c_str(),
        format_bytes(requested).c_str(), note.c_str());
  } else {
    log(LogLevel::error, "allocation of %s on GPU %d refused by vlaked (status %d)%s", format_bytes(requested).c_str(),
        dev, static_cast<int>(g.status), note.c_str());
  }
}

}  // namespace vlake::hook
