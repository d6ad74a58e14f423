// Unit tests of the benchmark pieces (bench/), the simulator's call counters (sim/) and the
// committed traces (bench/traces/*.trace).
#include <catch2/catch.hpp>

#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "alloc_bench.hpp"
#include "bench_support.hpp"
#include "launch_bench.hpp"
#include "replay_bench.hpp"
#include "start_bench.hpp"
#include "storm.hpp"

using namespace vlake;
using namespace vlake::bench;

TEST_CASE("size lists use the common size grammar", "[bench]") {
  const std::vector<Bytes> s = parse_sizes("2MiB,20MiB,1Gi,4096B");
  REQUIRE(s.size() == 4);
  CHECK(s[0].value() == (2ULL << 20));
  CHECK(s[1].value() == (20ULL << 20));
  CHECK(s[2].value() == (1ULL << 30));
  CHECK(s[3].value() == 4096);
  CHECK_THROWS_AS(parse_sizes("2MiB,20M"), vlake::SizeError);  // no single-letter units
  CHECK_THROWS_AS(parse_sizes("2MiB,,1GiB"), vlake::SizeError);
  CHECK_THROWS_WITH(parse_sizes("2MiB,4096"),
                    "\"4096\": a size needs a unit; write 4096B, 4096KiB, 4096MiB or 4096GiB");
  CHECK_THROWS(parse_sizes(""));
  CHECK_THROWS_WITH(AllocBench::parse({"--sizes", "1GB"}), Catch::Contains("--sizes: \"1GB\": decimal units"));
}

TEST_CASE("summaries use nearest-rank percentiles", "[bench]") {
  std::vector<double> v;
  for (int i = 100; i >= 1; --i) v.push_back(i);
  const Summary s = summarize(v);
  CHECK(s.n == 100);
  CHECK(s.p50 == 50);
  CHECK(s.p99 == 99);
  CHECK(s.min == 1);
  CHECK(s.max == 100);
  CHECK(s.mean == Approx(50.5));
  CHECK(summarize({7}).p99 == 7);
  CHECK(summarize({}).n == 0);
}

TEST_CASE("the JSON builder places commas and escapes strings", "[bench]") {
  Json j;
  j.begin_object();
  j.key("a").value(std::uint64_t{1});
  j.key("b").begin_array().value("x\"y").value(true).null().end_array();
  j.key("c").begin_object().key("d").value(1.5).end_object();
  j.end_object();
  CHECK(j.str() == R"({"a":1,"b":["x\"y",true,null],"c":{"d":1.500}})");
}

TEST_CASE("bench options are checked", "[bench]") {
  const AllocOptions o = AllocBench::parse({"--sizes", "2MiB,20MiB", "--iterations", "5", "--tenants", "4"});
  CHECK(o.sizes.size() == 2);
  CHECK(o.iterations == 5);
  CHECK(o.tenants == 4);
  CHECK(AllocBench::parse({}).sizes.size() == 4);
  CHECK_THROWS_AS(AllocBench::parse({"--iterations", "0"}), std::invalid_argument);
  CHECK_THROWS_AS(AllocBench::parse({"--tenants", "65"}), std::invalid_argument);
  CHECK_THROWS_AS(AllocBench::parse({"--sizes", "2QiB"}), std::invalid_argument);
  CHECK_THROWS_AS(AllocBench::parse({"--sizes", "20M"}), std::invalid_argument);
  CHECK_THROWS_AS(AllocBench::parse({"--bogus", "1"}), std::invalid_argument);
  CHECK_THROWS_AS(AllocBench::parse({"--sizes"}), std::invalid_argument);
  CHECK_THROWS_AS(ReplayBench::parse({}), std::invalid_argument);
  CHECK_THROWS_AS(ReplayBench::parse({"--trace", "x", "--pace", "-1"}), std::invalid_argument);
  CHECK_THROWS_AS(ReplayBench::parse({"--trace", "x", "--scale-div", "0"}), std::invalid_argument);
  CHECK(ReplayBench::parse({"--trace", "x", "--pace", "0.5"}).pace == 0.5);
}

namespace {
std::string write_temp(const std::string& text) {
  char path[] = "/tmp/vlake-bench-trace-XXXXXX";
  const int fd = ::mkstemp(path);
  REQUIRE(fd >= 0);
  REQUIRE(::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()));
  ::close(fd);
  return path;
}
}  // namespace

