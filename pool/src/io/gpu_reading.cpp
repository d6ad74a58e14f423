#include "gpu_reading.hpp"

namespace vlake::pool {

ReadingSubjects reading_subjects(const std::vector<GpuSample>& reading, const std::set<std::uint32_t>& session_pids,
                                 std::uint32_t daemon_pid) {
  ReadingSubjects out;
  for (const GpuSample& g : reading) {
    for (const ProcessUsage& p : g.processes) {
      const bool first = out.listed.insert(p.pid).second;
      if (first && p.pid != daemon_pid && session_pids.count(p.pid) == 0) out.sessionless.push_back(p.pid);
    }
  }
  return out;
}

bool reading_stale(std::chrono::steady_clock::time_point last, std::chrono::steady_clock::time_point hello_at,
                   std::chrono::steady_clock::time_point now, std::chrono::steady_clock::duration max_age) {
  return last <= hello_at || now - last >= max_age;
}

}  // namespace vlake::pool
