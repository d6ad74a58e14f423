#include "vlake/scheduler/inventory.hpp"

#include <cstring>

#include "vlake/allocation/allocation.hpp"

namespace vlake::scheduler {

DriverInventory::DriverInventory(const std::string& library) : driver_(open_driver(library)) {}

std::vector<GpuInfo> DriverInventory::enumerate() {
  std::vector<GpuInfo> out;
  const int n = driver_->device_count();
  for (int i = 0; i < n; ++i) {
    const DeviceOrdinal d{i};
    const auto u = driver_->device_uuid(d);
    std::uint8_t b[16];
    std::memcpy(b, u.data(), sizeof b);
    out.push_back(GpuInfo{i, alloc::format_uuid(b), driver_->total_memory(d)});
  }
  return out;
}

bool DriverInventory::check(const GpuInfo& gpu) noexcept {
  try {
    if (gpu.index >= driver_->device_count()) return false;
    const auto u = driver_->device_uuid(DeviceOrdinal{gpu.index});
    std::uint8_t b[16];
    std::memcpy(b, u.data(), sizeof b);
    return alloc::format_uuid(b) == gpu.uuid;
  } catch (...) {
    return false;
  }
}

}  // namespace vlake::scheduler
