// vlake::pool process identity: who a process on a GPU is, read from /proc by vlaked's loop for
// the processes NVML lists without a session (docs/daemon.md, "Memory outside vlake"). The
// Node decides what the identity means (pool/node.hpp, Node::observe_gpus).
//
// read_process_identity(pid, kubernetes): /proc/<pid>/stat (start time), /proc/<pid>/status
// (effective uid and gid: what SO_PEERCRED reports for a session of that process) and, with
// `kubernetes`, /proc/<pid>/cgroup (pod UID) and /proc/<pid>/mountinfo (allocation directories
// the device plugin mounted into its container). nullopt when the process is gone or its
// status cannot be read. Reading another user's process needs root (vlaked runs as root; on
// Kubernetes with hostPID, so that it sees the containers' pids).
// The parsers are pure (tests feed them text). Thread-safe; no exceptions escape.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace vlake::pool {

// A process NVML lists on a GPU, as the loop read it from /proc (docs/daemon.md, "Memory
// outside vlake"). The loop reads it only for pids without a session and never for itself.
struct ProcessIdentity {
  std::uint32_t pid = 0;
  std::uint64_t start_time = 0;  // /proc/<pid>/stat; with pid, names the process for kills
  std::uint32_t uid = 0;         // effective uid and gid (/proc/<pid>/status), as SO_PEERCRED
  std::uint32_t gid = 0;         //   would report them for a session of this process
  // Kubernetes: ids of allocation directories mounted into the process (/proc/<pid>/mountinfo:
  // the device plugin bind-mounts <alloc-root>/<id>/... into the container). The first one this
  // node knows makes it that allocation's tenant.
  std::vector<std::string> alloc_ids;
  std::string pod_uid;  // from /proc/<pid>/cgroup ("" outside a pod), for logs
};

std::optional<ProcessIdentity> read_process_identity(std::uint32_t pid, bool kubernetes) noexcept;

// The GPU's users as the kernel sees them, NVML or not (docs/daemon.md, "Memory outside vlake"):
// the pids other than `self` with a descriptor (/proc/<pid>/fd/*) whose target matches one of
// `files` (Driver::device_files(): a path, or a prefix ending in '*'), or, for an entry written
// "map:<path>", a mapping (/proc/<pid>/maps) of such a file; ascending. A process that exits,
// or whose tables cannot be read (not root), is skipped. No exceptions.
std::vector<std::uint32_t> device_file_users(const std::vector<std::string>& files, std::uint32_t self) noexcept;
// Whether a descriptor's target `target` (readlink text) matches `files` as above; a target
// with " (deleted)" appended matches like the path itself.
bool matches_device_file(std::string_view target, const std::vector<std::string>& files);

// (effective uid, effective gid) from /proc/<pid>/status text; nullopt when absent.
std::optional<std::pair<std::uint32_t, std::uint32_t>> parse_status_ids(std::string_view status);
// The pod UID in /proc/<pid>/cgroup text (cgroupfs ".../pod<uid>/<container>" or systemd
// "...-pod<uid with _>.slice/..."), with '-' separators; "" when not in a pod.
std::string pod_uid_from_cgroup(std::string_view cgroup);
// Allocation ids (16 hex digits, alloc::valid_id) of mounts whose source path ends in
// "<id>", "<id>/ld.so.preload" or "<id>/vlaked.sock" in /proc/<pid>/mountinfo text.
std::vector<std::string> alloc_ids_from_mountinfo(std::string_view mountinfo);

}  // namespace vlake::pool
