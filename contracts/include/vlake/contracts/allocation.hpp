// vlake::alloc — the allocation directory shared by the device plugin (writer) and vlaked
// (reader): docs/device-plugin.md, "Allocation directory".
//
//   <alloc-root>/<id>/allocation     written once at Allocate (key=value text, below)
//   <alloc-root>/<id>/owner          written on attribution (namespace, pod, container)
//   <alloc-root>/<id>/ld.so.preload  the hook path, mounted at /etc/ld.so.preload
//   <alloc-root>/<id>/vlaked.sock    vlaked's listening socket for this allocation
//
// Text format: one `key=value` per line, `version=1` first, unknown keys ignored, no spaces
// around `=`. Parsing throws FormatError naming the file and what is wrong; writing is atomic
// (a temporary file in the same directory, fsync, rename).
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

// Reads <dir>/<file>; nullopt if it does not exist. Throws FormatError when unreadable/invalid.
[[nodiscard]] std::optional<Allocation> read_allocation(const std::string& dir);
[[nodiscard]] std::optional<Owner> read_owner(const std::string& dir);
// Writes <dir>/<name> atomically with mode 0644. Throws std::system_error.
void write_file_atomic(const std::string& dir, const std::string& name, const std::string& content);
// Deletes a directory tree (files, sockets, one level of subdirectories are enough here).
// Returns false (errno kept) when something could not be removed; a missing dir is success.
bool remove_tree(const std::string& dir);

}  // namespace vlake::alloc
