/* vlake/reclaim.h — giving a framework's cached GPU memory back when the node runs short
 * (docs/hook.md, "Reclaim").
 *
 * Frameworks cache freed GPU memory (PyTorch's caching allocator, CuPy's memory pool): to the
 * node it stays in use. A process registers a reclaim callback; when vlaked cannot serve another
 * tenant's allocation on a GPU, it asks the processes that can give memory back (lowest priority
 * and most idle first, never a higher-priority tenant than the one asking), and the hook calls
 * the callbacks; what the framework frees goes back to the pool, and the waiting allocation is
 * retried. python/vlake wraps this: vlake.torch.enable_reclaim(), vlake.cupy.enable_reclaim().
 *
 * libvlake-hook.so exports these functions; a process not running under the hook does not have
 * them: look them up with dlsym(RTLD_DEFAULT, "vlake_reclaim_register") and treat a missing
 * symbol as "vlake is not active".
 *
 * The callback: fn(ctx, device, bytes) — free cached memory on CUDA device `device` (the
 * ordinal in this process), `bytes` wanted (more may be freed: emptying the whole cache is
 * fine). It returns the bytes it freed as far as it knows (0 if it does not know); the hook only
 * logs the figure. It runs on the hook's own thread (`vlake-reclaim`), never on an application
 * thread and never while the hook holds a lock: it may call any CUDA function, and take the
 * interpreter lock (ctypes does so for Python callbacks). A callback that blocks delays only
 * later reclaims of this process.
 *
 * Thread-safety: both functions may be called from any thread. unregister() returns after any
 * call of that callback in progress has returned (do not call it from inside the callback).
 */
#ifndef VLAKE_RECLAIM_H
#define VLAKE_RECLAIM_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef uint64_t (*vlake_reclaim_fn)(void* ctx, int device, uint64_t bytes);

enum vlake_reclaim_status {
  VLAKE_RECLAIM_OK = 0,
  VLAKE_RECLAIM_NOT_VLAKE = 1, /* the hook is disabled (pass-through) in this process */
  VLAKE_RECLAIM_INVALID = 2,   /* fn is NULL; or unregister: not registered */
  VLAKE_RECLAIM_FULL = 3,      /* VLAKE_RECLAIM_MAX callbacks are registered already */
  VLAKE_RECLAIM_INTERNAL = 4   /* no thread could be started (see the hook's stderr line) */
};
#define VLAKE_RECLAIM_MAX 8

/* Registers (fn, ctx); the same pair twice counts once. 0 or a vlake_reclaim_status. */
int vlake_reclaim_register(vlake_reclaim_fn fn, void* ctx);
/* Removes (fn, ctx). 0 or a vlake_reclaim_status. */
int vlake_reclaim_unregister(vlake_reclaim_fn fn, void* ctx);
/* How many reclaims this process has run (each calls every registered callback once). */
uint64_t vlake_reclaim_count(void);

#ifdef __cplusplus
}
#endif

#endif /* VLAKE_RECLAIM_H */
