#include "vlake/scheduler/inventory.hpp"

#include <cstring>

#include "vlake/contracts/allocation.hpp"

namespace vlake::scheduler {

DriverInventory::DriverInventory(const std::string& library) : driver_(open_driver(library)) {}

std::vector<GpuInfo> DriverInventory::enumerate() {
  std::vector<GpuInfo> out;
  const int n = driver_->device_count();
  for (int i = 0; i < n; ++i) {
    const DeviceOrdinal d{i};
    out.push_back(GpuInfo{i, driver_->device_uuid(d).to_string(), driver_->total_memory(d)});
  }
  return out;
}

bool DriverInventory::check(const GpuInfo& gpu) noexcept {
  try {
    if (gpu.index >= driver_->device_count()) return false;
    return driver_->device_uuid(DeviceOrdinal{gpu.index}).to_string() == gpu.uuid;
  } catch (...) {
    return false;
  }
}

}  // namespace vlake::scheduler
