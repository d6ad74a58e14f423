#include "replay_bench.hpp"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <unordered_map>

#include "bench_support.hpp"

namespace vlake::bench {

namespace {
std::uint64_t to_u64(const std::string& opt, const std::string& v) {
  try {
    std::size_t used = 0;
    const unsigned long long n = std::stoull(v, &used);
    if (used == v.size() && v[0] != '-') return n;
  } catch (const std::exception&) {
  }
  throw std::invalid_argument(opt + " must be a non-negative integer, got '" + v + "'");
}

std::string base_name(const std::string& path) {
  std::string b = path.substr(path.rfind('/') + 1);
  if (const auto dot = b.rfind(".trace"); dot != std::string::npos && dot + 6 == b.size()) b.resize(dot);
  return b;
}
}  // namespace

std::vector<TraceEvent> read_trace(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read trace " + path);
  std::vector<TraceEvent> out;
  std::string line;
  std::size_t lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ls(line);
    TraceEvent e{};
    std::string op;
    std::string extra;
    if (!(ls >> e.dt_us >> op >> e.id)) {
      throw std::runtime_error(path + ":" + std::to_string(lineno) +
                               ": expected '<dt_us> alloc <id> <bytes>' or '<dt_us> free <id>'");
    }
    if (op == "alloc") {
      e.alloc = true;
      if (!(ls >> e.bytes) || e.bytes == 0) {
        throw std::runtime_error(path + ":" + std::to_string(lineno) + ": alloc needs a byte count > 0");
      }
    } else if (op != "free") {
      throw std::runtime_error(path + ":" + std::to_string(lineno) + ": unknown event '" + op + "'");
    }
    if (ls >> extra) throw std::runtime_error(path + ":" + std::to_string(lineno) + ": trailing text");
    out.push_back(e);
  }
  return out;
}

const char* ReplayBench::usage() noexcept {
  return "usage: vlake_bench_replay --trace FILE [--pace F] [--scale-div D] [--max-events N]\n"
         "                          [--start-at EPOCH_MS] [--granularity SIZE] [--device N]\n"
         "                          [--driver PATH] [--label TEXT]\n"
         "Replays an allocation trace through cuMemAlloc_v2/cuMemFree_v2; prints JSON.\n";
}

ReplayOptions ReplayBench::parse(const std::vector<std::string>& args) {
  ReplayOptions o;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") throw std::invalid_argument("help");
    if (i + 1 >= args.size()) throw std::invalid_argument(a + " needs a value (see --help)");
    const std::string& v = args[++i];
    if (a == "--trace") o.trace = v;
    else if (a == "--driver") o.driver = v;
    else if (a == "--label") o.label = v;
    else if (a == "--device") o.device = DeviceOrdinal{static_cast<std::int32_t>(to_u64(a, v))};
    else if (a == "--scale-div") {
      o.scale_div = to_u64(a, v);
      if (o.scale_div == 0) throw std::invalid_argument("--scale-div must be >= 1");
    } else if (a == "--max-events") o.max_events = to_u64(a, v);
    else if (a == "--start-at") o.start_at_ms = to_u64(a, v);
    else if (a == "--granularity") {
      try {
        o.granularity = parse_size(v);
      } catch (const SizeError& e) {
        throw std::invalid_argument(std::string("--granularity: ") + e.what());
      }
      if (o.granularity.value() == 0) throw std::invalid_argument("--granularity must be > 0");
    } else if (a == "--pace") {
      try {
        std::size_t used = 0;
        o.pace = std::stod(v, &used);
        if (used != v.size() || o.pace < 0) throw std::invalid_argument("");
      } catch (const std::exception&) {
        throw std::invalid_argument("--pace must be a number >= 0, got '" + v + "'");
      }
    } else {
      throw std::invalid_argument("unknown option '" + a + "' (see --help)");
    }
  }
  if (o.trace.empty()) throw std::invalid_argument("--trace is required (see --help)");
  return o;
}

