#include "pool_watch.hpp"

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <iostream>
#include <thread>

#include "bench_support.hpp"
#include "vlake/contracts/state.hpp"

namespace vlake::bench {

namespace {
std::atomic<bool> g_stop{false};
void on_signal(int) { g_stop.store(true); }

struct DevMax {
  std::uint64_t pool_max = 0;
  std::uint64_t granted_max = 0;
};
}  // namespace

int poolwatch_main(int argc, char** argv) {
  std::string state;
  long interval_ms = 20;
  long duration_ms = -1;
  bool once = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
      return argv[++i];
    };
    try {
      if (a == "--state") state = value();
      else if (a == "--interval-ms") interval_ms = std::max(1L, std::stol(value()));
      else if (a == "--duration-ms") duration_ms = std::stol(value());
      else if (a == "--once") once = true;
      else throw std::invalid_argument("unknown option '" + a + "'");
    } catch (const std::exception& e) {
      std::cerr << "vlake_bench_poolwatch: " << e.what()
                << "\nusage: vlake_bench_poolwatch --state NAME [--interval-ms N] [--duration-ms N | --once]\n";
      return 2;
    }
  }
  if (state.empty()) {
    std::cerr << "vlake_bench_poolwatch: --state is required\n";
    return 2;
  }
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGINT, &sa, nullptr);

  namespace st = vlake::state;
  std::unique_ptr<st::State> last;
  DevMax dev[st::kMaxDevices];
  std::uint64_t samples = 0;
  try {
    st::StateReader reader(state);
    const auto t0 = std::chrono::steady_clock::now();
    for (;;) {
      last = reader.snapshot();
      ++samples;
      for (std::uint32_t d = 0; d < st::kMaxDevices; ++d) {
        const auto& r = last->devices[d];
        if (r.in_use == 0) continue;
        dev[d].pool_max = std::max(dev[d].pool_max, r.pool_bytes);
        dev[d].granted_max = std::max(dev[d].granted_max, r.granted_bytes);
      }
      if (once || g_stop.load()) break;
      if (duration_ms >= 0 && std::chrono::steady_clock::now() - t0 >= std::chrono::milliseconds(duration_ms)) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(interval_ms));
    }
  } catch (const std::exception& e) {
    std::cerr << "vlake_bench_poolwatch: " << e.what() << "\n";
    return 1;
  }
  Json j;
  j.begin_object();
  j.key("samples").value(samples);
  j.key("counters").begin_object();
  j.key("requests").value(last->counters.requests);
  j.key("grants").value(last->counters.grants);
  j.key("releases").value(last->counters.releases);
  j.end_object();
  j.key("devices").begin_array();
  for (std::uint32_t d = 0; d < st::kMaxDevices; ++d) {
    const auto& r = last->devices[d];
    if (r.in_use == 0) continue;
    j.begin_object();
    j.key("ordinal").value(static_cast<std::uint64_t>(r.ordinal));
    j.key("pool_bytes").value(r.pool_bytes);
    j.key("pool_bytes_max").value(dev[d].pool_max);
    j.key("granted_bytes_max").value(dev[d].granted_max);
    j.key("pool_peak_bytes").value(r.pool_peak_bytes);
    j.end_object();
  }
  j.end_array();
  j.end_object();
  std::cout << j.str() << std::endl;
  return 0;
}

}  // namespace vlake::bench
