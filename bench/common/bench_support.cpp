#include "bench_support.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <stdexcept>
#include <thread>

namespace vlake::bench {

namespace {
template <class F>
void resolve(void* handle, const char* name, F& out, bool required = true) {
  void* p = ::dlsym(handle, name);
  if (p == nullptr && required) throw std::runtime_error(std::string("driver lacks ") + name);
  out = reinterpret_cast<F>(p);
}
}  // namespace

CudaApi::CudaApi(const std::string& library) {
  handle_ = ::dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle_ == nullptr) {
    const char* e = ::dlerror();
    throw std::runtime_error("cannot load " + library + ": " + (e != nullptr ? e : "?"));
  }
  resolve(handle_, "cuInit", init_);
  resolve(handle_, "cuDeviceGet", device_get_);
  resolve(handle_, "cuDevicePrimaryCtxRetain", retain_);
  resolve(handle_, "cuCtxSetCurrent", set_current_);
  resolve(handle_, "cuGetErrorName", error_name_, false);
  resolve(handle_, "cuMemAlloc_v2", mem_alloc);
  resolve(handle_, "cuMemFree_v2", mem_free);
  resolve(handle_, "vlake_sim_vmm_call_count", vmm_count_, false);
  resolve(handle_, "vlake_sim_call_count", call_count_, false);
}

CudaApi::~CudaApi() = default;  // the driver stays loaded: unloading a CUDA driver is unsafe

void CudaApi::init_context(DeviceOrdinal device) const {
  check(init_(0), "cuInit");
  CUdevice dev = 0;
  check(device_get_(&dev, device.value()), "cuDeviceGet");
  CUcontext ctx = nullptr;
  check(retain_(&ctx, dev), "cuDevicePrimaryCtxRetain");
  check(set_current_(ctx), "cuCtxSetCurrent");
}

unsigned long long CudaApi::vmm_calls() const noexcept { return vmm_count_ != nullptr ? vmm_count_() : 0; }

unsigned long long CudaApi::calls(const char* entry) const noexcept {
  return call_count_ != nullptr ? call_count_(entry) : 0;
}

void* CudaApi::symbol(const char* name) const {
  void* p = ::dlsym(handle_, name);
  if (p == nullptr) throw std::runtime_error(std::string("driver lacks ") + name);
  return p;
}

void CudaApi::check(CUresult rc, const char* what) const {
  if (rc != CUDA_SUCCESS) throw std::runtime_error(std::string(what) + ": " + error_name(rc));
}

std::string CudaApi::error_name(CUresult rc) const {
  const char* s = nullptr;
  if (error_name_ != nullptr && error_name_(rc, &s) == CUDA_SUCCESS && s != nullptr) return s;
  return "CUresult " + std::to_string(static_cast<int>(rc));
}

long parse_number(const std::string& opt, const std::string& v, long lo, long hi) {
  try {
    std::size_t used = 0;
    const long n = std::stol(v, &used);
    if (used == v.size() && n >= lo && n <= hi) return n;
  } catch (const std::exception&) {
  }
  throw std::invalid_argument(opt + " must be a number " + std::to_string(lo) + ".." + std::to_string(hi) + ", got '" +
                              v + "'");
}

double percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  const double rank = std::ceil(p / 100.0 * static_cast<double>(sorted.size()));
  const auto i = static_cast<std::size_t>(std::clamp(rank, 1.0, static_cast<double>(sorted.size())));
  return sorted[i - 1];
}

Summary summarize(std::vector<double> s) {
  Summary out;
  out.n = s.size();
  if (s.empty()) return out;
  std::sort(s.begin(), s.end());
  out.p50 = percentile(s, 50);
  out.p90 = percentile(s, 90);
  out.p99 = percentile(s, 99);
  out.over_100us = static_cast<std::size_t>(s.end() - std::lower_bound(s.begin(), s.end(), 100.0));
  out.mean = std::accumulate(s.begin(), s.end(), 0.0) / static_cast<double>(s.size());
  out.min = s.front();
  out.max = s.back();
  return out;
}

std::vector<Bytes> parse_sizes(std::string_view t) {
  std::vector<Bytes> out;
  while (!t.empty()) {
    const auto comma = t.find(',');
    out.push_back(parse_size(t.substr(0, comma)));
    if (comma == std::string_view::npos) break;
    t.remove_prefix(comma + 1);
  }
  if (out.empty()) throw std::runtime_error("no sizes given");
  return out;
}

void Json::comma() {
  if (after_key_) {
    after_key_ = false;
    return;
  }
  if (!first_.back()) out_ += ',';
  first_.back() = false;
}

Json& Json::begin_object() {
  comma();
  out_ += '{';
  first_.push_back(true);
  return *this;
}
Json& Json::end_object() {
  out_ += '}';
  first_.pop_back();
  return *this;
}
Json& Json::begin_array() {
  comma();
  out_ += '[';
  first_.push_back(true);
  return *this;
}
Json& Json::end_array() {
  out_ += ']';
  first_.pop_back();
  return *this;
}
Json& Json::key(std::string_view k) {
  comma();
  quote(k);
  out_ += ':';
  after_key_ = true;
  return *this;
}
Json& Json::value(std::string_view s) {
  comma();
  quote(s);
  return *this;
}
void Json::quote(std::string_view s) {
  out_ += '"';
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out_ += '\\';
      out_ += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
      out_ += buf;
    } else {
      out_ += c;
    }
  }
  out_ += '"';
}
Json& Json::value(double d) {
  comma();
  if (!std::isfinite(d)) {
    out_ += "null";
    return *this;
  }
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.3f", d);
  out_ += buf;
  return *this;
}
Json& Json::value(std::uint64_t u) {
  comma();
  out_ += std::to_string(u);
  return *this;
}
Json& Json::value(bool b) {
  comma();
  out_ += b ? "true" : "false";
  return *this;
}
Json& Json::null() {
  comma();
  out_ += "null";
  return *this;
}
Json& Json::summary(const Summary& s) {
  begin_object();
  key("n").value(static_cast<std::uint64_t>(s.n));
  key("p50_us").value(s.p50);
  key("p90_us").value(s.p90);
  key("p99_us").value(s.p99);
  key("over_100us").value(static_cast<std::uint64_t>(s.over_100us));
  key("mean_us").value(s.mean);
  key("min_us").value(s.min);
  key("max_us").value(s.max);
  return end_object();
}

std::uint64_t now_epoch_ms() {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count());
}

void wait_until_epoch_ms(std::uint64_t epoch_ms) {
  if (epoch_ms == 0) return;
  for (;;) {
    const std::uint64_t now = now_epoch_ms();
    if (now >= epoch_ms) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min<std::uint64_t>(epoch_ms - now, 50)));
  }
}

std::uint64_t now_ns() noexcept {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
}

}  // namespace vlake::bench
