// vlake::Driver — the seam between vlake and a GPU.
//
// What it is
//   The small set of GPU operations the pool daemon, the hook's helpers and the tests need:
//   physical memory as VMM handles, virtual address reservations, mappings and their access,
//   POSIX-fd export/import of handles, synchronous data movement, and two kernels (a 32-bit
//   fill whose accesses fault like any kernel's, and the dedup chunk hash). Everything is
//   expressed in vlake's strong types; nothing CUDA-specific leaks except the CUresult carried
//   by DriverError.
//
// Implementations
//   open_driver() binds a CUDA driver library at run time (dlopen, never linked): the real
//   libcuda.so.1, or sim/'s libcuda.so.1, which implements the same C ABI over host shared
//   memory. Both therefore stand behind this one interface, and tests/driver/ runs one
//   conformance suite against each.
//
// Semantics every implementation must have (measured on an H100, driver 580; the conformance
// suite checks each one):
//   - granularity() is the allocation unit; create/reserve/map sizes are multiples of it.
//   - A mapping covers a whole handle at offset 0: map() with a size other than the handle's
//     is rejected (CUDA_ERROR_NOT_SUPPORTED); unmap()/set_access() must cover whole mappings
//     (CUDA_ERROR_INVALID_VALUE otherwise); set_access() over several adjacent mappings is fine.
//   - A fresh mapping has no access until set_access().
//   - copy_*/fill_u8 (the copy engines) on memory that is unmapped, not accessible, or read-only
//     for a write fail with CUDA_ERROR_INVALID_VALUE and leave the context usable.
//   - fill_u32_kernel() on such memory makes synchronize() fail with CUDA_ERROR_ILLEGAL_ADDRESS,
//     and from then on every context operation of this process fails the same way (sticky);
//     VMM calls that need no context (create, map, ...) keep working; other processes are
//     unaffected.
//   - release() of a mapped handle keeps its memory until the last mapping goes.
//   - An exported fd imported in another process refers to the same memory, which lives as long
//     as any process holds a handle or mapping to it (the exporter may exit).
//   - Running out of device memory is CUDA_ERROR_OUT_OF_MEMORY.
//   - Host-located memory (create_host(), where host_memory_supported()): pinned host memory as a
//     VMM handle, released, exported, imported, retained, mapped and given device access like a
//     device handle; device d's copy engines and kernels reach a mapping of it that set_access()
//     opened to d (over PCIe, at its bandwidth). A VA range may be unmapped from a device handle
//     and mapped to a host handle at the same address (and back). It is not counted in any
//     device's memory (memory_info(), NVML). address_range() of it has the mapping's size but,
//     on driver 580 (measured on an H200), a base that is not its address.
//
// Contexts
//   VMM calls need no context. Operations that do (memory_info, copies, fills, synchronize)
//   use the calling thread's current context, or make the primary context of device 0 current
//   on that thread if it has none; memory_info(d) and make_current(d) make device d's primary
//   context current.
//
// Errors
//   Every failing driver call throws DriverError naming the call and its CUresult. Opening a
//   library that is missing, is not a CUDA driver, or whose cuInit fails throws DriverError too
//   (code() tells which: CUDA_ERROR_SHARED_OBJECT_INIT_FAILED for dlopen/dlsym problems).
//
// Thread-safety
//   All methods may be called concurrently; the driver library itself is thread-safe.
//
// Ownership
//   Handles and reservations are plain values: the caller releases them (release(),
//   free_reservation()). The Driver object must outlive every value obtained from it.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "vlake/common/chunk_hash.hpp"
#include "vlake/common/strong_types.hpp"
#include "vlake/common/unique_fd.hpp"
#include "vlake/common/uuid.hpp"

namespace vlake {

// A CUresult, without dragging cuda.h into every includer.
using DriverStatus = int;

class DriverError : public std::runtime_error {
 public:
  DriverError(DriverStatus code, const std::string& call, const std::string& detail = {});
  [[nodiscard]] DriverStatus code() const noexcept { return code_; }
  // What the failing call said beyond its status (dlerror()'s text for a library that does not
  // load); may be empty.
  [[nodiscard]] const std::string& detail() const noexcept { return detail_; }

