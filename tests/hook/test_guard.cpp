// Out-of-bounds guards, hook side: the fault-mode layout (right-aligned pointers followed by
// unmapped guard VA), pointer lookups on it, and the kernel fault report (GuardEvent) a fault produces
// (vlake_hook_tenant under LD_PRELOAD, simulated driver, fake daemon).
// cuda.h as vlake's own headers include it (cuda_api.hpp: the legacy names visible), which the
// other files of this target's unity batch may include first; this file uses only its types.
#ifndef __CUDA_API_VERSION_INTERNAL
#define __CUDA_API_VERSION_INTERNAL 1
#endif
#include <cuda.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>

#include "daemon_case.hpp"
#include "support.hpp"

using namespace hooktest;
using vlake::proto::GuardKind;
using vlake::proto::GuardMode;

namespace {

FakeDaemonOptions with_mode(GuardMode mode) {
  FakeDaemonOptions o;
  o.limit = 256 * MiB;
  o.guard_mode = mode;
  return o;
}

std::uint64_t ptr_of(const std::string& out, const std::string& step) {
  return std::strtoull(line_of(out, step)["ptr"].c_str(), nullptr, 16);
}

constexpr const char* kFaultLine =
    "vlake: GPU fault (CUDA_ERROR_ILLEGAL_ADDRESS) on GPU 0 in cuCtxSynchronize; reported to "
    "vlaked as a kernel fault; the newest allocations were: ";

}  // namespace

TEST_CASE("guard fault mode: pointers end at their chunk's end and lookups use them") {
  Fixture f(with_mode(GuardMode::fault));
  const auto r = f.run({"init",          "alloc:a:1M",  "layout:a",         "alloc:b:1000",  "layout:b",
                        "alloc:c:6M",    "layout:c",    "pitch:p:1000:3:4", "layout:p",      "async:q:4K",
                        "layout:q",      "range:a:4K",  "attr:a:4K",        "range:b:999",   "attr:c:5M",
                        "fill:b:1000:9", "fill:c:6M:3", "kfill:a:0:262144", "kfill:b:0:250", "sync#inside",
                        "free:b",        "free:c",      "freeasync:q",      "free:p",        "free:a",
                        "info"});
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  REQUIRE(r.status == 0);
  for (const char* step : {"layout:a", "layout:c", "layout:p", "layout:q"}) {
    auto l = line_of(r.out, step);
    INFO(step);
    CHECK(l["rc"] == "0");
    CHECK(l["align"] == "0");
    CHECK(l["tail"] == "0");  // ends exactly at the end of its last chunk
    CHECK(l["range_base_off"] == "0");
  }
  auto b = line_of(r.out, "layout:b");
  CHECK(b["align"] == "0");
  CHECK(b["tail"] == "24");  // 1000 rounded up to 256 B ends at the chunk's end
  CHECK(b["range_size"] == "1000");
  CHECK(line_of(r.out, "layout:a")["range_size"] == num(MiB));
  CHECK(line_of(r.out, "layout:c")["range_size"] == num(6 * MiB));
  CHECK(line_of(r.out, "pitch:p:1000:3:4")["pitch"] == "1024");
  CHECK(line_of(r.out, "layout:p")["range_size"] == num(3 * 1024));
  // Range and attribute queries from inside answer [ptr, ptr + size) (offsets are relative to
  // the returned pointer).
  auto ra = line_of(r.out, "range:a:4K");
  CHECK(ra["rc"] == "0");
  CHECK(ra["base_off"] == "0");
  CHECK(ra["size"] == num(MiB));
  CHECK(line_of(r.out, "range:b:999")["base_off"] == "0");
  auto at = line_of(r.out, "attr:a:4K");
  CHECK(at["rc"] == "0");
  CHECK(at["start_off"] == "0");
  CHECK(at["size"] == num(MiB));
  CHECK(at["multi_rc"] == "0");
  CHECK(at["ordinal"] == "0");
  CHECK(at["multi_start_off"] == "0");
  CHECK(at["multi_size"] == num(MiB));
  auto ac = line_of(r.out, "attr:c:5M");
  CHECK(ac["start_off"] == "0");
  CHECK(ac["size"] == num(6 * MiB));
  CHECK(line_of(r.out, "fill:b:1000:9")["ok"] == "1");
  CHECK(line_of(r.out, "fill:c:6M:3")["ok"] == "1");
  // Writes that stay inside do not fault.
  CHECK(line_of(r.out, "kfill:a:0:262144")["rc"] == "0");
  CHECK(line_of(r.out, "sync#inside")["rc"] == "0");
  for (const char* step : {"free:b", "free:c", "freeasync:q", "free:p", "free:a"}) {
    INFO(step);
    CHECK(line_of(r.out, step)["rc"] == "0");
  }
  const Counters c = f.daemon->counters();
  CHECK(c.outstanding == 0);
  CHECK(c.releases == 5);
  CHECK(c.guard_events.empty());
  CHECK(count_lines(r.err, "GPU fault") == 0);
}

