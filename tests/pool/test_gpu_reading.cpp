// Who an NVML reading is about (pool/src/io/gpu_reading.hpp): the processes without a session
// (each once, the daemon never), every listed pid; when a counted grant needs a fresh reading.
#include <catch2/catch.hpp>

#include <chrono>

#include "gpu_reading.hpp"

using namespace vlake::pool;
using namespace std::chrono_literals;
using vlake::Bytes;
using vlake::DeviceOrdinal;

TEST_CASE("gpu reading: processes without a session, each once in listed order, never the daemon", "[gpu_reading]") {
  const std::uint32_t daemon = 100;
  std::vector<GpuSample> reading(2);
  reading[0].device = DeviceOrdinal{0};
  reading[0].processes = {{9, Bytes{1}}, {daemon, Bytes{2}}, {7, Bytes{3}}, {50, Bytes{4}}};
  reading[1].device = DeviceOrdinal{1};
  reading[1].processes = {{7, Bytes{5}}, {11, Bytes{6}}, {50, Bytes{7}}};
  const ReadingSubjects s = reading_subjects(reading, {50}, daemon);
  CHECK(s.sessionless == std::vector<std::uint32_t>{9, 7, 11});
  CHECK(s.listed == std::set<std::uint32_t>{7, 9, 11, 50, daemon});
}

TEST_CASE("gpu reading: an empty reading is about no one", "[gpu_reading]") {
  const ReadingSubjects s = reading_subjects({}, {1, 2}, 3);
  CHECK(s.sessionless.empty());
  CHECK(s.listed.empty());
}

TEST_CASE("gpu reading: a counted grant needs a reading newer than the Hello and not too old", "[gpu_reading]") {
  const auto t0 = std::chrono::steady_clock::now();
  const auto hello = t0 + 10ms;
  // The last reading predates the Hello: its context may not be in it.
  CHECK(reading_stale(t0, hello, hello + 1ms, 100ms));
  CHECK(reading_stale(hello, hello, hello + 1ms, 100ms));
  // Taken after the Hello and recent: good enough.
  CHECK_FALSE(reading_stale(hello + 1ms, hello, hello + 2ms, 100ms));
  // Taken after the Hello but max_age old or older.
  CHECK(reading_stale(hello + 1ms, hello, hello + 101ms, 100ms));
  CHECK_FALSE(reading_stale(hello + 1ms, hello, hello + 100ms, 100ms));
}
