// Per-process call counters of the simulated driver's entry points (docs/simulator.md,
// "Call counters"). Every exported cu* function starts with VLAKE_SIM_COUNT(its name); the
// counts are read through the exported vlake_sim_call_count / vlake_sim_vmm_call_count.
//
// Contract:
// - Counts are per process (plain process memory, not the shared node): a fork()ed child starts
//   with a copy of its parent's counts.
// - Only the outermost entry point of a call is counted: an entry point that forwards to another
//   (cuMemcpyHtoD_v2_ptds -> cuMemcpyHtoD_v2) counts once, under the name the caller used.
// - Thread-safety: any thread may count or read at any time. Counting is one relaxed atomic
//   increment (plus a one-time registration per entry point, under a mutex); reads are relaxed,
//   so a read concurrent with calls sees some recent value.
// - Never throws; at most kMaxEntries distinct entry points are counted (more are ignored).
#pragma once

#include <atomic>
#include <cstring>
#include <mutex>
#include <string_view>

namespace vlake::sim::calls {

inline constexpr int kMaxEntries = 256;

struct Entry {
  const char* name;
  std::atomic<unsigned long long> count;
};

struct Table {
  Entry entries[kMaxEntries];
  std::atomic<int> used{0};
  std::mutex mu;  // registration only
};

inline Table& table() noexcept {
  static Table t;  // constant-initialized: usable from any entry point, never destroyed early
  return t;
}

// The counter of `name` (a string literal), registering it on first use; nullptr if full.
inline std::atomic<unsigned long long>* counter(const char* name) noexcept {
  Table& t = table();
  std::lock_guard lock(t.mu);
  const int n = t.used.load(std::memory_order_relaxed);
  for (int i = 0; i < n; ++i) {
    if (std::strcmp(t.entries[i].name, name) == 0) return &t.entries[i].count;
  }
  if (n >= kMaxEntries) return nullptr;
  t.entries[n].name = name;
  t.entries[n].count.store(0, std::memory_order_relaxed);
  t.used.store(n + 1, std::memory_order_release);
  return &t.entries[n].count;
}

inline unsigned long long count_of(const char* name) noexcept {
  if (name == nullptr) return 0;
  Table& t = table();
  const int n = t.used.load(std::memory_order_acquire);
  for (int i = 0; i < n; ++i) {
    if (std::strcmp(t.entries[i].name, name) == 0) {
      return t.entries[i].count.load(std::memory_order_relaxed);
    }
  }
  return 0;
}

// The entry points vlake_sim_vmm_call_count sums: the VMM calls, and every cuMemAlloc* /
// cuMemFree* (what a warm hook allocation must not reach).
inline bool is_vmm(std::string_view name) noexcept {
  static constexpr std::string_view kVmm[] = {"cuMemCreate",
                                              "cuMemRelease",
                                              "cuMemMap",
                                              "cuMemUnmap",
                                              "cuMemSetAccess",
                                              "cuMemAddressReserve",
                                              "cuMemAddressFree",
                                              "cuMemImportFromShareableHandle",
                                              "cuMemExportToShareableHandle"};
  for (std::string_view v : kVmm) {
    if (name == v) return true;
  }
  return name.starts_with("cuMemAlloc") || name.starts_with("cuMemFree");
}

inline unsigned long long vmm_total() noexcept {
  Table& t = table();
  const int n = t.used.load(std::memory_order_acquire);
  unsigned long long sum = 0;
  for (int i = 0; i < n; ++i) {
    if (is_vmm(t.entries[i].name)) sum += t.entries[i].count.load(std::memory_order_relaxed);
  }
  return sum;
}

// True while this thread is inside an entry point (nested entry points are not counted).
inline thread_local bool t_in_entry = false;

class Scope {
 public:
  explicit Scope(std::atomic<unsigned long long>* c) noexcept : outer_(!t_in_entry) {
    if (outer_) {
      t_in_entry = true;
      if (c != nullptr) c->fetch_add(1, std::memory_order_relaxed);
    }
  }
  ~Scope() {
    if (outer_) t_in_entry = false;
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  bool outer_;
};

}  // namespace vlake::sim::calls

// First statement of every exported entry point.
#define VLAKE_SIM_COUNT(name)                                                                             \
  static std::atomic<unsigned long long>* const vlake_sim_counter_ = ::vlake::sim::calls::counter(#name); \
  const ::vlake::sim::calls::Scope vlake_sim_scope_(vlake_sim_counter_)
