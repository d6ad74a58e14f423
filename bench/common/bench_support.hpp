// Shared pieces of the vlake benchmarks (bench/): the driver bound at run time, latency
// summaries, lists of sizes, a small JSON builder and a wall-clock start barrier. Single sizes
// are read and printed with vlake's one size grammar (vlake/common/size.hpp).
//
// The benchmarks reach the driver exactly like an application that loads libcuda itself:
// dlopen("libcuda.so.1") (or --driver PATH) and dlsym of each entry point. Under
// LD_PRELOAD=libvlake-hook.so those lookups return the hook's wrappers (docs/hook.md), so the
// same binary measures the native driver, the hook's warm path and its cold path.
//
// Thread-safety: a CudaApi is immutable after construction and may be shared; the rest are
// plain values. Errors: constructors throw std::runtime_error with a message; size parsing
// throws vlake::SizeError (a std::invalid_argument).
#pragma once

#include <cuda.h>

#include <cstdint>
#include <iostream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "vlake/common/size.hpp"
#include "vlake/common/strong_types.hpp"

namespace vlake::bench {

// The driver entry points the benchmarks use, resolved once.
class CudaApi {
 public:
  // dlopens `library` (RTLD_NOW | RTLD_LOCAL) and resolves the entry points; throws on failure.
  explicit CudaApi(const std::string& library = "libcuda.so.1");
  ~CudaApi();
  CudaApi(const CudaApi&) = delete;
  CudaApi& operator=(const CudaApi&) = delete;

  // cuInit, cuDeviceGet, primary context retain + make current on the calling thread; throws
  // with the CUresult's name on failure.
  void init_context(DeviceOrdinal device) const;

  CUresult (*mem_alloc)(CUdeviceptr*, size_t) = nullptr;  // cuMemAlloc_v2
  CUresult (*mem_free)(CUdeviceptr) = nullptr;            // cuMemFree_v2

  // The simulator's per-process counters (docs/simulator.md); absent on a real driver.
  [[nodiscard]] bool has_call_counts() const noexcept { return vmm_count_ != nullptr; }
  // vlake_sim_vmm_call_count(), or 0 without the simulator.
  [[nodiscard]] unsigned long long vmm_calls() const noexcept;
  // vlake_sim_call_count(entry), or 0 without the simulator.
  [[nodiscard]] unsigned long long calls(const char* entry) const noexcept;
  [[nodiscard]] std::string error_name(CUresult rc) const;

  // Any other entry point, typed by its cudaTypedefs.h PFN type (e.g. PFN_cuLaunchKernel_v4000);
  // throws std::runtime_error when the driver lacks it.
  template <class Pfn>
  [[nodiscard]] Pfn entry(const char* name) const {
    return reinterpret_cast<Pfn>(symbol(name));
  }
  // Throws std::runtime_error naming the call with the CUresult's name when rc is not success.
  void check(CUresult rc, const char* what) const;

 private:
  [[nodiscard]] void* symbol(const char* name) const;
  void* handle_ = nullptr;
  CUresult (*init_)(unsigned) = nullptr;
  CUresult (*device_get_)(CUdevice*, int) = nullptr;
  CUresult (*retain_)(CUcontext*, CUdevice) = nullptr;
  CUresult (*set_current_)(CUcontext) = nullptr;
  CUresult (*error_name_)(CUresult, const char**) = nullptr;
  unsigned long long (*vmm_count_)() = nullptr;
  unsigned long long (*call_count_)(const char*) = nullptr;
};

// Latency summary of a sample set (microseconds). Percentiles: nearest rank on the sorted set.
struct Summary {
  std::size_t n = 0;
  double p50 = 0;
  double p90 = 0;
  double p99 = 0;
  double mean = 0;
  double min = 0;
  double max = 0;
  std::size_t over_100us = 0;  // samples of 100 us or more (the cold path's share)
};
Summary summarize(std::vector<double> samples_us);
double percentile(const std::vector<double>& sorted, double p);

// An option's whole-number value in [lo, hi]; throws std::invalid_argument
// "<opt> must be a number lo..hi, got '<v>'" otherwise.
long parse_number(const std::string& opt, const std::string& v, long lo, long hi);

// Comma-separated sizes ("2MiB,1GiB"), each in vlake's size grammar (vlake::parse_size).
std::vector<Bytes> parse_sizes(std::string_view text);

// Minimal JSON text builder: the caller writes keys and values in order; commas are handled.
class Json {
 public:
  Json& begin_object();
  Json& end_object();
  Json& begin_array();
  Json& end_array();
  Json& key(std::string_view k);
  Json& value(std::string_view s);
  Json& value(const char* s) { return value(std::string_view(s)); }
  Json& value(double d);
  Json& value(std::uint64_t u);
  Json& value(int i) { return value(static_cast<double>(i)); }
  Json& value(bool b);
  Json& null();
  Json& summary(const Summary& s);  // {"n","p50_us","p99_us","mean_us","min_us","max_us"}
  [[nodiscard]] const std::string& str() const noexcept { return out_; }

 private:
  void comma();
  void quote(std::string_view s);
  std::string out_;
  std::vector<bool> first_{true};
  bool after_key_ = false;
};

// Sleeps until the wall clock reaches `epoch_ms` (milliseconds since the Unix epoch); returns
// at once when it has passed or is 0.
void wait_until_epoch_ms(std::uint64_t epoch_ms);
std::uint64_t now_epoch_ms();

// Monotonic nanoseconds.
std::uint64_t now_ns() noexcept;

// The main() of a benchmark class: Bench::parse(args) (an invalid_argument "help" prints
// Bench::usage() and exits 0; another exits 2), then Bench(options).run() printed on stdout
// (exit 0; an exception exits 1). Errors go to stderr after `name`.
template <class Bench>
int bench_main(const char* name, int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  decltype(Bench::parse(args)) o;
  try {
    o = Bench::parse(args);
  } catch (const std::invalid_argument& e) {
    if (std::string(e.what()) == "help") {
      std::cout << Bench::usage();
      return 0;
    }
    std::cerr << name << ": " << e.what() << "\n";
    return 2;
  }
  try {
    std::cout << Bench(o).run() << std::endl;
    return 0;
  } catch (const std::exception& e) {
    std::cerr << name << ": " << e.what() << "\n";
    return 1;
  }
}

}  // namespace vlake::bench
