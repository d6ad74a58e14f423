// One figure of a tenant's record in a running vlaked's state segment, for tests that wait on
// it: `field` (a per-GPU array of TenantRecord: limit, nonpool, unhooked, ...) on GPU 0.
#pragma once

#include <cstdint>
#include <string>

#include "harness.hpp"

namespace vlake::pooltest {

// ~0 while the tenant has no record.
template <class PerGpu>
std::uint64_t tenant_gpu0(const std::string& state_name, const std::string& name, PerGpu state::TenantRecord::*field) {
  const auto snap = snapshot(state_name);
  const state::TenantRecord* t = tenant(*snap, name);
  return t == nullptr ? ~0ULL : (t->*field)[0];
}

}  // namespace vlake::pooltest
