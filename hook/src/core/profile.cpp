#include "profile.hpp"

#include <cstdio>
#include <cstdlib>

#include "log.hpp"

namespace vlake::hook {

namespace {

constexpr const char* kNames[] = {"grant (daemon round trip)",
                                  "import",
                                  "VA reserve",
                                  "map",
                                  "set access",
                                  "unmap",
                                  "release handles+VA",
                                  "release (daemon round trip)",
                                  "kept mapping reused"};
static_assert(sizeof kNames / sizeof kNames[0] == static_cast<std::size_t>(Phase::count));

void report_at_exit() { Profile::get().report(); }

}  // namespace

void Profile::enable() noexcept {
  if (on_.exchange(true)) return;
  std::atexit(report_at_exit);
}

void Profile::report() const noexcept {
  for (std::size_t i = 0; i < static_cast<std::size_t>(Phase::count); ++i) {
    const std::uint64_t n = n_[i].load(std::memory_order_relaxed);
    if (n == 0) continue;
    const double mean_us = static_cast<double>(ns_[i].load(std::memory_order_relaxed)) / 1e3 / static_cast<double>(n);
    log(LogLevel::error, "profile: %-28s n=%llu mean=%.1f us max=%.1f us >=250us: %llu", kNames[i],
        static_cast<unsigned long long>(n), mean_us, static_cast<double>(max_[i].load(std::memory_order_relaxed)) / 1e3,
        static_cast<unsigned long long>(slow_[i].load(std::memory_order_relaxed)));
  }
}

}  // namespace vlake::hook
