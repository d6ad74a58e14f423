// vlake::alloc — the allocation directories shared by the device plugin (writer) and vlaked
// (reader): docs/device-plugin.md, "Allocation directory".
//
//   <alloc-root>/records/<id>.allocation  written once at Allocate (key=value text, below)
//   <alloc-root>/records/<id>.owner       written on attribution (namespace, pod, container)
//   <alloc-root>/<id>/ld.so.preload       the hook path, mounted at /etc/ld.so.preload
//   <alloc-root>/<id>/vlaked.sock         vlaked's listening socket for this allocation
//
// <alloc-root>/<id>/ is mounted (read-only) into the container; the records are not: they are
// the allocation's identity and size, and only root (the plugin) writes them. Directories of
// the older layout (`allocation` and `owner` inside <alloc-root>/<id>/, mounted read-write)
// are "legacy": their files are what a pod may have rewritten, so vlaked never reads them and
// the plugin reads them only to seal a record after checking it against the kubelet.
//
// Every read goes through read_bounded(): no symlink is followed, nothing but a regular file
// of at most kMaxRecordBytes is read, and a FIFO or device cannot block the caller.
//
// Text format: one `key=value` per line, `version=1` first, unknown keys ignored, no spaces
// around `=`. Parsing throws FormatError naming the file and what is wrong (quoted values are
// excerpts: bounded, one line); writing is atomic (a temporary file in the same directory,
// fsync, rename).
//
// This library links nothing but the C++ standard library (vlaked uses it; it must not pull
// gRPC in). Thread-safety: free functions, no shared state; the files are the only state.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "vlake/common/strong_types.hpp"
#include "vlake/common/uuid.hpp"

namespace vlake::alloc {

inline constexpr const char* kAllocationFile = "allocation";
inline constexpr const char* kOwnerFile = "owner";
inline constexpr const char* kPreloadFile = "ld.so.preload";
inline constexpr const char* kSocketFile = "vlaked.sock";
// <alloc-root>/records: the plugin's records, never mounted into a container.
inline constexpr const char* kRecordsDir = "records";
// The largest record (or legacy file) read; a larger one is refused without being read.
inline constexpr std::size_t kMaxRecordBytes = 4096;
inline constexpr std::uint32_t kFormatVersion = 1;
// Tenant names are stored in 128-byte fields (state.hpp kTenantNameBytes, NUL included).
inline constexpr std::size_t kMaxTenantName = 127;

class FormatError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct Allocation {
  std::string id;                       // 16 lowercase hex digits (valid_id)
  std::string gpu_uuid;                 // Uuid::to_string(): "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
  std::vector<std::string> device_ids;  // "<gpu_uuid>::<n>"
  Bytes bytes{0};                       // device_ids.size() * unit
  std::int64_t created = 0;             // unix seconds
};

struct Owner {
  std::string ns;  // Kubernetes namespace
  std::string pod;
  std::string container;
  friend bool operator==(const Owner&, const Owner&) = default;
};

// An allocation id as the plugin makes them: 16 characters of [0-9a-f]. Directories with
// other names under the alloc root are ignored by vlaked.
[[nodiscard]] bool valid_id(std::string_view id) noexcept;
// A fresh random id (getrandom).
[[nodiscard]] std::string new_id();

[[nodiscard]] std::string format_allocation(const Allocation& a);
[[nodiscard]] Allocation parse_allocation(const std::string& text, const std::string& what);
[[nodiscard]] std::string format_owner(const Owner& o);
[[nodiscard]] Owner parse_owner(const std::string& text, const std::string& what);

// "<uuid>::<n>" -> (uuid, n); nullopt when malformed.
[[nodiscard]] std::optional<std::pair<std::string, std::uint32_t>> split_device_id(std::string_view id);
[[nodiscard]] std::string device_id(const std::string& gpu_uuid, std::uint32_t n);

// The vlaked tenant of an allocation: "pod:<ns>/<pod>/<container>" with an owner, else
// "alloc:<id>". Longer than kMaxTenantName: the pod part is shortened and "~<8 hex of a hash
// of the full name>" appended, so distinct owners keep distinct names.
[[nodiscard]] std::string tenant_name(const std::string& id, const std::optional<Owner>& owner);
// The inverse for pod tenants (exporter labels): nullopt unless `name` starts with "pod:" and
// has two '/' (a shortened pod name keeps its "~hash" suffix).
[[nodiscard]] std::optional<Owner> owner_from_tenant_name(std::string_view name);

// Reads a file that someone else may have replaced: opened O_NONBLOCK|O_NOFOLLOW (a FIFO, a
// device or a symlink cannot block or redirect the read), fstat'd (only a regular file), at
// most `cap` bytes (a larger file is refused unread). nullopt when `path` does not exist;
// FormatError (naming the path and the reason) for anything else.
[[nodiscard]] std::optional<std::string> read_bounded(const std::string& path, std::size_t cap = kMaxRecordBytes);

// <root>/records, <root>/records/<id>.allocation, <root>/records/<id>.owner.
[[nodiscard]] std::string records_dir(const std::string& root);
[[nodiscard]] std::string allocation_record_name(const std::string& id);
[[nodiscard]] std::string owner_record_name(const std::string& id);
// The allocation's records under <root>/records; nullopt if absent. Throws FormatError when
// unreadable/invalid (read_bounded, parse_*), and when the allocation record names another id.
[[nodiscard]] std::optional<Allocation> read_allocation_record(const std::string& root, const std::string& id);
[[nodiscard]] std::optional<Owner> read_owner_record(const std::string& root, const std::string& id);
// Creates <root>/records (0755) if needed and writes the record atomically. Throws
// std::system_error.
void write_allocation_record(const std::string& root, const Allocation& a);
void write_owner_record(const std::string& root, const std::string& id, const Owner& o);
// Deletes both records of `id`; false (errno kept) when one could not be removed.
bool remove_records(const std::string& root, const std::string& id);

// The older layout's files <dir>/allocation and <dir>/owner (legacy directories: pod-writable,
// read only to seal a record). nullopt if absent; FormatError when unreadable/invalid.
[[nodiscard]] std::optional<Allocation> read_allocation(const std::string& dir);
[[nodiscard]] std::optional<Owner> read_owner(const std::string& dir);
// Writes <dir>/<name> atomically with mode 0644. Throws std::system_error.
void write_file_atomic(const std::string& dir, const std::string& name, const std::string& content);
// Deletes a directory tree (files, sockets, one level of subdirectories are enough here).
// Returns false (errno kept) when something could not be removed; a missing dir is success.
bool remove_tree(const std::string& dir);

}  // namespace vlake::alloc
