// vlake::scheduler::Inventory — the node's GPUs as the device plugin offers them.
//
// enumerate() lists the GPUs (index, UUID, memory); check() answers whether one GPU still
// answers driver queries (health). DriverInventory does both through vlake::Driver (the real
// libcuda.so.1 or the simulator's). Errors: enumerate() throws (DriverError or
// std::runtime_error); check() never throws. Thread-safety: both may be called from any thread.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "vlake/common/driver.hpp"
#include "vlake/common/strong_types.hpp"

namespace vlake::scheduler {

struct GpuInfo {
  int index = 0;
  std::string uuid;  // "GPU-xxxxxxxx-..."
  Bytes total{0};
};

class Inventory {
 public:
  virtual ~Inventory() = default;
  [[nodiscard]] virtual std::vector<GpuInfo> enumerate() = 0;
  [[nodiscard]] virtual bool check(const GpuInfo& gpu) noexcept = 0;
};

class DriverInventory final : public Inventory {
 public:
  explicit DriverInventory(const std::string& library);  // throws DriverError
  std::vector<GpuInfo> enumerate() override;
  bool check(const GpuInfo& gpu) noexcept override;

 private:
  std::unique_ptr<Driver> driver_;
};

}  // namespace vlake::scheduler
