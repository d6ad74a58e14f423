// Who an NVML reading is about, and when a grant needs a fresh one (internal to vlaked).
//
// The loop samples NVML on every tick and hands the reading to the Node with the identities
// (/proc) of the processes it lists that have no session; the Node decides what their memory
// means (node.hpp, observe_gpus). These functions pick those processes out of a reading and
// decide when a counted grant must not be decided on the last reading: its memory is told apart
// from the rest of its process's memory (the CUDA context) by subtracting it from the process's
// NVML figure, so a reading older than a freshly created context would let the tenant run over
// its limit by that context.
//
// Thread-safety: pure functions; any thread. Errors: none.
#pragma once

#include <chrono>
#include <cstdint>
#include <set>
#include <vector>

#include "vlake/pool/nvml_source.hpp"

namespace vlake::pool {

struct ReadingSubjects {
  // Processes the reading lists that have no session and are not the daemon: each once, in the
  // order the reading lists them. Their identities go to the Node.
  std::vector<std::uint32_t> sessionless;
  // Every process the reading lists (a device-file user not among them is one NVML missed).
  std::set<std::uint32_t> listed;
};
ReadingSubjects reading_subjects(const std::vector<GpuSample>& reading, const std::set<std::uint32_t>& session_pids,
                                 std::uint32_t daemon_pid);

// Whether a counted grant of a process that said Hello at `hello_at` needs a new reading at
// `now`: the last one (taken at `last`) predates that Hello or is `max_age` old or older.
bool reading_stale(std::chrono::steady_clock::time_point last, std::chrono::steady_clock::time_point hello_at,
                   std::chrono::steady_clock::time_point now, std::chrono::steady_clock::duration max_age);

}  // namespace vlake::pool
