// Driver implementation over a CUDA driver library loaded at run time (real or simulated).
#include <dlfcn.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "kernels_ptx.hpp"
#include "vlake/common/cuda_api.hpp"
#include "vlake/common/driver.hpp"

namespace vlake {

DriverError::DriverError(DriverStatus code, const std::string& call, const std::string& detail)
    : std::runtime_error(call + " failed: " + std::to_string(code) + (detail.empty() ? std::string() : " " + detail)),
      code_(code),
      detail_(detail) {}

void Driver::copy_device(DevicePtr dst, DevicePtr src, Bytes n) {
  constexpr std::uint64_t kPiece = 2ull << 20;
  std::vector<std::uint8_t> buf(static_cast<std::size_t>(std::min<std::uint64_t>(n.value(), kPiece)));
  for (std::uint64_t done = 0; done < n.value();) {
    const std::uint64_t k = std::min<std::uint64_t>(kPiece, n.value() - done);
    copy_to_host(buf.data(), DevicePtr{src.value() + done}, Bytes{k});
    copy_to_device(DevicePtr{dst.value() + done}, buf.data(), Bytes{k});
    done += k;
  }
}

PhysicalHandle Driver::create_host(Bytes) {
  throw DriverError(CUDA_ERROR_NOT_SUPPORTED, "cuMemCreate", "host-located memory");
}

namespace {
[[noreturn]] void no_checkpoints(const char* call) {
  throw DriverError(CUDA_ERROR_NOT_SUPPORTED, call, "this driver has no process checkpoint API");
}
}  // namespace

Driver::ProcessState Driver::process_state(int) { no_checkpoints("cuCheckpointProcessGetState"); }
void Driver::lock_process(int, unsigned) { no_checkpoints("cuCheckpointProcessLock"); }
void Driver::checkpoint_process(int) { no_checkpoints("cuCheckpointProcessCheckpoint"); }
void Driver::restore_process(int) { no_checkpoints("cuCheckpointProcessRestore"); }
void Driver::unlock_process(int) { no_checkpoints("cuCheckpointProcessUnlock"); }

std::uint64_t Driver::hash_chunk(DevicePtr p, Bytes n) {
  if (n.value() % 8 != 0) {
    throw DriverError(CUDA_ERROR_INVALID_VALUE, "hash_chunk", "size is not a multiple of 8");
  }
  constexpr std::uint64_t kPiece = 2ull << 20;  // a multiple of 8 * kHashThreads
  static_assert(kPiece % (8ull * kHashThreads) == 0);
  std::vector<std::uint8_t> buf(static_cast<std::size_t>(std::min<std::uint64_t>(n.value(), kPiece)));
  std::vector<std::uint64_t> partials(kHashThreads);
  for (unsigned t = 0; t < kHashThreads; ++t) partials[t] = chunk_hash_seed(t);
  for (std::uint64_t done = 0; done < n.value();) {
    const std::uint64_t k = std::min<std::uint64_t>(kPiece, n.value() - done);
    copy_to_host(buf.data(), DevicePtr{p.value() + done}, Bytes{k});
    // Pieces start at word multiples of kHashThreads, so word j of a piece is lane j % kHashThreads.
    for (std::uint64_t j = 0; j < k / 8; ++j) {
      std::uint64_t w;
      std::memcpy(&w, buf.data() + j * 8, 8);
      auto& acc = partials[static_cast<std::size_t>(j % kHashThreads)];
      acc = chunk_hash_step(acc, w);
    }
    done += k;
  }
  return chunk_hash_finish(partials.data(), n.value());
}

namespace {

using cuda::CudaApi;

CUmemAllocationProp pinned_device_prop(DeviceOrdinal d) {
  CUmemAllocationProp p{};
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = d.value();
  p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return p;
}

// Pinned host memory of NUMA node 0, as a VMM handle.
CUmemAllocationProp pinned_host_prop() {
  CUmemAllocationProp p{};
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
  p.location.id = 0;
  p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return p;
}

CUmemAccess_flags to_flags(Access a) {
  switch (a) {
    case Access::none: return CU_MEM_ACCESS_FLAGS_PROT_NONE;
    case Access::read: return CU_MEM_ACCESS_FLAGS_PROT_READ;
    case Access::read_write: return CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  }
  return CU_MEM_ACCESS_FLAGS_PROT_NONE;
}

class CudaDriver final : public Driver {
 public:
  explicit CudaDriver(const std::string& library) : library_(library) {
    dl_ = ::dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (dl_ == nullptr) {
      const char* err = ::dlerror();
      throw DriverError(CUDA_ERROR_SHARED_OBJECT_INIT_FAILED, "dlopen(" + library + ")", err != nullptr ? err : "");
    }
    std::vector<std::string> missing;
#define VLAKE_CU_API(base, symbol, version)                                       \
  api_.symbol = reinterpret_cast<PFN_##base##_v##version>(::dlsym(dl_, #symbol)); \
  if (api_.symbol == nullptr) missing.emplace_back(#symbol);
#define VLAKE_CU_API_OPTIONAL(base, symbol, version) \
  api_.symbol = reinterpret_cast<PFN_##base##_v##version>(::dlsym(dl_, #symbol));
#include "vlake/common/cuda_api.def"
#undef VLAKE_CU_API_OPTIONAL
#undef VLAKE_CU_API
    if (!missing.empty()) {
      std::string names;
      for (const auto& m : missing) names += (names.empty() ? "" : ", ") + m;
      ::dlclose(dl_);
      throw DriverError(CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND, library, "lacks driver entry points: " + names);
    }
    check(api_.cuInit(0), "cuInit");
    int count = 0;
    check(api_.cuDeviceGetCount(&count), "cuDeviceGetCount");
    devices_.resize(static_cast<std::size_t>(count));
    for (int i = 0; i < count; ++i) {
      check(api_.cuDeviceGet(&devices_[static_cast<std::size_t>(i)], i), "cuDeviceGet");
    }
  }

  CudaDriver(const CudaDriver&) = delete;
  CudaDriver& operator=(const CudaDriver&) = delete;
  // The library stays loaded: driver state (contexts, mappings) must outlive static destructors
  // of users that still hold handles, exactly like a linked libcuda.
  ~CudaDriver() override = default;

  std::string name() const override { return library_; }

  bool checkpoint_supported() const override {
    return api_.cuCheckpointProcessGetState != nullptr && api_.cuCheckpointProcessLock != nullptr &&
           api_.cuCheckpointProcessCheckpoint != nullptr && api_.cuCheckpointProcessRestore != nullptr &&
           api_.cuCheckpointProcessUnlock != nullptr;
  }
  ProcessState process_state(int pid) override {
    if (!checkpoint_supported()) return Driver::process_state(pid);
    CUprocessState st = CU_PROCESS_STATE_RUNNING;
    check(api_.cuCheckpointProcessGetState(pid, &st), "cuCheckpointProcessGetState");
    switch (st) {
      case CU_PROCESS_STATE_RUNNING: return ProcessState::running;
      case CU_PROCESS_STATE_LOCKED: return ProcessState::locked;
      case CU_PROCESS_STATE_CHECKPOINTED: return ProcessState::checkpointed;
      default: return ProcessState::failed;
    }
  }
  void lock_process(int pid, unsigned timeout_ms) override {
    if (!checkpoint_supported()) Driver::lock_process(pid, timeout_ms);
    CUcheckpointLockArgs args{};
    args.timeoutMs = timeout_ms;
    check(api_.cuCheckpointProcessLock(pid, &args), "cuCheckpointProcessLock");
  }
  void checkpoint_process(int pid) override {
    if (!checkpoint_supported()) Driver::checkpoint_process(pid);
    check(api_.cuCheckpointProcessCheckpoint(pid, nullptr), "cuCheckpointProcessCheckpoint");
  }
  void restore_process(int pid) override {
    if (!checkpoint_supported()) Driver::restore_process(pid);
    check(api_.cuCheckpointProcessRestore(pid, nullptr), "cuCheckpointProcessRestore");
  }
  void unlock_process(int pid) override {
    if (!checkpoint_supported()) Driver::unlock_process(pid);
    check(api_.cuCheckpointProcessUnlock(pid, nullptr), "cuCheckpointProcessUnlock");
  }

  std::vector<std::string> device_files() const override {
    // The simulator names its node file. On the real driver, cuInit maps /dev/nvidiactl and
    // /dev/nvidia<N> into the process (measured on the H100, even without a context); NVML
    // clients (nvidia-smi, exporters, this daemon's sampler) open those files, and
    // /dev/nvidia-uvm, but map none of them, so they are not taken for GPU users.
    using DeviceFile = const char* (*)() noexcept;
    if (auto f = reinterpret_cast<DeviceFile>(::dlsym(dl_, "vlake_sim_device_file")); f != nullptr) {
      const std::string file = f();
      return file.empty() ? std::vector<std::string>{} : std::vector<std::string>{file};
    }
    return {"map:/dev/nvidia*"};
  }
  int device_count() const override { return static_cast<int>(devices_.size()); }

  std::string device_name(DeviceOrdinal d) const override {
    char buf[256] = {};
    check(api_.cuDeviceGetName(buf, sizeof buf, device(d)), "cuDeviceGetName");
    return buf;
  }

  Uuid device_uuid(DeviceOrdinal d) const override {
    CUuuid u{};
    check(api_.cuDeviceGetUuid_v2(&u, device(d)), "cuDeviceGetUuid_v2");
    return Uuid::from_bytes(u.bytes);
  }

  Bytes total_memory(DeviceOrdinal d) const override {
    std::size_t total = 0;
    check(api_.cuDeviceTotalMem_v2(&total, device(d)), "cuDeviceTotalMem_v2");
    return Bytes{total};
  }

  Bytes granularity(DeviceOrdinal d) const override {
    const CUmemAllocationProp p = pinned_device_prop(d);
    std::size_t g = 0;
    check(api_.cuMemGetAllocationGranularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
          "cuMemGetAllocationGranularity");
    return Bytes{g};
  }

  void make_current(DeviceOrdinal d) override { bind(d); }

  MemoryInfo memory_info(DeviceOrdinal d) override {
    bind(d);
    std::size_t free = 0;
    std::size_t total = 0;
    check(api_.cuMemGetInfo_v2(&free, &total), "cuMemGetInfo_v2");
    return MemoryInfo{Bytes{free}, Bytes{total}};
  }

  PhysicalHandle create(DeviceOrdinal d, Bytes size) override {
    const CUmemAllocationProp p = pinned_device_prop(d);
    CUmemGenericAllocationHandle h = 0;
    check(api_.cuMemCreate(&h, size.value(), &p, 0), "cuMemCreate");
    return PhysicalHandle{h};
  }

  bool host_memory_supported(DeviceOrdinal d) const override {
    if (d.value() < 0 || static_cast<std::size_t>(d.value()) >= devices_.size()) return false;
    int v = 0;
    return api_.cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                                     devices_[static_cast<std::size_t>(d.value())]) == CUDA_SUCCESS &&
           v != 0;
  }

