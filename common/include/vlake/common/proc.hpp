// Small process and file-system helpers shared by vlaked, the device plugin, vlakectl and the
// simulator.
//
// Contract
// - read_proc_stat(pid): fields 3 (state, e.g. 'R', 'S', 'Z') and 22 (start time in clock ticks
//   since boot) of /proc/<pid>/stat; nullopt when the process is gone or the file cannot be read
//   or parsed. (pid, start time) names one process for its whole life, even after its pid is
//   reused. No allocation, no exceptions (open/read/close only): safe in the simulator and in a
//   forked child.
// - process_start_time(pid): read_proc_stat(pid)->start_time, or 0 when the process is gone.
// - mkdir_p(dir, mode): creates `dir` and its missing parents; the directories it creates get
//   exactly `mode` (the umask does not narrow it); existing ones are left alone. Throws
//   std::system_error ("mkdir <path>") on failure. An empty `dir` does nothing.
// - Thread-safe (no shared state). Dependencies: libc and libstdc++ only.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>

namespace vlake {

struct ProcStat {
  char state = 0;
  std::uint64_t start_time = 0;
};

[[nodiscard]] std::optional<ProcStat> read_proc_stat(std::uint32_t pid) noexcept;
[[nodiscard]] std::uint64_t process_start_time(std::uint32_t pid) noexcept;

void mkdir_p(const std::string& dir, mode_t mode = 0755);

}  // namespace vlake