std::string ReplayBench::run() {
  std::vector<TraceEvent> events = read_trace(o_.trace);
  if (o_.max_events != 0 && events.size() > o_.max_events) events.resize(o_.max_events);
  CudaApi api(o_.driver);
  api.init_context(o_.device);

  struct Live {
    CUdeviceptr ptr;
    std::uint64_t bytes;
  };
  std::unordered_map<std::uint64_t, Live> live;
  live.reserve(4096);
  std::vector<double> alloc_us;
  std::vector<double> free_us;
  alloc_us.reserve(events.size());
  free_us.reserve(events.size());
  std::uint64_t cur = 0, peak = 0, cur_g = 0, peak_g = 0, failed = 0, allocs = 0, frees = 0;
  const std::uint64_t g = o_.granularity.value();

  wait_until_epoch_ms(o_.start_at_ms);
  const std::uint64_t start = now_ns();
  double due_us = 0;
  for (const TraceEvent& e : events) {
    if (o_.pace > 0) {
      due_us += static_cast<double>(e.dt_us) * o_.pace;
      const auto due_ns = start + static_cast<std::uint64_t>(due_us * 1e3);
      for (std::uint64_t now = now_ns(); now < due_ns; now = now_ns()) {
        if (due_ns - now > 200'000) {
          std::this_thread::sleep_for(std::chrono::nanoseconds(due_ns - now - 100'000));
        }
      }
    }
    if (e.alloc) {
      const std::uint64_t bytes = std::max<std::uint64_t>(1, e.bytes / o_.scale_div);
      CUdeviceptr p = 0;
      const std::uint64_t t0 = now_ns();
      const CUresult rc = api.mem_alloc(&p, bytes);
      const std::uint64_t t1 = now_ns();
      ++allocs;
      if (rc == CUDA_ERROR_OUT_OF_MEMORY) {
        ++failed;
        continue;
      }
      if (rc != CUDA_SUCCESS) {
        throw std::runtime_error("cuMemAlloc_v2(" + std::to_string(bytes) + ") failed: " + api.error_name(rc));
      }
      alloc_us.push_back(static_cast<double>(t1 - t0) / 1e3);
      if (live.count(e.id) != 0) throw std::runtime_error("trace reuses live id " + std::to_string(e.id));
      live[e.id] = Live{p, bytes};
      cur += bytes;
      cur_g += (bytes + g - 1) / g * g;
      peak = std::max(peak, cur);
      peak_g = std::max(peak_g, cur_g);
    } else {
      const auto it = live.find(e.id);
      if (it == live.end()) continue;  // its alloc failed or was cut
      const std::uint64_t t0 = now_ns();
      const CUresult rc = api.mem_free(it->second.ptr);
      const std::uint64_t t1 = now_ns();
      if (rc != CUDA_SUCCESS) throw std::runtime_error("cuMemFree_v2 failed: " + api.error_name(rc));
      free_us.push_back(static_cast<double>(t1 - t0) / 1e3);
      ++frees;
      cur -= it->second.bytes;
      cur_g -= (it->second.bytes + g - 1) / g * g;
      live.erase(it);
    }
  }
  const double duration_s = static_cast<double>(now_ns() - start) / 1e9;
  for (auto& [id, l] : live) (void)api.mem_free(l.ptr);

  Json j;
  j.begin_object();
  j.key("bench").value("replay");
  j.key("label").value(o_.label);
  j.key("trace").value(base_name(o_.trace));
  j.key("events").value(static_cast<std::uint64_t>(events.size()));
  j.key("allocs").value(allocs);
  j.key("frees").value(frees);
  j.key("failed_allocs").value(failed);
  j.key("alloc").summary(summarize(std::move(alloc_us)));
  j.key("free").summary(summarize(std::move(free_us)));
  j.key("peak_bytes").value(peak);
  j.key("peak_granted_bytes").value(peak_g);
  j.key("granularity").value(g);
  j.key("scale_div").value(o_.scale_div);
  j.key("pace").value(o_.pace);
  j.key("duration_s").value(duration_s);
  j.end_object();
  return j.str();
}

int replay_main(int argc, char** argv) { return bench_main<ReplayBench>("vlake_bench_replay", argc, argv); }

}  // namespace vlake::bench