 private:
  DriverStatus code_;
  std::string detail_;
};

struct PhysicalHandleTag {};
// A driver allocation handle (CUmemGenericAllocationHandle).
using PhysicalHandle = StrongId<PhysicalHandleTag, std::uint64_t>;
struct DevicePtrTag {};
// A device virtual address (CUdeviceptr).
using DevicePtr = StrongId<DevicePtrTag, std::uint64_t>;

[[nodiscard]] constexpr DevicePtr operator+(DevicePtr p, Bytes off) noexcept {
  return DevicePtr{p.value() + off.value()};
}

enum class Access : std::uint8_t { none, read, read_write };

struct MemoryInfo {
  Bytes free;
  Bytes total;
};

struct AddressRange {
  DevicePtr base;
  Bytes size;
};

class Driver {
 public:
  virtual ~Driver() = default;

  [[nodiscard]] virtual std::string name() const = 0;
  [[nodiscard]] virtual int device_count() const = 0;
  [[nodiscard]] virtual std::string device_name(DeviceOrdinal d) const = 0;
  [[nodiscard]] virtual Uuid device_uuid(DeviceOrdinal d) const = 0;
  [[nodiscard]] virtual Bytes total_memory(DeviceOrdinal d) const = 0;
  [[nodiscard]] virtual Bytes granularity(DeviceOrdinal d) const = 0;
  [[nodiscard]] virtual MemoryInfo memory_info(DeviceOrdinal d) = 0;
  // Makes device d's primary context current on the calling thread, as memory_info(d) does but
  // without its query (which the driver answers by looking at the whole device's usage).
  virtual void make_current(DeviceOrdinal d) { (void)memory_info(d); }

  // Physical memory: pinned device memory, exportable as a POSIX file descriptor.
  [[nodiscard]] virtual PhysicalHandle create(DeviceOrdinal d, Bytes size) = 0;
  virtual void release(PhysicalHandle h) = 0;
  [[nodiscard]] virtual UniqueFd export_fd(PhysicalHandle h) = 0;
  // Does not take ownership of `fd`; the caller may close it right after.
  [[nodiscard]] virtual PhysicalHandle import_fd(int fd) = 0;
  // A new reference to the handle mapped at `p` (release it like any handle).
  [[nodiscard]] virtual PhysicalHandle retain(DevicePtr p) = 0;

  // Host-located memory (driver >= 12.x, devices with
  // CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED). host_memory_supported(d):
  // device d can map and reach such memory (false when the query fails). create_host(): pinned
  // host memory of NUMA node 0 (CU_MEM_LOCATION_TYPE_HOST_NUMA), exportable as a POSIX file
  // descriptor; `size` a multiple of granularity() of any device. Released with release(); it is
  // not counted in memory_info(). Host memory running out is CUDA_ERROR_OUT_OF_MEMORY; the
  // default (a driver without it) throws CUDA_ERROR_NOT_SUPPORTED.
  [[nodiscard]] virtual bool host_memory_supported(DeviceOrdinal d) const {
    (void)d;
    return false;
  }
  [[nodiscard]] virtual PhysicalHandle create_host(Bytes size);

  // Virtual addresses.
  [[nodiscard]] virtual DevicePtr reserve(Bytes size, Bytes alignment) = 0;
  virtual void free_reservation(DevicePtr base, Bytes size) = 0;
  // Maps all of `h` at `at`. `offset` into the handle must be 0 on every driver vlake supports
  // (CUDA_ERROR_NOT_SUPPORTED otherwise); it is a parameter so the conformance suite can prove it.
  virtual void map(DevicePtr at, Bytes size, PhysicalHandle h, Bytes offset) = 0;
  void map(DevicePtr at, Bytes size, PhysicalHandle h) { map(at, size, h, Bytes{0}); }
  virtual void unmap(DevicePtr at, Bytes size) = 0;
  virtual void set_access(DevicePtr at, Bytes size, DeviceOrdinal d, Access a) = 0;
  [[nodiscard]] virtual Access access(DevicePtr p, DeviceOrdinal d) = 0;
  // The driver's own view: for VMM memory, the one mapping that contains `p`.
  [[nodiscard]] virtual AddressRange address_range(DevicePtr p) = 0;

