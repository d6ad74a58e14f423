// The reclaim C API (include/vlake/reclaim.h, docs/hook.md "Reclaim"): every entry point catches
// everything and returns a status.
#include "vlake/reclaim.h"

#include "hook.hpp"

// Reclaim callbacks (include/vlake/reclaim.h, docs/hook.md "Reclaim").
extern "C" {

__attribute__((visibility("default"))) int vlake_reclaim_register(vlake_reclaim_fn fn, void* ctx) {
  try {
    vlake::hook::State* s = vlake::hook::state();
    if (s == nullptr || s->passthrough) return VLAKE_RECLAIM_NOT_VLAKE;
    const int rc = s->reclaim.add(fn, ctx);
    // The worker reads Pressure and tells vlaked that this process can reclaim.
    if (rc == VLAKE_RECLAIM_OK) vlake::hook::start_worker(*s);
    return rc;
  } catch (...) {
    return VLAKE_RECLAIM_INTERNAL;
  }
}

__attribute__((visibility("default"))) int vlake_reclaim_unregister(vlake_reclaim_fn fn, void* ctx) {
  try {
    vlake::hook::State* s = vlake::hook::state();
    if (s == nullptr || s->passthrough) return VLAKE_RECLAIM_NOT_VLAKE;
    return s->reclaim.remove(fn, ctx);
  } catch (...) {
    return VLAKE_RECLAIM_INTERNAL;
  }
}

__attribute__((visibility("default"))) uint64_t vlake_reclaim_count(void) {
  vlake::hook::State* s = vlake::hook::state();
  return s == nullptr ? 0 : s->reclaim.runs();
}

}  // extern "C"
