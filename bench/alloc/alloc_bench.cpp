#include "alloc_bench.hpp"

#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <stdexcept>
#include <thread>

#include "bench_support.hpp"

namespace vlake::bench {

namespace {

constexpr int kOps = 3;  // alloc, free, pair
constexpr int kMaxSizes = 16;
constexpr int kMaxTenants = 64;

// Shared between the forked processes (anonymous shared mapping, lock-free atomics).
struct Shared {
  std::atomic<int> arrived[kMaxSizes];
  std::atomic<int> failed;
  std::atomic<int> counts;  // the driver has the simulator's call counters
  char error[256];
  std::uint64_t vmm[kMaxTenants][kMaxSizes];
  int pid[kMaxTenants];
  // followed by samples: [tenant][size][iteration][op] doubles
};
static_assert(std::atomic<int>::is_always_lock_free);

int to_int(const std::string& opt, const std::string& v, int lo, int hi) {
  return static_cast<int>(parse_number(opt, v, lo, hi));
}

// One process's loop: fills its slice of samples and vmm counts. Throws on failure.
void run_loop(const AllocOptions& o, Shared* sh, double* samples, int me) {
  CudaApi api(o.driver);
  api.init_context(o.device);
  sh->counts.store(api.has_call_counts() ? 1 : 0);
  const int nsizes = static_cast<int>(o.sizes.size());
  for (int si = 0; si < nsizes; ++si) {
    const std::size_t bytes = o.sizes[static_cast<std::size_t>(si)].value();
    auto pair = [&](double* out) {
      CUdeviceptr p = 0;
      const std::uint64_t t0 = now_ns();
      const CUresult a = api.mem_alloc(&p, bytes);
      const std::uint64_t t1 = now_ns();
      if (a != CUDA_SUCCESS) {
        throw std::runtime_error("cuMemAlloc_v2(" + format_size(Bytes{bytes}) + ") failed: " + api.error_name(a));
      }
      const CUresult f = api.mem_free(p);
      const std::uint64_t t2 = now_ns();
      if (f != CUDA_SUCCESS) throw std::runtime_error("cuMemFree_v2 failed: " + api.error_name(f));
      if (out != nullptr) {
        out[0] = static_cast<double>(t1 - t0) / 1e3;
        out[1] = static_cast<double>(t2 - t1) / 1e3;
        out[2] = static_cast<double>(t2 - t0) / 1e3;
      }
    };
    for (int w = 0; w < o.warmup; ++w) pair(nullptr);
    // Barrier: every process starts this size together. Yield a while, then sleep 50 us between
    // checks: with more tenants than cores, spinning early arrivals would take the CPU from the
    // late ones and from vlaked (a start skew of up to ~50 us is small against the timed loop).
    sh->arrived[si].fetch_add(1);
    for (int spins = 0; sh->arrived[si].load() < o.tenants; ++spins) {
      if (sh->failed.load() != 0) throw std::runtime_error("another tenant failed");
      if (spins < 1000) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
    const unsigned long long v0 = api.vmm_calls();
    double* base = samples + (static_cast<std::size_t>(me) * nsizes + static_cast<std::size_t>(si)) *
                                 static_cast<std::size_t>(o.iterations) * kOps;
    for (int i = 0; i < o.iterations; ++i) pair(base + static_cast<std::size_t>(i) * kOps);
    sh->vmm[me][si] = api.vmm_calls() - v0;
  }
}

void write_sizes(Json& j, const AllocOptions& o, const double* samples, const std::vector<int>& procs, const Shared* sh,
                 bool counts) {
  const std::size_t nsizes = o.sizes.size();
  const auto iters = static_cast<std::size_t>(o.iterations);
  j.begin_array();
  for (std::size_t si = 0; si < nsizes; ++si) {
    std::vector<double> ops[kOps];
    std::uint64_t vmm = 0;
    for (int p : procs) {
      const double* base = samples + (static_cast<std::size_t>(p) * nsizes + si) * iters * kOps;
      for (std::size_t i = 0; i < iters; ++i) {
        for (int k = 0; k < kOps; ++k) ops[k].push_back(base[i * kOps + static_cast<std::size_t>(k)]);
      }
      vmm += sh->vmm[p][si];
    }
    j.begin_object();
    j.key("size").value(format_size(o.sizes[si]));
    j.key("bytes").value(o.sizes[si].value());
    j.key("alloc").summary(summarize(ops[0]));
    j.key("free").summary(summarize(ops[1]));
    j.key("pair").summary(summarize(ops[2]));
    j.key("vmm_calls_per_pair");
    if (counts) {
      j.value(static_cast<double>(vmm) / static_cast<double>(iters * procs.size()));
    } else {
      j.null();
    }
    j.end_object();
  }
  j.end_array();
}

}  // namespace

const char* AllocBench::usage() noexcept {
  return "usage: vlake_bench_alloc [--sizes 2MiB,20MiB,256MiB,1GiB] [--iterations N] [--warmup N]\n"
         "                         [--tenants K] [--device N] [--driver PATH] [--label TEXT]\n"
         "Times cuMemAlloc_v2/cuMemFree_v2 per size and prints JSON (docs/benchmarks.md).\n"
         "Run it under LD_PRELOAD=libvlake-hook.so for the hook (VLAKE_RESERVE=0: cold path).\n";
}

AllocOptions AllocBench::parse(const std::vector<std::string>& args) {
  AllocOptions o;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") throw std::invalid_argument("help");
    if (i + 1 >= args.size()) throw std::invalid_argument(a + " needs a value (see --help)");
    const std::string& v = args[++i];
    if (a == "--sizes") {
      try {
        o.sizes = parse_sizes(v);
      } catch (const std::exception& e) {
        throw std::invalid_argument(std::string("--sizes: ") + e.what());
      }
      if (o.sizes.size() > kMaxSizes) throw std::invalid_argument("--sizes: at most 16 sizes");
      for (Bytes b : o.sizes) {
        if (b.value() == 0) throw std::invalid_argument("--sizes: a size must be > 0");
      }
    } else if (a == "--iterations") {
      o.iterations = to_int(a, v, 1, 1000000);
    } else if (a == "--warmup") {
      o.warmup = to_int(a, v, 0, 1000000);
    } else if (a == "--tenants") {
      o.tenants = to_int(a, v, 1, kMaxTenants);
    } else if (a == "--device") {
      o.device = DeviceOrdinal{to_int(a, v, 0, 63)};
    } else if (a == "--driver") {
      o.driver = v;
    } else if (a == "--label") {
      o.label = v;
    } else {
      throw std::invalid_argument("unknown option '" + a + "' (see --help)");
    }
  }
  if (o.sizes.empty()) {
    o.sizes = {Bytes{2ULL << 20}, Bytes{20ULL << 20}, Bytes{256ULL << 20}, Bytes{1ULL << 30}};
  }
  return o;
}

std::string AllocBench::run() {
  const std::size_t nsizes = o_.sizes.size();
  const std::size_t nsamples =
      static_cast<std::size_t>(o_.tenants) * nsizes * static_cast<std::size_t>(o_.iterations) * kOps;
  const std::size_t bytes = sizeof(Shared) + nsamples * sizeof(double);
  void* mem = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) throw std::runtime_error("mmap of the shared sample area failed");
  auto* sh = new (mem) Shared{};
  auto* samples = reinterpret_cast<double*>(static_cast<char*>(mem) + sizeof(Shared));
  bool counts = false;

