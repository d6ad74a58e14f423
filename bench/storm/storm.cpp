#include "storm.hpp"

#include <dlfcn.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <iostream>
#include <memory>
#include <random>
#include <stdexcept>
#include <thread>

#include "vlake/common/unique_fd.hpp"
#include "vlake/contracts/state.hpp"

namespace vlake::bench {

namespace {

namespace st = vlake::state;

constexpr std::uint64_t kGranularity = 2ULL << 20;
constexpr int kReadyFd = 3;  // tenant -> parent: one byte once its session is open
constexpr int kStartFd = 4;  // parent -> tenant: the common start, epoch milliseconds

std::uint64_t to_u64(const std::string& opt, const std::string& v) {
  std::size_t used = 0;
  unsigned long long x = 0;
  try {
    x = std::stoull(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != v.size() || v.empty() || v[0] == '-') throw std::invalid_argument(opt + ": not a number: " + v);
  return x;
}

void write_all(int fd, const void* p, std::size_t n) {
  const auto* b = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = ::write(fd, b, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) throw std::runtime_error(std::string("write: ") + std::strerror(errno));
    b += w;
    n -= static_cast<std::size_t>(w);
  }
}

bool read_all(int fd, void* p, std::size_t n) {
  auto* b = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t r = ::read(fd, b, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    b += r;
    n -= static_cast<std::size_t>(r);
  }
  return true;
}

LatencyHistogram histogram_of(const st::State& s) {
  LatencyHistogram h;
  h.buckets.assign(std::begin(s.counters.grant_latency_bucket), std::end(s.counters.grant_latency_bucket));
  h.count = s.counters.grant_latency_count;
  h.sum_ns = s.counters.grant_latency_sum_ns;
  return h;
}

// ---------------------------------------------------------------------------------------------
// a tenant process

void tenant_main(const StormOptions& o) {
  CudaApi api(o.driver);
  api.init_context(DeviceOrdinal{0});
  // One untimed pair: the hook's connection and session are open before the start.
  CUdeviceptr p = 0;
  if (const CUresult rc = api.mem_alloc(&p, o.min_size.value()); rc != CUDA_SUCCESS) {
    throw std::runtime_error("warm-up cuMemAlloc_v2: " + api.error_name(rc));
  }
  (void)api.mem_free(p);
  const char ready = 'R';
  write_all(kReadyFd, &ready, 1);
  ::close(kReadyFd);
  std::uint64_t start_epoch_ms = 0;
  if (!read_all(kStartFd, &start_epoch_ms, sizeof start_epoch_ms)) throw std::runtime_error("no start time");
  ::close(kStartFd);
  const std::int64_t ahead_ms = static_cast<std::int64_t>(start_epoch_ms) - static_cast<std::int64_t>(now_epoch_ms());
  const std::uint64_t base = now_ns() + static_cast<std::uint64_t>(std::max<std::int64_t>(0, ahead_ms)) * 1'000'000ULL;
  const std::uint64_t end = base + o.duration_ms * 1'000'000ULL;
  const std::uint64_t classes = (o.max_size.value() - o.min_size.value()) / kGranularity;

  std::vector<std::vector<StormSample>> samples(static_cast<std::size_t>(o.threads));
  std::vector<std::thread> threads;
  for (int t = 0; t < o.threads; ++t) {
    threads.emplace_back([&, t] {
      auto& out = samples[static_cast<std::size_t>(t)];
      api.init_context(DeviceOrdinal{0});
      std::mt19937_64 rng(o.seed * 1'000'003ULL + static_cast<std::uint64_t>(o.child) * 64 +
                          static_cast<std::uint64_t>(t));
      std::uniform_int_distribution<std::uint64_t> size_class(0, classes);
      std::uniform_int_distribution<std::uint32_t> think(0, 2 * o.think_us);
      std::deque<CUdeviceptr> live;
      const auto tenant = static_cast<std::uint32_t>(o.child);
      auto free_one = [&] {
        const std::uint64_t t0 = now_ns();
        (void)api.mem_free(live.front());
        const std::uint64_t t1 = now_ns();
        live.pop_front();
        out.push_back(StormSample{t0 - std::min(t0, base), t1 - t0, tenant, kOpFree, {}});
      };
      wait_until_epoch_ms(start_epoch_ms);
      while (now_ns() < end) {
        const std::uint64_t bytes = o.min_size.value() + kGranularity * size_class(rng);
        CUdeviceptr ptr = 0;
        const std::uint64_t t0 = now_ns();
        const CUresult rc = api.mem_alloc(&ptr, bytes);
        const std::uint64_t t1 = now_ns();
        out.push_back(
            StormSample{t0 - std::min(t0, base), t1 - t0, tenant, rc == CUDA_SUCCESS ? kOpAlloc : kOpFailed, {}});
        if (rc == CUDA_SUCCESS) live.push_back(ptr);
        if (live.size() > static_cast<std::size_t>(o.hold) || (rc != CUDA_SUCCESS && !live.empty())) free_one();
        if (o.think_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(think(rng)));
      }
      // What is still live is freed untimed: exiting tenants detach from the driver meanwhile.
      while (!live.empty()) {
        (void)api.mem_free(live.front());
        live.pop_front();
      }
    });
  }
  for (auto& th : threads) th.join();
  const std::string path = o.out_dir + "/" + std::to_string(o.child) + ".bin";
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  for (const auto& v : samples) {
    f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(StormSample)));
  }
  if (!f) throw std::runtime_error("cannot write " + path);
}