  // Data movement, synchronous (the copy engines).
  virtual void copy_to_device(DevicePtr dst, const void* src, Bytes n) = 0;
  virtual void copy_to_host(void* dst, DevicePtr src, Bytes n) = 0;
  virtual void fill_u8(DevicePtr dst, std::uint8_t value, Bytes n) = 0;
  // Device-to-device copy (the copy engines), synchronous. The default bounces through host
  // memory in 2 MiB pieces (for drivers without cuMemcpyDtoD); the CUDA implementation copies on
  // the device.
  virtual void copy_device(DevicePtr dst, DevicePtr src, Bytes n);
  // Launches a kernel storing `value` into `count` 32-bit words at `dst` (4-byte aligned);
  // asynchronous like any launch: faults surface at synchronize().
  virtual void fill_u32_kernel(DevicePtr dst, std::uint32_t value, std::uint64_t count) = 0;
  // chunk_hash_reference() of the n bytes at `p` (n a multiple of 8, else DriverError
  // CUDA_ERROR_INVALID_VALUE), computed where the data is: the CUDA implementation launches
  // kernel vlake_hash_u64 (kHashBlocks x kHashBlockThreads threads, each folding its strided
  // words into one partial in a small device scratch buffer the Driver owns, one per context)
  // and reads back only the partials (8 KiB), so the range never crosses PCIe. Synchronous.
  // `p` must be mapped and readable by the device of the current context: otherwise the kernel
  // faults, the call throws CUDA_ERROR_ILLEGAL_ADDRESS and the context is poisoned (sticky, as
  // for fill_u32_kernel). Calls are serialized per Driver (they share the scratch buffer).
  // The default copies the range to the host in 2 MiB pieces and hashes it there.
  [[nodiscard]] virtual std::uint64_t hash_chunk(DevicePtr p, Bytes n);
  virtual void synchronize() = 0;

  // Process checkpoints (docs/swap.md): the GPU state of another process `pid` moved to host
  // memory and back by the driver's checkpoint API (cuCheckpointProcess*, driver >= 550).
  // lock_process blocks the process's CUDA calls and waits (up to `timeout_ms`; 0: no limit)
  // for the work it submitted; checkpoint_process copies its device memory to host memory and
  // releases it (and its context); restore_process brings it back (CUDA_ERROR_OUT_OF_MEMORY when
  // it does not fit: the process stays checkpointed); unlock_process lets it run again. Measured
  // on an H100, driver 580: memory the process imported from another process is released by the
  // checkpoint, but restore then fails with CUDA_ERROR_NOT_SUPPORTED and the process never runs
  // again; memory it allocated itself comes back intact. A call in the wrong state throws
  // CUDA_ERROR_ILLEGAL_STATE. Drivers without the API throw CUDA_ERROR_NOT_SUPPORTED;
  // checkpoint_supported() says so beforehand. These calls take seconds per GiB: never on a
  // latency-critical thread.
  enum class ProcessState : std::uint8_t { running, locked, checkpointed, failed };
  [[nodiscard]] virtual bool checkpoint_supported() const { return false; }
  [[nodiscard]] virtual ProcessState process_state(int pid);
  virtual void lock_process(int pid, unsigned timeout_ms);
  virtual void checkpoint_process(int pid);
  virtual void restore_process(int pid);
  virtual void unlock_process(int pid);

  // The files a process using these GPUs has open (docs/daemon.md, "Memory outside vlake"): a
  // path, or a prefix ending in '*'; "map:<path>" means a mapping of it rather than a descriptor.
  // The real driver: "map:/dev/nvidia*" (cuInit maps nvidiactl and nvidia<N>; NVML clients open
  // them but map none, so they are not GPU users); the simulator: its node file
  // "/dev/shm/vlake-sim-<node>", which every process attached to it keeps open. The default (a driver that cannot tell)
  // is none.
  [[nodiscard]] virtual std::vector<std::string> device_files() const { return {}; }
};

// Binds the CUDA driver library `library` (a soname searched the usual way, or a path) and
// initializes it. Throws DriverError if it cannot be loaded or initialized.
[[nodiscard]] std::unique_ptr<Driver> open_driver(const std::string& library = "libcuda.so.1");

}  // namespace vlake
