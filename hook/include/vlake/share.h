/* vlake/share.h — sharing read-only data (model weights) across tenants (docs/dedup.md).
 *
 * libvlake-hook.so (preloaded into every tenant process) exports these functions. A process
 * that is not running under the hook does not have them: look them up with dlsym(RTLD_DEFAULT,
 * "vlake_share_readonly") (or ctypes.CDLL(None) in Python, see python/vlake/) and treat a missing
 * symbol as "vlake is not active".
 *
 * vlake_share_readonly(ptr, bytes): the whole chunks (vlake_share_chunk_bytes(), 2 MiB on current
 * GPUs) of [ptr, ptr + bytes) — which must lie inside one allocation obtained through the hook
 * (cudaMalloc / cuMemAlloc / cuMemAllocAsync) — become read-only and are stored once per GPU
 * for all tenants that share the same bytes. It waits for the work queued in the allocation's
 * context (a synchronize), then the node daemon hashes every chunk, confirms candidates with a
 * full byte compare, and the hook maps the shared chunks read-only at the same addresses. The
 * partial chunks at both edges of the range stay private and writable. The call returns after
 * the range is shared, or with an error and the allocation exactly as it was.
 *
 * Lifetime: the range stays shared and read-only until the allocation is freed (cudaFree /
 * cuMemFree); there is no way back to private memory short of copying into a new allocation.
 * A kernel that writes into a shared range faults (CUDA_ERROR_ILLEGAL_ADDRESS, which ends this
 * process's CUDA context; reported to vlaked as a guard event of kind `readonly`); a copy or
 * memset into it fails with CUDA_ERROR_INVALID_VALUE. Other tenants are never affected.
 *
 * Accounting: the tenant stays charged the logical bytes of its allocation (docs/dedup.md).
 *
 * Thread-safety: may be called from any thread; the allocation must not be freed, and no work
 * may be queued on it from another thread, while the call runs.
 */
#ifndef VLAKE_SHARE_H
#define VLAKE_SHARE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum vlake_share_status {
  VLAKE_SHARE_OK = 0,
  VLAKE_SHARE_NOT_VLAKE = 1,   /* ptr is not in an allocation served by vlake (or the hook is disabled) */
  VLAKE_SHARE_INVALID = 2,     /* the range leaves its allocation, or is empty */
  VLAKE_SHARE_UNREACHABLE = 3, /* vlaked cannot be reached */
  VLAKE_SHARE_REFUSED = 4,     /* vlaked refused: allocation shared already, or guard canary mode */
  VLAKE_SHARE_NO_MEMORY = 5,   /* no GPU memory for the temporary copies */
  VLAKE_SHARE_DRIVER = 6,      /* a driver call failed; the old mapping is back */
  VLAKE_SHARE_FAULTED = 7,     /* the allocation's context has a sticky error (synchronize failed) */
  VLAKE_SHARE_INTERNAL = 8     /* anything else (see the hook's stderr line) */
};

struct vlake_share_result {
  uint64_t chunk_bytes;  /* the chunk size used */
  uint64_t shared_bytes; /* bytes of the range now shared read-only (whole chunks) */
  uint64_t merged_bytes; /* of those, chunks another allocation (any tenant) already held */
  uint64_t copied_bytes; /* bytes the daemon copied into new private chunks (edges, rest) */
};

/* 0 (VLAKE_SHARE_OK) or a vlake_share_status. */
int vlake_share_readonly(const void* ptr, size_t bytes);
/* The same; fills *out (may be NULL) on success. */
int vlake_share_readonly_ex(const void* ptr, size_t bytes, struct vlake_share_result* out);
/* The chunk size of the current context's GPU (0 if there is no context). Place large tensors
 * at multiples of it (relative to their allocation's start, which vlake aligns) so that whole
 * chunks of two processes hold the same bytes. */
size_t vlake_share_chunk_bytes(void);
/* A static English text for a status. */
const char* vlake_share_strerror(int status);

#ifdef __cplusplus
}
#endif

#endif /* VLAKE_SHARE_H */
