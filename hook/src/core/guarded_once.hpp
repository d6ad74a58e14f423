// One-time initialization that the initializer itself may re-enter (dlopen of the driver, or
// creating the state, calls back into the hook on the same thread).
// call_once_guarded(once, busy, init): runs `init` through `once` unless this thread is already
// inside it (`busy`, a thread_local flag of the caller's); returns false, running nothing, when
// re-entered. An exception from `init` is swallowed: std::call_once lets the next call try again.
// Thread-safety: as std::call_once; `busy` must be thread_local.
#pragma once

#include <mutex>

namespace vlake::hook {

inline bool call_once_guarded(std::once_flag& once, bool& busy, void (*init)()) noexcept {
  if (busy) return false;
  busy = true;
  try {
    std::call_once(once, init);
  } catch (...) {
  }
  busy = false;
  return true;
}

}  // namespace vlake::hook
