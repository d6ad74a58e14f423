// What the dlsym override needs to know about the hook's exported wrappers.
//
// Contract
// - find_interposed(name) returns the wrapper the hook substitutes for `name` (an intercepted
//   cu* symbol of hooked.def, an exported _ptsz variant, cuGetProcAddress(_v2), or an
//   intercepted nvml* symbol), with the function that records the real function the library
//   lookup returned; nullptr for every other name. Thread-safe (immutable tables).
#pragma once

namespace vlake::hook {

struct Interposed {
  const char* name;
  void* wrapper;
  void (*remember)(void* real, bool ptds) noexcept;
  bool ptds;
  bool nvml;  // lives in libnvidia-ml (else libcuda)
};

[[nodiscard]] const Interposed* find_interposed(const char* name) noexcept;
[[nodiscard]] const Interposed* find_nvml_interposed(const char* name) noexcept;  // nvml.cpp

}  // namespace vlake::hook
