// vlaked's handles on tenant processes (internal): pidfds that pin a process, the signal that
// kills an unhooked one, and a uid's groups for the quota file's group rules.
//
// A pid alone may be reused by the time it is acted on; these pair it with its start time
// (/proc/<pid>/stat, vlake/common/proc.hpp) and act through a pidfd, so that a process that
// replaced the one meant is never hit.
//
// Thread-safety: stateless; any thread. Errors: none thrown; failures are return values.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <vector>

namespace vlake::pool {

// pidfd_open(2): a descriptor that pins `pid`, or -1 (errno set).
int pidfd_open(std::uint32_t pid);

// Sends SIGKILL to (pid, start_time) through a pidfd; the start time is checked after the pidfd
// pins the process. False: the process is gone, is another one by now, or the kill was refused.
bool kill_process(std::uint32_t pid, std::uint64_t start_time);

// Whether the process behind `pidfd` has exited (never blocks).
bool pidfd_exited(int pidfd);

// The groups of `uid` (its primary `gid` and its supplementary groups, getgrouplist(3)); just
// {gid} when the uid has no passwd entry or the list cannot be read.
std::vector<gid_t> supplementary_groups(uid_t uid, gid_t gid);

}  // namespace vlake::pool