TEST_CASE("traces parse, and malformed lines are reported with their line", "[bench]") {
  const std::string ok = write_temp("# header\n0 alloc 0 512\n5 alloc 1 2097152\n3 free 0\n\n1 free 1\n");
  const auto ev = read_trace(ok);
  REQUIRE(ev.size() == 4);
  CHECK(ev[1].alloc);
  CHECK(ev[1].bytes == 2097152);
  CHECK(ev[1].dt_us == 5);
  CHECK_FALSE(ev[2].alloc);
  CHECK(ev[2].id == 0);
  ::unlink(ok.c_str());
  for (const std::string bad : {"0 alloc 1\n", "0 grow 1 5\n", "x alloc 1 5\n", "0 free 1 2\n", "0 alloc 1 0\n"}) {
    const std::string p = write_temp("# h\n" + bad);
    INFO(bad);
    try {
      read_trace(p);
      FAIL("accepted a malformed trace");
    } catch (const std::runtime_error& e) {
      CHECK(std::string(e.what()).find(":2:") != std::string::npos);
    }
    ::unlink(p.c_str());
  }
  CHECK_THROWS(read_trace("/nonexistent/trace"));
}

TEST_CASE("the committed traces are well-formed, small and balanced", "[bench]") {
  for (const std::string name : {"train_ckpt", "lora", "infer_kv"}) {
    INFO(name);
    const std::string path = std::string(VLAKE_TRACE_DIR) + "/" + name + ".trace";
    struct stat st {};
    REQUIRE(::stat(path.c_str(), &st) == 0);
    CHECK(st.st_size < 2'000'000);
    const auto ev = read_trace(path);
    CHECK(ev.size() > 1000);
    std::set<std::uint64_t> live;
    std::uint64_t allocs = 0;
    bool ok = true;
    for (const auto& e : ev) {
      if (e.alloc) {
        ok = ok && live.insert(e.id).second;
        ++allocs;
      } else {
        ok = ok && live.erase(e.id) == 1;
      }
    }
    CHECK(ok);
    CHECK(allocs > 500);
  }
}

namespace {
using CountFn = unsigned long long (*)(const char*);
using VmmFn = unsigned long long (*)();
}  // namespace