// ---------------------------------------------------------------------------------------------
// the parent

struct Tenant {
  pid_t pid = -1;
  UniqueFd start;  // write end of its start pipe
  bool done = false;
  int status = 0;
};

void sleep_until_ns(std::uint64_t t) {
  const std::uint64_t n = now_ns();
  if (t > n) std::this_thread::sleep_for(std::chrono::nanoseconds(t - n));
}

// SIGSTOPs `pid` (and waits until it is stopped). The simulator keeps its machine state behind
// a lock in shared memory that the process may be holding at that instant, which would stall
// every simulated driver call of every process until SIGCONT; the real driver holds no lock of
// its own across a stop. So while the stopped process holds it (vlake_sim_node_lock_owner, absent
// on a real driver), it is continued and stopped again a moment later. Returns the retries.
int stop_outside_driver(pid_t pid, const std::string& driver) {
  using Owner = int (*)();
  Owner owner = nullptr;
  // Loaded only to look the function up (never initialized here); a real driver lacks it.
  if (void* h = ::dlopen(driver.c_str(), RTLD_NOW | RTLD_LOCAL); h != nullptr) {
    owner = reinterpret_cast<Owner>(::dlsym(h, "vlake_sim_node_lock_owner"));
  }
  int retries = 0;
  for (;;) {
    ::kill(pid, SIGSTOP);
    int status = 0;
    ::waitpid(pid, &status, WUNTRACED);
    const int tid = owner != nullptr ? owner() : 0;
    const bool holds =
        tid > 0 && ::access(("/proc/" + std::to_string(pid) + "/task/" + std::to_string(tid)).c_str(), F_OK) == 0;
    if (!holds || retries >= 1000) return retries;
    ++retries;
    ::kill(pid, SIGCONT);
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

Json& daemon_phase(Json& j, const LatencyHistogram& h) {
  j.begin_object();
  j.key("n").value(h.count);
  j.key("p50_us").value(histogram_quantile_us(h, 0.50));
  j.key("p99_us").value(histogram_quantile_us(h, 0.99));
  j.key("mean_us").value(h.count == 0 ? 0.0 : static_cast<double>(h.sum_ns) / static_cast<double>(h.count) / 1e3);
  return j.end_object();
}

std::string run_parent(const StormOptions& o, const std::string& self_exe, const std::vector<std::string>& args) {
  char dir_template[] = "/tmp/vlake-storm-XXXXXX";
  if (::mkdtemp(dir_template) == nullptr) throw std::runtime_error(std::string("mkdtemp: ") + std::strerror(errno));
  const std::string dir = dir_template;
  ::chmod(dir.c_str(), 0777);  // tenants under other uids write their samples here
  struct Cleanup {
    std::string dir;
    int tenants;
    ~Cleanup() {
      for (int i = 0; i < tenants; ++i) ::unlink((dir + "/" + std::to_string(i) + ".bin").c_str());
      ::rmdir(dir.c_str());
    }
  } cleanup{dir, o.tenants};

  std::unique_ptr<st::StateReader> reader;
  if (!o.state.empty()) reader = std::make_unique<st::StateReader>(o.state);
  auto snap = [&]() -> LatencyHistogram {
    if (!reader) return {};
    return histogram_of(*reader->snapshot());
  };
  auto max_ns = [&]() -> std::uint64_t { return reader ? reader->snapshot()->counters.grant_latency_max_ns : 0; };

  int ready_pipe[2];
  if (::pipe2(ready_pipe, O_CLOEXEC) != 0) throw std::runtime_error("pipe2");
  UniqueFd ready_r(ready_pipe[0]);
  UniqueFd ready_w(ready_pipe[1]);
  const bool as_uids = ::geteuid() == 0 && o.uid_base >= 0;
  std::vector<Tenant> tenants(static_cast<std::size_t>(o.tenants));
  auto kill_all = [&] {
    for (Tenant& t : tenants) {
      if (t.pid > 0 && !t.done) {
        ::kill(t.pid, SIGCONT);
        ::kill(t.pid, SIGKILL);
        ::waitpid(t.pid, &t.status, 0);
        t.done = true;
      }
    }
  };
  struct KillGuard {
    decltype(kill_all)& f;
    ~KillGuard() { f(); }
  } guard{kill_all};

  for (int i = 0; i < o.tenants; ++i) {
    int start_pipe[2];
    if (::pipe2(start_pipe, O_CLOEXEC) != 0) throw std::runtime_error("pipe2");
    UniqueFd start_r(start_pipe[0]);
    tenants[static_cast<std::size_t>(i)].start.reset(start_pipe[1]);
    std::vector<std::string> a = args;
    a.insert(a.end(), {"--child", std::to_string(i), "--out-dir", dir});
    std::vector<char*> argv;
    argv.push_back(const_cast<char*>(self_exe.c_str()));
    for (auto& s : a) argv.push_back(s.data());
    argv.push_back(nullptr);
    const pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
    if (pid == 0) {
      // Only async-signal-safe calls from here to exec (besides setenv: this process has one thread).
      if (::dup2(ready_w.get(), kReadyFd) < 0 || ::dup2(start_r.get(), kStartFd) < 0) ::_exit(126);
      if (!o.hook.empty()) {
        ::setenv("LD_PRELOAD", o.hook.c_str(), 1);
        ::setenv("VLAKE_RESERVE", "0", 1);
      }
      if (as_uids) {
        // The uid makes the tenant (the quota file's default rule); the group stays root's, which
        // the simulator's node file (mode 0660) needs.
        if (::setgroups(0, nullptr) != 0 || ::setuid(static_cast<uid_t>(o.uid_base + i)) != 0) ::_exit(126);
      }
      ::execv(self_exe.c_str(), argv.data());
      ::_exit(127);
    }
    tenants[static_cast<std::size_t>(i)].pid = pid;
  }
  ready_w.reset();

  // Every tenant has its session open (or the storm cannot run).
  int ready = 0;
  const std::uint64_t ready_deadline = now_ns() + 120'000'000'000ULL;
  while (ready < o.tenants) {
    pollfd pfd{ready_r.get(), POLLIN, 0};
    const int n = ::poll(&pfd, 1, 200);
    if (n > 0) {
      char b[256];
      const ssize_t r = ::read(ready_r.get(), b, sizeof b);
      if (r > 0) ready += static_cast<int>(r);
      if (r == 0) break;  // every tenant closed it
    }
    for (std::size_t i = 0; i < tenants.size(); ++i) {
      Tenant& t = tenants[i];
      if (!t.done && ::waitpid(t.pid, &t.status, WNOHANG) == t.pid) {
        t.done = true;
        throw std::runtime_error("tenant " + std::to_string(i) + " exited before the start (status " +
                                 std::to_string(t.status) + ")");
      }
    }
    if (now_ns() > ready_deadline) throw std::runtime_error("tenants not ready after 120 s");
  }
  if (ready < o.tenants) throw std::runtime_error("only " + std::to_string(ready) + " tenants got ready");

  const LatencyHistogram h0 = snap();
  const std::uint64_t start_ms = now_epoch_ms() + 200;
  for (Tenant& t : tenants) {
    write_all(t.start.get(), &start_ms, sizeof start_ms);
    t.start.reset();
  }
  const std::int64_t ahead_ms = static_cast<std::int64_t>(start_ms) - static_cast<std::int64_t>(now_epoch_ms());
  const std::uint64_t base = now_ns() + static_cast<std::uint64_t>(std::max<std::int64_t>(0, ahead_ms)) * 1'000'000ULL;
  const int stopped = o.stop_at_ms == 0 ? -1 : (o.stop_tenant >= 0 ? o.stop_tenant : o.tenants / 2);

  LatencyHistogram h1, h2;
  int stop_retries = 0;
  if (stopped >= 0) {
    Tenant& t = tenants[static_cast<std::size_t>(stopped)];
    sleep_until_ns(base + o.stop_at_ms * 1'000'000ULL);
    h1 = snap();
    stop_retries = stop_outside_driver(t.pid, o.driver);
    sleep_until_ns(base + (o.stop_at_ms + o.stop_ms) * 1'000'000ULL);
    h2 = snap();
    ::kill(t.pid, o.stop_kill ? SIGKILL : SIGCONT);
  }
  // Every tenant ends on its own by the end of the run; one that does not within a minute more
  // is stuck.
  bool finished = true;
  const std::uint64_t deadline = base + (o.duration_ms + 60'000) * 1'000'000ULL;
  for (;;) {
    bool all = true;
    for (Tenant& t : tenants) {
      if (t.done) continue;
      if (::waitpid(t.pid, &t.status, WNOHANG) == t.pid) {
        t.done = true;
      } else {
        all = false;
      }
    }
    if (all) break;
    if (now_ns() > deadline) {
      finished = false;
      kill_all();
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const LatencyHistogram h3 = snap();
  const std::uint64_t daemon_max = max_ns();
  int failed_tenants = 0;
  for (std::size_t i = 0; i < tenants.size(); ++i) {
    const int s = tenants[i].status;
    const bool killed_on_purpose = o.stop_kill && static_cast<int>(i) == stopped;
    if (!killed_on_purpose && !(WIFEXITED(s) && WEXITSTATUS(s) == 0)) ++failed_tenants;
  }

  // The samples.
  std::vector<double> lat[2][4];  // [alloc|free][all, before, during, after] in microseconds
  std::uint64_t ops = 0;
  std::uint64_t errors = 0;
  for (int i = 0; i < o.tenants; ++i) {
    std::ifstream f(dir + "/" + std::to_string(i) + ".bin", std::ios::binary);
    StormSample s{};
    while (f.read(reinterpret_cast<char*>(&s), sizeof s)) {
      ++ops;
      if (s.op == kOpFailed) {
        ++errors;
        continue;
      }
      const int op = s.op == kOpFree ? 1 : 0;
      const double us = static_cast<double>(s.latency_ns) / 1e3;
      lat[op][0].push_back(us);
      if (i != stopped) lat[op][1 + storm_phase(s.start_ns, o)].push_back(us);
    }
  }

  static const char* const kPhases[] = {"all", "before", "during", "after"};
  Json j;
  j.begin_object();
  j.key("bench").value("storm");
  j.key("label").value(o.label);
  j.key("tenants").value(static_cast<std::uint64_t>(o.tenants));
  j.key("threads").value(static_cast<std::uint64_t>(o.threads));
  j.key("distinct_uids").value(as_uids);
  j.key("duration_ms").value(o.duration_ms);
  j.key("seed").value(o.seed);
  j.key("think_us").value(static_cast<std::uint64_t>(o.think_us));
  j.key("stopped");
  if (stopped >= 0) {
    j.begin_object();
    j.key("tenant").value(static_cast<std::uint64_t>(stopped));
    j.key("stop_retries").value(static_cast<std::uint64_t>(stop_retries));
    j.key("stop_at_ms").value(o.stop_at_ms);
    j.key("stop_ms").value(o.stop_ms);
    j.key("end").value(o.stop_kill ? "kill" : "cont");
    j.end_object();
  } else {
    j.null();
  }
  j.key("client").begin_object();
  j.key("ops").value(ops);
  j.key("errors").value(errors);
  j.key("failed_tenants").value(static_cast<std::uint64_t>(failed_tenants));
  for (int op = 0; op < 2; ++op) {
    j.key(op == 0 ? "alloc" : "free").begin_object();
    for (int p = 0; p < 4; ++p) j.key(kPhases[p]).summary(summarize(lat[op][p]));
    j.end_object();
  }
  j.end_object();
  j.key("daemon");
  if (reader) {
    j.begin_object();
    daemon_phase(j.key("all"), histogram_delta(h3, h0));
    if (stopped >= 0) {
      daemon_phase(j.key("before"), histogram_delta(h1, h0));
      daemon_phase(j.key("during"), histogram_delta(h2, h1));
      daemon_phase(j.key("after"), histogram_delta(h3, h2));
    } else {
      daemon_phase(j.key("before"), histogram_delta(h3, h0));
    }
    j.key("max_us").value(static_cast<double>(daemon_max) / 1e3);
    j.end_object();
  } else {
    j.null();
  }
  j.key("finished").value(finished);
  j.end_object();
  if (!finished) std::cerr << "vlake_bench_storm: a tenant did not finish within a minute after the run: stalled\n";
  return j.str();
}

}  // namespace

const char* storm_usage() noexcept {
  return "usage: vlake_bench_storm [--tenants K] [--threads T] [--duration-ms N] [--stop-at-ms N] [--stop-ms N]\n"
         "                         [--stop-end cont|kill] [--stop-tenant I] [--min-size SIZE] [--max-size SIZE]\n"
         "                         [--hold N] [--think-us N] [--seed N] [--uid-base N|-1] [--hook LIB]\n"
         "                         [--state NAME] [--driver PATH] [--label TEXT]\n";
}

StormOptions parse_storm(const std::vector<std::string>& args) {
  StormOptions o;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") throw std::invalid_argument("help");
    if (i + 1 >= args.size()) throw std::invalid_argument(a + " needs a value (see --help)");
    const std::string v = args[++i];
    auto size = [&] {
      const Bytes b = parse_size(v);
      if (b.value() == 0 || b.value() % kGranularity != 0) throw std::invalid_argument(a + ": a multiple of 2MiB");
      return b;
    };
    if (a == "--tenants") o.tenants = static_cast<int>(to_u64(a, v));
    else if (a == "--threads") o.threads = static_cast<int>(to_u64(a, v));
    else if (a == "--duration-ms") o.duration_ms = to_u64(a, v);
    else if (a == "--stop-at-ms") o.stop_at_ms = to_u64(a, v);
    else if (a == "--stop-ms") o.stop_ms = to_u64(a, v);
    else if (a == "--stop-end") {
      if (v != "cont" && v != "kill") throw std::invalid_argument("--stop-end: cont or kill");
      o.stop_kill = v == "kill";
    } else if (a == "--stop-tenant") o.stop_tenant = static_cast<int>(to_u64(a, v));
    else if (a == "--min-size") o.min_size = size();
    else if (a == "--max-size") o.max_size = size();
    else if (a == "--hold") o.hold = static_cast<int>(to_u64(a, v));
    else if (a == "--think-us") o.think_us = static_cast<std::uint32_t>(to_u64(a, v));
    else if (a == "--seed") o.seed = to_u64(a, v);
    else if (a == "--uid-base") o.uid_base = v == "-1" ? -1 : static_cast<long>(to_u64(a, v));
    else if (a == "--hook") o.hook = v;
    else if (a == "--state") o.state = v;
    else if (a == "--driver") o.driver = v;
    else if (a == "--label") o.label = v;
    else if (a == "--child") o.child = static_cast<int>(to_u64(a, v));
    else if (a == "--out-dir") o.out_dir = v;
    else throw std::invalid_argument("unknown option '" + a + "' (see --help)");
  }
  if (o.tenants < 1 || o.tenants > 512) throw std::invalid_argument("--tenants: 1..512");
  if (o.threads < 1 || o.threads > 64) throw std::invalid_argument("--threads: 1..64");
  if (o.hold < 1 || o.hold > 64) throw std::invalid_argument("--hold: 1..64");
  if (o.duration_ms == 0) throw std::invalid_argument("--duration-ms: > 0");
  if (o.max_size.value() < o.min_size.value()) throw std::invalid_argument("--max-size is below --min-size");
  if (o.stop_at_ms != 0 && o.stop_at_ms + o.stop_ms > o.duration_ms) {
    throw std::invalid_argument("--stop-at-ms + --stop-ms must end within --duration-ms");
  }
  if (o.stop_tenant >= o.tenants) throw std::invalid_argument("--stop-tenant: below --tenants");
  if (o.uid_base >= 0 && o.uid_base + o.tenants > 4'000'000'000L) throw std::invalid_argument("--uid-base too large");
  return o;
}

int storm_phase(std::uint64_t start_ns, const StormOptions& o) noexcept {
  if (o.stop_at_ms == 0) return 0;
  const std::uint64_t ms = start_ns / 1'000'000ULL;
  if (ms < o.stop_at_ms) return 0;
  return ms < o.stop_at_ms + o.stop_ms ? 1 : 2;
}

LatencyHistogram histogram_delta(const LatencyHistogram& b, const LatencyHistogram& a) {
  LatencyHistogram d;
  d.buckets.resize(b.buckets.size());
  for (std::size_t i = 0; i < b.buckets.size(); ++i) {
    const std::uint64_t before = i < a.buckets.size() ? a.buckets[i] : 0;
    d.buckets[i] = b.buckets[i] - std::min(b.buckets[i], before);
  }
  d.count = b.count - std::min(b.count, a.count);
  d.sum_ns = b.sum_ns - std::min(b.sum_ns, a.sum_ns);
  return d;
}

double histogram_quantile_us(const LatencyHistogram& h, double q) {
  if (h.count == 0 || h.buckets.empty()) return 0;
  const double rank = q * static_cast<double>(h.count);
  double cumulative = 0;
  double lower = 0;
  for (std::size_t i = 0; i < h.buckets.size() && i < st::kGrantLatencyBuckets; ++i) {
    const double upper = static_cast<double>(st::kGrantLatencyBoundsNs[i]) / 1e3;
    const auto n = static_cast<double>(h.buckets[i]);
    if (n > 0 && cumulative + n >= rank) return lower + (upper - lower) * ((rank - cumulative) / n);
    cumulative += n;
    lower = upper;
  }
  return lower;  // above the last bound
}

int storm_main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  StormOptions o;
  try {
    o = parse_storm(args);
  } catch (const std::invalid_argument& e) {
    if (std::string(e.what()) == "help") {
      std::cout << storm_usage();
      return 0;
    }
    std::cerr << "vlake_bench_storm: " << e.what() << "\n" << storm_usage();
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "vlake_bench_storm: " << e.what() << "\n";
    return 2;
  }
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) {
    std::cerr << "vlake_bench_storm: cannot read /proc/self/exe\n";
    return 1;
  }
  self[n] = '\0';
  try {
    if (o.child >= 0) {
      tenant_main(o);
      return 0;
    }
    const std::string out = run_parent(o, self, args);
    std::cout << out << std::endl;
    return out.find("\"finished\":true") != std::string::npos ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << "vlake_bench_storm" << (o.child >= 0 ? " tenant " + std::to_string(o.child) : std::string()) << ": "
              << e.what() << "\n";
    return 1;
  }
}

}  // namespace vlake::bench
