// CUDA IPC of pool memory (docs/ipc.md): cuIpcGetMemHandle / cuIpcOpenMemHandle_v2 /
// cuIpcCloseMemHandle emulated through vlaked for served memory (VMM memory, which the driver's
// legacy IPC refuses). Other pointers and handles go to the driver.
//
// Contract
// - Export of a pointer inside a served allocation: IpcExport for its grant; the application's
//   CUipcMemHandle receives an IpcHandleBlob (magic, token, secret, offset = pointer − the
//   grant's VA base, bytes, GPU). The grant is then marked exported: freeing it releases it to
//   the daemon (never into the local reserve).
// - Open of a blob with the magic: IpcOpen, the descriptors imported, VA reserved, each piece
//   mapped (read-only pieces read-only), access set for the memory's GPU and the current
//   context's GPU; returns base + offset. The same token opened again in this process returns
//   the same pointer (reference counted). A blob this process exported itself is refused with
//   CUDA_ERROR_INVALID_CONTEXT (docs/ipc.md: the driver's answer to be measured).
// - Close of a pointer inside an import: one reference less; at zero unmapped, released and
//   IpcClose sent.
// - Thread-safety: every function may be called from any thread. Lock order: the open mutex,
//   the daemon connection, then the import table.
#pragma once

#include <cstdint>
#include <optional>

#include "hook.hpp"

namespace vlake::hook::ipc {

// True if grant `grant_id` of this process was exported (it must not enter the local reserve).
[[nodiscard]] bool exported(std::uint64_t grant_id);
// The grant ends (released to the daemon): forgets its export.
void forget(std::uint64_t grant_id);

// The imported range containing `addr`: (base, bytes) of the mapping cuIpcOpenMemHandle made.
struct Range {
  std::uint64_t base = 0;
  std::uint64_t bytes = 0;
};
[[nodiscard]] std::optional<Range> imported(std::uint64_t addr);
// Open imports in this process (tests, introspection).
[[nodiscard]] std::size_t imports();

// fork(): held across it (prepare/parent); the child forgets every import and export.
void lock_all() noexcept;
void unlock_all() noexcept;
void clear_after_fork() noexcept;

}  // namespace vlake::hook::ipc