  PhysicalHandle create_host(Bytes size) override {
    const CUmemAllocationProp p = pinned_host_prop();
    CUmemGenericAllocationHandle h = 0;
    check(api_.cuMemCreate(&h, size.value(), &p, 0), "cuMemCreate(host)");
    return PhysicalHandle{h};
  }

  void release(PhysicalHandle h) override { check(api_.cuMemRelease(h.value()), "cuMemRelease"); }

  UniqueFd export_fd(PhysicalHandle h) override {
    int fd = -1;
    check(api_.cuMemExportToShareableHandle(&fd, h.value(), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
          "cuMemExportToShareableHandle");
    return UniqueFd(fd);
  }

  PhysicalHandle import_fd(int fd) override {
    CUmemGenericAllocationHandle h = 0;
    // The POSIX-fd handle type passes the descriptor itself in the pointer argument.
    void* os_handle = reinterpret_cast<void*>(static_cast<std::intptr_t>(fd));
    check(api_.cuMemImportFromShareableHandle(&h, os_handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
          "cuMemImportFromShareableHandle");
    return PhysicalHandle{h};
  }

  PhysicalHandle retain(DevicePtr p) override {
    CUmemGenericAllocationHandle h = 0;
    check(api_.cuMemRetainAllocationHandle(&h, reinterpret_cast<void*>(p.value())), "cuMemRetainAllocationHandle");
    return PhysicalHandle{h};
  }

  DevicePtr reserve(Bytes size, Bytes alignment) override {
    CUdeviceptr p = 0;
    check(api_.cuMemAddressReserve(&p, size.value(), alignment.value(), 0, 0), "cuMemAddressReserve");
    return DevicePtr{p};
  }

  void free_reservation(DevicePtr base, Bytes size) override {
    check(api_.cuMemAddressFree(base.value(), size.value()), "cuMemAddressFree");
  }

  using Driver::map;
  void map(DevicePtr at, Bytes size, PhysicalHandle h, Bytes offset) override {
    check(api_.cuMemMap(at.value(), size.value(), offset.value(), h.value(), 0), "cuMemMap");
  }

  void unmap(DevicePtr at, Bytes size) override { check(api_.cuMemUnmap(at.value(), size.value()), "cuMemUnmap"); }

  void set_access(DevicePtr at, Bytes size, DeviceOrdinal d, Access a) override {
    CUmemAccessDesc desc{};
    desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    desc.location.id = d.value();
    desc.flags = to_flags(a);
    check(api_.cuMemSetAccess(at.value(), size.value(), &desc, 1), "cuMemSetAccess");
  }

  Access access(DevicePtr p, DeviceOrdinal d) override {
    CUmemLocation loc{};
    loc.type = CU_MEM_LOCATION_TYPE_DEVICE;
    loc.id = d.value();
    unsigned long long flags = 0;
    check(api_.cuMemGetAccess(&flags, &loc, p.value()), "cuMemGetAccess");
    if (flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE) return Access::read_write;
    if (flags == CU_MEM_ACCESS_FLAGS_PROT_READ) return Access::read;
    return Access::none;
  }

  AddressRange address_range(DevicePtr p) override {
    CUdeviceptr base = 0;
    std::size_t size = 0;
    bind_default();
    check(api_.cuMemGetAddressRange_v2(&base, &size, p.value()), "cuMemGetAddressRange_v2");
    return AddressRange{DevicePtr{base}, Bytes{size}};
  }

  void copy_to_device(DevicePtr dst, const void* src, Bytes n) override {
    bind_default();
    check(api_.cuMemcpyHtoD_v2(dst.value(), src, n.value()), "cuMemcpyHtoD_v2");
  }

  void copy_to_host(void* dst, DevicePtr src, Bytes n) override {
    bind_default();
    check(api_.cuMemcpyDtoH_v2(dst, src.value(), n.value()), "cuMemcpyDtoH_v2");
  }

  void copy_device(DevicePtr dst, DevicePtr src, Bytes n) override {
    bind_default();
    check(api_.cuMemcpyDtoD_v2(dst.value(), src.value(), n.value()), "cuMemcpyDtoD_v2");
  }

  void fill_u8(DevicePtr dst, std::uint8_t value, Bytes n) override {
    bind_default();
    check(api_.cuMemsetD8_v2(dst.value(), value, n.value()), "cuMemsetD8_v2");
  }

  void fill_u32_kernel(DevicePtr dst, std::uint32_t value, std::uint64_t count) override {
    bind_default();
    CUfunction fn = kernel(fill_fn_, detail::kFillU32Kernel);
    CUdeviceptr p = dst.value();
    unsigned long long n = count;
    unsigned v = value;
    void* args[] = {&p, &n, &v};
    const unsigned blocks = static_cast<unsigned>(std::clamp<std::uint64_t>((count + 255) / 256, 1, 1024));
    check(api_.cuLaunchKernel(fn, blocks, 1, 1, 256, 1, 1, 0, nullptr, args, nullptr),
          "cuLaunchKernel(vlake_fill_u32)");
  }

  std::uint64_t hash_chunk(DevicePtr p, Bytes n) override {
    if (n.value() % 8 != 0) {
      throw DriverError(CUDA_ERROR_INVALID_VALUE, "hash_chunk", "size is not a multiple of 8");
    }
    bind_default();
    CUcontext ctx = nullptr;
    check(api_.cuCtxGetCurrent(&ctx), "cuCtxGetCurrent");
    // Run on the device that holds `p` (its primary context, pushed for this call) when the
    // current context belongs to another one: that device need not have access to `p`.
    int owner = -1;
    if (n.value() != 0 &&
        api_.cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p.value()) == CUDA_SUCCESS &&
        owner >= 0 && static_cast<std::size_t>(owner) < devices_.size()) {
      CUdevice cur = 0;
      check(api_.cuCtxGetDevice(&cur), "cuCtxGetDevice");
      if (cur != device(DeviceOrdinal{owner})) {
        CUcontext other = primary(DeviceOrdinal{owner});
        check(api_.cuCtxPushCurrent_v2(other), "cuCtxPushCurrent_v2");
        struct Pop {
          const CudaApi& api;
          ~Pop() {
            CUcontext popped = nullptr;
            (void)api.cuCtxPopCurrent_v2(&popped);
          }
        } pop{api_};
        return hash_in(other, p, n);
      }
    }
    return hash_in(ctx, p, n);
  }

  // hash_chunk in context `ctx`, which is current.
  std::uint64_t hash_in(CUcontext ctx, DevicePtr p, Bytes n) {
    std::lock_guard lock(hash_mu_);
    CUfunction fn = kernel(hash_fn_, detail::kHashU64Kernel);
    CUdeviceptr& scratch = hash_scratch_[ctx];
    if (scratch == 0) {
      check(api_.cuMemAlloc_v2(&scratch, sizeof(std::uint64_t) * kHashThreads), "cuMemAlloc_v2(hash scratch)");
    }
    CUdeviceptr src = p.value();
    unsigned long long words = n.value() / 8;
    CUdeviceptr out = scratch;
    void* args[] = {&src, &words, &out};
    check(api_.cuLaunchKernel(fn, kHashBlocks, 1, 1, kHashBlockThreads, 1, 1, 0, nullptr, args, nullptr),
          "cuLaunchKernel(vlake_hash_u64)");
    std::array<std::uint64_t, kHashThreads> partials{};
    // Same (legacy) stream: waits for the kernel; a fault in it surfaces here.
    check(api_.cuMemcpyDtoH_v2(partials.data(), scratch, sizeof partials), "cuMemcpyDtoH_v2(hash partials)");
    return chunk_hash_finish(partials.data(), n.value());
  }

  void synchronize() override {
    bind_default();
    check(api_.cuCtxSynchronize(), "cuCtxSynchronize");
  }

 private:
  void check(CUresult r, const char* call) const {
    if (r == CUDA_SUCCESS) return;
    const char* name = nullptr;
    if (api_.cuGetErrorName != nullptr) api_.cuGetErrorName(r, &name);
    throw DriverError(static_cast<DriverStatus>(r), call, name != nullptr ? name : "");
  }

  CUdevice device(DeviceOrdinal d) const {
    if (d.value() < 0 || static_cast<std::size_t>(d.value()) >= devices_.size()) {
      throw DriverError(CUDA_ERROR_INVALID_DEVICE, "device ordinal " + std::to_string(d.value()));
    }
    return devices_[static_cast<std::size_t>(d.value())];
  }

  // Makes device d's primary context current on this thread.
  void bind(DeviceOrdinal d) {
    CUcontext ctx = primary(d);
    CUcontext current = nullptr;
    check(api_.cuCtxGetCurrent(&current), "cuCtxGetCurrent");
    if (current != ctx) check(api_.cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
  }

  // Keeps the thread's current context, or binds device 0's primary context.
  void bind_default() {
    CUcontext current = nullptr;
    check(api_.cuCtxGetCurrent(&current), "cuCtxGetCurrent");
    if (current == nullptr) check(api_.cuCtxSetCurrent(primary(DeviceOrdinal{0})), "cuCtxSetCurrent");
  }

  CUcontext primary(DeviceOrdinal d) {
    std::lock_guard lock(mu_);
    if (primaries_.empty()) primaries_.assign(devices_.size(), nullptr);
    auto& slot = primaries_.at(static_cast<std::size_t>(d.value()));
    if (slot == nullptr) check(api_.cuDevicePrimaryCtxRetain(&slot, device(d)), "cuDevicePrimaryCtxRetain");
    return slot;
  }

  // Loads the kernels' module on first use (in the context current then) and resolves `name`
  // into `slot` once.
  CUfunction kernel(CUfunction& slot, const char* name) {
    std::lock_guard lock(mu_);
    if (module_ == nullptr) check(api_.cuModuleLoadData(&module_, detail::kKernelsPtx), "cuModuleLoadData");
    if (slot == nullptr) check(api_.cuModuleGetFunction(&slot, module_, name), "cuModuleGetFunction");
    return slot;
  }

  std::string library_;
  void* dl_ = nullptr;
  CudaApi api_;
  std::vector<CUdevice> devices_;
  std::mutex mu_;
  std::vector<CUcontext> primaries_;
  CUmodule module_ = nullptr;
  CUfunction fill_fn_ = nullptr;
  CUfunction hash_fn_ = nullptr;
  std::mutex hash_mu_;                             // serializes hash_chunk (one scratch per context)
  std::map<CUcontext, CUdeviceptr> hash_scratch_;  // guarded by hash_mu_; kept for the process's life
};

}  // namespace

std::unique_ptr<Driver> open_driver(const std::string& library) { return std::make_unique<CudaDriver>(library); }

}  // namespace vlake
