// vlake::pool holder scan — which other processes hold an open file description this process
// has (docs/pool.md, "Handle binding").
//
// What it does
//   scan_holders(fds): for every fd given, the number of other processes that hold the same
//   open file description. It walks /proc/<pid>/fd of every process except this one, stat()s
//   each entry's target and keeps only those whose (st_dev, st_ino, st_rdev) equal some scanned
//   fd's fstat(); for those it asks kcmp(getpid(), pid, KCMP_FILE, fd, theirs) == 0. So it is
//   cheap where nothing matches (one stat per descriptor on the node) and exact where something
//   does: a VMM export is an open of /dev/nvidiactl (the same inode as every other nvidiactl
//   open), and kcmp tells the daemon's export apart from other opens; a descriptor passed with
//   SCM_RIGHTS, dup()ed or inherited is the same description.
//   - Processes that exit during the scan, and descriptors closed during it, are skipped.
//   - kcmp failing with EPERM, EACCES or ENOSYS: that descriptor counts as held (conservative);
//     logged once per scanner.
//   - A /proc/<pid>/fd this process may not read (not root) is skipped; logged once per scanner.
//   - An fd that fstat() rejects counts 0 holders.
//
// Thread-safety: scan_holders is reentrant; a HolderScan from make_holder_scan() must be called
//   from one thread at a time (it keeps its log-once flags). Errors: never throws from the
//   scan itself (an unreadable /proc yields zero holders and a log line).
#pragma once

#include <cstdint>
#include <vector>

#include "vlake/common/log.hpp"
#include "vlake/pool/device_pool.hpp"

namespace vlake::pool {

struct HolderScanStats {
  bool kcmp_denied = false;    // kcmp refused (counted as held)
  bool fd_dir_denied = false;  // some /proc/<pid>/fd could not be read (skipped)
  std::uint64_t processes = 0;
  std::uint64_t candidates = 0;  // descriptors whose target matched (kcmp calls)
};

// For each fd in `fds`, the number of other processes holding its open file description.
std::vector<std::uint32_t> scan_holders(const std::vector<int>& fds, HolderScanStats* stats = nullptr);

// A HolderScan for NodeEnv, logging (once each) kcmp refusals and unreadable descriptor tables.
// `log` must outlive it.
HolderScan make_holder_scan(const Logger& log);

}  // namespace vlake::pool