TEST_CASE("the simulator counts driver calls per entry point and process", "[bench][sim]") {
  const std::string node = "bu" + std::to_string(::getpid()) + "-counts";
  ::setenv("VLAKE_SIM_NODE", node.c_str(), 1);
  ::setenv("VLAKE_SIM_DEVICE_MEMORY", "256MiB", 1);
  CudaApi api(VLAKE_SIM_LIB);
  REQUIRE(api.has_call_counts());
  void* h = ::dlopen(VLAKE_SIM_LIB, RTLD_NOW | RTLD_LOCAL);
  REQUIRE(h != nullptr);
  auto count = reinterpret_cast<CountFn>(::dlsym(h, "vlake_sim_call_count"));
  auto vmm = reinterpret_cast<VmmFn>(::dlsym(h, "vlake_sim_vmm_call_count"));
  REQUIRE(count != nullptr);
  REQUIRE(vmm != nullptr);
  CHECK(count(nullptr) == 0);
  CHECK(count("cuNoSuchEntry") == 0);

  api.init_context(DeviceOrdinal{0});
  CHECK(count("cuInit") >= 1);
  const auto alloc0 = count("cuMemAlloc_v2");
  const auto free0 = count("cuMemFree_v2");
  const auto vmm0 = vmm();
  for (int i = 0; i < 3; ++i) {
    CUdeviceptr p = 0;
    REQUIRE(api.mem_alloc(&p, 1 << 20) == CUDA_SUCCESS);
    REQUIRE(api.mem_free(p) == CUDA_SUCCESS);
  }
  CHECK(count("cuMemAlloc_v2") - alloc0 == 3);
  CHECK(count("cuMemFree_v2") - free0 == 3);
  CHECK(vmm() - vmm0 == 6);

  // VMM calls count, other calls do not add to the VMM sum; failed calls count too.
  using ReserveFn = CUresult (*)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long);
  using AddrFreeFn = CUresult (*)(CUdeviceptr, size_t);
  using InfoFn = CUresult (*)(size_t*, size_t*);
  auto reserve = reinterpret_cast<ReserveFn>(::dlsym(h, "cuMemAddressReserve"));
  auto addr_free = reinterpret_cast<AddrFreeFn>(::dlsym(h, "cuMemAddressFree"));
  auto info = reinterpret_cast<InfoFn>(::dlsym(h, "cuMemGetInfo_v2"));
  const auto vmm1 = vmm();
  CUdeviceptr va = 0;
  REQUIRE(reserve(&va, 2 << 20, 0, 0, 0) == CUDA_SUCCESS);
  REQUIRE(addr_free(va, 2 << 20) == CUDA_SUCCESS);
  CHECK(addr_free(va, 2 << 20) != CUDA_SUCCESS);
  size_t f = 0, t = 0;
  const auto info0 = count("cuMemGetInfo_v2");
  REQUIRE(info(&f, &t) == CUDA_SUCCESS);
  CHECK(count("cuMemGetInfo_v2") - info0 == 1);
  CHECK(vmm() - vmm1 == 3);
  CHECK(count("cuMemAddressFree") >= 2);

  // A per-thread variant forwarding to its legacy function counts once, under its own name.
  using HtoDFn = CUresult (*)(CUdeviceptr, const void*, size_t);
  auto htod_ptds = reinterpret_cast<HtoDFn>(::dlsym(h, "cuMemcpyHtoD_v2_ptds"));
  REQUIRE(htod_ptds != nullptr);
  CUdeviceptr p = 0;
  REQUIRE(api.mem_alloc(&p, 4096) == CUDA_SUCCESS);
  const auto legacy0 = count("cuMemcpyHtoD_v2");
  const auto ptds0 = count("cuMemcpyHtoD_v2_ptds");
  const char data[16] = {};
  REQUIRE(htod_ptds(p, data, sizeof data) == CUDA_SUCCESS);
  CHECK(count("cuMemcpyHtoD_v2_ptds") - ptds0 == 1);
  CHECK(count("cuMemcpyHtoD_v2") - legacy0 == 0);
  REQUIRE(api.mem_free(p) == CUDA_SUCCESS);

  // Many threads at once: no increment is lost.
  using VersionFn = CUresult (*)(int*);
  auto version = reinterpret_cast<VersionFn>(::dlsym(h, "cuDriverGetVersion"));
  const auto v0 = count("cuDriverGetVersion");
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([version] {
      int v = 0;
      for (int k = 0; k < 2000; ++k) (void)version(&v);
    });
  }
  for (auto& th : threads) th.join();
  CHECK(count("cuDriverGetVersion") - v0 == 8000);
}

TEST_CASE("storm options are checked", "[bench][storm]") {
  const StormOptions d = parse_storm({});
  CHECK(d.tenants == 64);
  CHECK(d.threads == 4);
  CHECK(d.min_size.value() == (2ULL << 20));
  CHECK(d.max_size.value() == (64ULL << 20));
  const StormOptions o = parse_storm({"--tenants", "8", "--threads", "2", "--duration-ms", "3000", "--stop-at-ms",
                                      "1000", "--stop-ms", "500", "--stop-end", "kill", "--max-size", "16MiB"});
  CHECK(o.tenants == 8);
  CHECK(o.stop_kill);
  CHECK(o.max_size.value() == (16ULL << 20));
  CHECK_THROWS_AS(parse_storm({"--tenants", "0"}), std::invalid_argument);
  CHECK_THROWS_AS(parse_storm({"--max-size", "3MiB"}), std::invalid_argument);  // not a 2 MiB multiple
  CHECK_THROWS_AS(parse_storm({"--min-size", "8MiB", "--max-size", "4MiB"}), std::invalid_argument);
  CHECK_THROWS_AS(parse_storm({"--duration-ms", "1000", "--stop-at-ms", "800", "--stop-ms", "400"}),
                  std::invalid_argument);  // the stop must end inside the run
  CHECK_THROWS_AS(parse_storm({"--stop-end", "term"}), std::invalid_argument);
  CHECK_THROWS_AS(parse_storm({"--tenants", "4", "--stop-tenant", "4"}), std::invalid_argument);
  CHECK_THROWS_AS(parse_storm({"--threads"}), std::invalid_argument);
}

