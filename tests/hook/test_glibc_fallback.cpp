// The fallbacks the portable hook uses where the running glibc is older than what its code and its
// static libstdc++/libgcc were built against (hook/src/interposer/glibc_floor.hpp): random bytes,
// pthread_cond_clockwait over pthread_cond_timedwait, _dl_find_object over dl_iterate_phdr
// (checked against this glibc's own _dl_find_object).
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <exception>
#include <thread>
#include <vector>

#include "glibc_floor.hpp"

using namespace vlake::hook::glibc_floor;
using namespace std::chrono_literals;

namespace {

timespec in_future(clockid_t clock, std::chrono::nanoseconds delta) {
  timespec now{};
  ::clock_gettime(clock, &now);
  const long long total = static_cast<long long>(now.tv_nsec) + delta.count();
  timespec t{};
  t.tv_sec = now.tv_sec + static_cast<time_t>(total / 1'000'000'000);
  t.tv_nsec = static_cast<long>(total % 1'000'000'000);
  if (t.tv_nsec < 0) {
    t.tv_nsec += 1'000'000'000;
    --t.tv_sec;
  }
  return t;
}

struct Waiter {
  pthread_mutex_t mutex = PTHREAD_MUTEX_INITIALIZER;
  pthread_cond_t cond = PTHREAD_COND_INITIALIZER;  // CLOCK_REALTIME, as std::condition_variable's
  ~Waiter() {
    ::pthread_cond_destroy(&cond);
    ::pthread_mutex_destroy(&mutex);
  }

  // Waits once until `deadline` on `clock`; returns the result and how long it took.
  std::pair<int, std::chrono::nanoseconds> wait(clockid_t clock, const timespec& deadline) {
    REQUIRE(::pthread_mutex_lock(&mutex) == 0);
    const auto start = std::chrono::steady_clock::now();
    const int rc = cond_clockwait_by_timedwait(&cond, &mutex, clock, &deadline);
    const auto took = std::chrono::steady_clock::now() - start;
    CHECK(::pthread_mutex_trylock(&mutex) == EBUSY);  // held on return
    REQUIRE(::pthread_mutex_unlock(&mutex) == 0);
    return {rc, took};
  }
};

int some_function(int x) { return x * 3 + 1; }

}  // namespace

TEST_CASE("fill_random fills buffers with the kernel's random bytes") {
  std::array<unsigned char, 64> a{};
  std::array<unsigned char, 64> b{};
  REQUIRE(fill_random(a.data(), a.size()) == 0);
  REQUIRE(fill_random(b.data(), b.size()) == 0);
  CHECK(a != b);                                // 2^-512 to fail by chance
  CHECK(a != std::array<unsigned char, 64>{});  // not left zero
  CHECK(fill_random(a.data(), 0) == 0);
  std::vector<unsigned char> big(4 << 20);  // several getrandom calls' worth
  REQUIRE(fill_random(big.data(), big.size()) == 0);
  const std::array<unsigned char, 64> zero{};
  CHECK(std::vector<unsigned char>(big.end() - 64, big.end()) != std::vector<unsigned char>(zero.begin(), zero.end()));
}

TEST_CASE("cond_clockwait_by_timedwait waits until a CLOCK_MONOTONIC deadline") {
  Waiter w;
  const auto [rc, took] = w.wait(CLOCK_MONOTONIC, in_future(CLOCK_MONOTONIC, 80ms));
  CHECK(rc == ETIMEDOUT);
  CHECK(took >= 78ms);  // the realtime deadline is derived from two clock reads
  CHECK(took < 5s);
}

TEST_CASE("cond_clockwait_by_timedwait waits until a CLOCK_REALTIME deadline") {
  Waiter w;
  const auto [rc, took] = w.wait(CLOCK_REALTIME, in_future(CLOCK_REALTIME, 40ms));
  CHECK(rc == ETIMEDOUT);
  CHECK(took >= 39ms);
  CHECK(took < 5s);
}

TEST_CASE("cond_clockwait_by_timedwait returns at once for a deadline in the past") {
  Waiter w;
  const auto [rc, took] = w.wait(CLOCK_MONOTONIC, in_future(CLOCK_MONOTONIC, -10s));
  CHECK(rc == ETIMEDOUT);
  CHECK(took < 1s);
  timespec epoch{};  // monotonic zero: long before now, whatever the machine's uptime
  const auto [rc0, took0] = w.wait(CLOCK_MONOTONIC, epoch);
  CHECK(rc0 == ETIMEDOUT);
  CHECK(took0 < 1s);
}

TEST_CASE("cond_clockwait_by_timedwait wakes on a signal before its deadline") {
  Waiter w;
  std::atomic<bool> waiting{false};
  bool ready = false;
  std::thread signaller([&] {
    while (!waiting.load()) std::this_thread::sleep_for(1ms);
    ::pthread_mutex_lock(&w.mutex);  // the waiter has released it inside the wait
    ready = true;
    ::pthread_cond_signal(&w.cond);
    ::pthread_mutex_unlock(&w.mutex);
  });
  REQUIRE(::pthread_mutex_lock(&w.mutex) == 0);
  const timespec deadline = in_future(CLOCK_MONOTONIC, 20s);
  const auto start = std::chrono::steady_clock::now();
  waiting.store(true);
  int rc = 0;
  while (!ready && rc == 0) rc = cond_clockwait_by_timedwait(&w.cond, &w.mutex, CLOCK_MONOTONIC, &deadline);
  const auto took = std::chrono::steady_clock::now() - start;
  REQUIRE(::pthread_mutex_unlock(&w.mutex) == 0);
  signaller.join();
  CHECK(rc == 0);
  CHECK(ready);
  CHECK(took < 10s);
}

TEST_CASE("cond_clockwait_by_timedwait refuses other clocks and malformed deadlines") {
  Waiter w;
  timespec t = in_future(CLOCK_MONOTONIC, 10s);
  CHECK(w.wait(CLOCK_PROCESS_CPUTIME_ID, t).first == EINVAL);
  t.tv_nsec = 1'000'000'000;
  CHECK(w.wait(CLOCK_MONOTONIC, t).first == EINVAL);
  t.tv_nsec = -1;
  CHECK(w.wait(CLOCK_REALTIME, t).first == EINVAL);
}

#ifdef DLFO_STRUCT_HAS_EH_DBASE
TEST_CASE("find_object_by_phdr agrees with glibc's _dl_find_object") {
  int on_stack = 0;
  struct Probe {
    const char* what;
    void* address;
  };
  const std::vector<Probe> probes = {
      {"a function of the test program", reinterpret_cast<void*>(&some_function)},
      {"a function of libc", reinterpret_cast<void*>(&::getpid)},
      {"a function of the dynamic loader", reinterpret_cast<void*>(&::_dl_find_object)},
      {"a function of libstdc++", reinterpret_cast<void*>(&std::terminate)},
  };
  for (const Probe& p : probes) {
    INFO(p.what);
    dl_find_object real{};
    dl_find_object mine{};
    REQUIRE(::_dl_find_object(p.address, &real) == 0);
    REQUIRE(find_object_by_phdr(p.address, &mine) == 0);
    CHECK(mine.dlfo_eh_frame == real.dlfo_eh_frame);
    CHECK(mine.dlfo_eh_frame != nullptr);
    CHECK(mine.dlfo_link_map == real.dlfo_link_map);
    CHECK(mine.dlfo_flags == 0);
    const auto a = reinterpret_cast<std::uintptr_t>(p.address);
    CHECK(reinterpret_cast<std::uintptr_t>(mine.dlfo_map_start) <= a);
    CHECK(a < reinterpret_cast<std::uintptr_t>(mine.dlfo_map_end));
    CHECK(reinterpret_cast<std::uintptr_t>(mine.dlfo_map_start) >=
          reinterpret_cast<std::uintptr_t>(real.dlfo_map_start));
    CHECK(reinterpret_cast<std::uintptr_t>(mine.dlfo_map_end) <= reinterpret_cast<std::uintptr_t>(real.dlfo_map_end));
  }
  dl_find_object none{};
  CHECK(::_dl_find_object(&on_stack, &none) == -1);
  CHECK(find_object_by_phdr(&on_stack, &none) == -1);
}
#endif