  if (o_.tenants == 1) {
    run_loop(o_, sh, samples, 0);
    sh->pid[0] = static_cast<int>(::getpid());
  } else {
    // Fork before any CUDA call (a CUDA process cannot fork): each child initializes its own.
    std::vector<pid_t> kids;
    for (int t = 0; t < o_.tenants; ++t) {
      const pid_t pid = ::fork();
      if (pid < 0) throw std::runtime_error("fork failed");
      if (pid == 0) {
        int rc = 0;
        try {
          sh->pid[t] = static_cast<int>(::getpid());
          run_loop(o_, sh, samples, t);
        } catch (const std::exception& e) {
          if (sh->failed.exchange(1) == 0) {
            std::snprintf(sh->error, sizeof sh->error, "tenant %d: %s", t, e.what());
          }
          rc = 1;
        }
        std::fflush(nullptr);
        ::_exit(rc);
      }
      kids.push_back(pid);
    }
    for (pid_t k : kids) {
      int st = 0;
      ::waitpid(k, &st, 0);
      if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        if (sh->failed.exchange(1) == 0) std::snprintf(sh->error, sizeof sh->error, "a tenant crashed");
      }
    }
    if (sh->failed.load() != 0) {
      const std::string why = sh->error;
      ::munmap(mem, bytes);
      throw std::runtime_error(why);
    }
  }
  counts = sh->counts.load() != 0;

  Json j;
  j.begin_object();
  j.key("bench").value("alloc");
  j.key("label").value(o_.label);
  j.key("tenants").value(static_cast<std::uint64_t>(o_.tenants));
  j.key("iterations").value(static_cast<std::uint64_t>(o_.iterations));
  j.key("warmup").value(static_cast<std::uint64_t>(o_.warmup));
  j.key("sim_counts").value(counts);
  std::vector<int> all;
  for (int t = 0; t < o_.tenants; ++t) all.push_back(t);
  j.key("sizes");
  write_sizes(j, o_, samples, all, sh, counts);
  j.key("processes").begin_array();
  for (int t = 0; t < o_.tenants; ++t) {
    j.begin_object();
    j.key("pid").value(static_cast<std::uint64_t>(sh->pid[t]));
    j.key("sizes");
    write_sizes(j, o_, samples, {t}, sh, counts);
    j.end_object();
  }
  j.end_array();
  j.end_object();
  ::munmap(mem, bytes);
  return j.str();
}

int alloc_main(int argc, char** argv) { return bench_main<AllocBench>("vlake_bench_alloc", argc, argv); }

}  // namespace vlake::bench