TEST_CASE("storm calls fall in the phase they started in", "[bench][storm]") {
  StormOptions o;
  o.stop_at_ms = 1000;
  o.stop_ms = 500;
  CHECK(storm_phase(0, o) == 0);
  CHECK(storm_phase(999'999'999ULL, o) == 0);
  CHECK(storm_phase(1'000'000'000ULL, o) == 1);
  CHECK(storm_phase(1'499'999'999ULL, o) == 1);
  CHECK(storm_phase(1'500'000'000ULL, o) == 2);
  o.stop_at_ms = 0;  // no stop: one phase
  CHECK(storm_phase(1'200'000'000ULL, o) == 0);
}

TEST_CASE("daemon histogram quantiles interpolate inside their bucket", "[bench][storm]") {
  LatencyHistogram h;
  h.buckets.assign(13, 0);
  CHECK(histogram_quantile_us(h, 0.5) == 0);  // empty
  // 100 grants: 50 in (0, 50us], 40 in (50, 100us], 10 in (0.5, 1ms].
  h.buckets[0] = 50;
  h.buckets[1] = 40;
  h.buckets[4] = 10;
  h.count = 100;
  CHECK(histogram_quantile_us(h, 0.25) == Approx(25.0));
  CHECK(histogram_quantile_us(h, 0.50) == Approx(50.0));
  CHECK(histogram_quantile_us(h, 0.70) == Approx(75.0));
  CHECK(histogram_quantile_us(h, 0.99) == Approx(950.0));
  // Grants above the last bound are only in the count: the quantile is the last bound.
  LatencyHistogram over;
  over.buckets.assign(13, 0);
  over.buckets[0] = 1;
  over.count = 10;
  CHECK(histogram_quantile_us(over, 0.99) == Approx(1'000'000.0));
  // Differences between two snapshots.
  LatencyHistogram later = h;
  later.buckets[4] += 5;
  later.count += 5;
  later.sum_ns = 7000;
  const LatencyHistogram d = histogram_delta(later, h);
  CHECK(d.count == 5);
  CHECK(d.buckets[4] == 5);
  CHECK(d.buckets[0] == 0);
  CHECK(d.sum_ns == 7000);
  CHECK(histogram_quantile_us(d, 0.5) == Approx(750.0));
}

TEST_CASE("launch and start options are checked", "[bench]") {
  const LaunchOptions l = LaunchBench::parse({"--op", "graph", "--launches", "500", "--graph-nodes", "10"});
  CHECK(l.op == "graph");
  CHECK(l.launches == 500);
  CHECK(l.graph_nodes == 10);
  CHECK(LaunchBench::parse({"--serve"}).serve);
  CHECK_THROWS_WITH(LaunchBench::parse({"--op", "spin"}), Catch::Contains("--op takes loop or graph"));
  CHECK_THROWS_WITH(LaunchBench::parse({"--launches", "0"}), Catch::Contains("--launches must be a number 1.."));
  CHECK_THROWS_WITH(LaunchBench::parse({"--launches", "12x"}), Catch::Contains("got '12x'"));
  const StartOptions s = StartBench::parse({"--processes", "8", "--bytes", "2MiB", "--timeout-s", "30"});
  CHECK(s.processes == 8);
  CHECK(s.bytes.value() == (2ULL << 20));
  CHECK(s.timeout_s == 30);
  CHECK_THROWS_WITH(StartBench::parse({"--processes", "0"}), Catch::Contains("--processes must be a number 1..1024"));
  CHECK_THROWS_WITH(StartBench::parse({"--bytes", "64"}), Catch::Contains("--bytes: "));
  CHECK_THROWS_WITH(StartBench::parse({"--frobnicate", "1"}), Catch::Contains("unknown option '--frobnicate'"));
}

TEST_CASE("the launch benchmark launches on the simulator and reports launches per second", "[bench][sim]") {
  const std::string node = "bu" + std::to_string(::getpid()) + "-launch";
  ::setenv("VLAKE_SIM_NODE", node.c_str(), 1);
  ::setenv("VLAKE_SIM_DEVICE_MEMORY", "256MiB", 1);
  LaunchOptions o;
  o.driver = VLAKE_SIM_LIB;
  o.launches = 300;
  const std::string j = LaunchBench(o).run();
  CHECK_THAT(j, Catch::Contains("\"op\":\"loop\"") && Catch::Contains("\"launches\":300") &&
                    Catch::Contains("\"unit\":\"launches/s\""));
  CHECK_THAT(j, !Catch::Contains("\"value\":0.000"));
  ::unlink(("/dev/shm/vlake-sim-" + node).c_str());
}