TEST_CASE("guard fault mode: a kernel writing one element past the end faults and is reported") {
  Fixture f(with_mode(GuardMode::fault));
  const auto r = f.run({"init", "alloc:old:64K", "alloc:gone:8K", "free:gone", "alloc:a:1M", "alloc:b:3000",
                        "kfill:b:0:750#inside", "sync#inside", "kfill:a:0:262145#overrun", "sync#1", "sync#2"});
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  REQUIRE(r.status == 0);
  CHECK(line_of(r.out, "sync#inside")["rc"] == "0");
  CHECK(line_of(r.out, "kfill:a:0:262145#overrun")["rc"] == "0");  // faults are asynchronous
  CHECK(line_of(r.out, "sync#1")["rc"] == num(CUDA_ERROR_ILLEGAL_ADDRESS));
  CHECK(line_of(r.out, "sync#2")["rc"] == num(CUDA_ERROR_ILLEGAL_ADDRESS));
  const Counters c = f.daemon->counters();
  REQUIRE(c.guard_events.size() == 1);  // once per process
  const auto& ev = c.guard_events[0];
  CHECK(ev.kind == GuardKind::fault);
  CHECK(ev.cuda_status == CUDA_ERROR_ILLEGAL_ADDRESS);
  CHECK(std::string(ev.call) == "cuCtxSynchronize");
  CHECK(c.guard_event_devices[0] == 0);
  CHECK(ev.live_allocations == 3);
  REQUIRE(ev.suspect_count == 3);
  CHECK(ev.suspects[0].address == ptr_of(r.out, "alloc:b:3000"));
  CHECK(ev.suspects[0].bytes == 3000);
  CHECK(ev.suspects[1].address == ptr_of(r.out, "alloc:a:1M"));
  CHECK(ev.suspects[1].bytes == MiB);
  CHECK(ev.suspects[2].address == ptr_of(r.out, "alloc:old:64K"));
  CHECK(ev.suspects[2].bytes == 64 * 1024);
  CHECK(ev.suspects[0].age_ns <= ev.suspects[2].age_ns);
  CHECK(ev.suspects[2].age_ns < 60'000'000'000ULL);
  CHECK(count_lines(r.err, kFaultLine) == 1);
  CHECK(count_lines(r.err, "GPU fault") == 1);
}

TEST_CASE("guard fault mode: at most 8 suspects, the newest, and other sync calls report") {
  Fixture f(with_mode(GuardMode::fault));
  std::vector<std::string> steps = {"init"};
  for (int i = 0; i < 10; ++i) steps.push_back("alloc:v" + std::to_string(i) + ":4K");
  steps.push_back("kfillstream:v0:4K:1");
  steps.push_back("streamsync");
  const auto r = f.run(steps);
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  REQUIRE(r.status == 0);
  CHECK(line_of(r.out, "streamsync")["rc"] == num(CUDA_ERROR_ILLEGAL_ADDRESS));
  const Counters c = f.daemon->counters();
  REQUIRE(c.guard_events.size() == 1);
  const auto& ev = c.guard_events[0];
  CHECK(std::string(ev.call) == "cuStreamSynchronize");
  CHECK(ev.live_allocations == 10);
  REQUIRE(ev.suspect_count == vlake::proto::kMaxGuardSuspects);
  for (unsigned i = 0; i < ev.suspect_count; ++i) {
    INFO(i);
    CHECK(ev.suspects[i].address == ptr_of(r.out, "alloc:v" + std::to_string(9 - i) + ":4K"));
  }
  CHECK(count_lines(r.err,
                    "GPU fault (CUDA_ERROR_ILLEGAL_ADDRESS) on GPU 0 in "
                    "cuStreamSynchronize; reported to vlaked as a kernel fault") == 1);
}

TEST_CASE("guard off and canary modes: allocations start at the chunk start, no guard VA") {
  const GuardMode mode = GENERATE(GuardMode::off, GuardMode::canary);
  INFO("mode " << static_cast<int>(mode));
  Fixture f(with_mode(mode));
  const auto r = f.run({"init", "alloc:a:1M", "layout:a", "alloc:b:1000", "layout:b", "range:a:4K",
                        "kfill:a:1M:1#slack", "sync#slack", "free:b", "free:a"});
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  REQUIRE(r.status == 0);
  auto a = line_of(r.out, "layout:a");
  CHECK(a["tail"] == num(MiB));  // starts at the chunk start: the rest of the chunk is slack
  CHECK(line_of(r.out, "layout:b")["tail"] == num(2 * MiB - 1000));
  CHECK(line_of(r.out, "range:a:4K")["base_off"] == "0");
  CHECK(line_of(r.out, "range:a:4K")["size"] == num(MiB));
  // One element past the end lands in mapped slack: no fault without guard VA.
  CHECK(line_of(r.out, "sync#slack")["rc"] == "0");
  CHECK(line_of(r.out, "free:a")["rc"] == "0");
  CHECK(f.daemon->counters().guard_events.empty());
}

TEST_CASE("guard off mode: a kernel fault is still reported once") {
  Fixture f(with_mode(GuardMode::off));
  const auto r = f.run({"init", "alloc:a:2M", "kfill:a:64G:1#far", "sync#1", "sync#2"});
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  REQUIRE(r.status == 0);
  CHECK(line_of(r.out, "sync#1")["rc"] == num(CUDA_ERROR_ILLEGAL_ADDRESS));
  const Counters c = f.daemon->counters();
  REQUIRE(c.guard_events.size() == 1);
  CHECK(c.guard_events[0].suspect_count == 1);
  CHECK(c.guard_events[0].suspects[0].address == ptr_of(r.out, "alloc:a:2M"));
  CHECK(count_lines(r.err, kFaultLine) == 1);
}
