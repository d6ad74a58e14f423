// The state segment (contracts/state.hpp): creation, resume, the seqlock snapshot, refusal of
// a segment of another layout.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>

#include "vlake/contracts/state.hpp"

namespace st = vlake::state;

TEST_CASE("state segment: created, resumed, refused on mismatch, consistent snapshots", "[contracts][state]") {
  const std::string name = "pt" + std::to_string(::getpid()) + "-state-unit";
  st::StateSegment::Origin origin{};
  {
    st::StateSegment seg(name);
    origin = seg.origin();
    {
      st::StateSegment::Write w(seg);
      seg.state().counters.grants = 42;
    }
  }
  CHECK(origin == st::StateSegment::Origin::created);
  {
    st::StateSegment seg(name);
    CHECK(seg.origin() == st::StateSegment::Origin::resumed);
    CHECK(seg.state().counters.grants == 42);
    st::StateReader reader(name);
    // A writer flipping two fields together, about as often as a busy daemon writes (thousands
    // of times a second; a writer that never pauses would starve a seqlock reader of the 1 MiB
    // copy); readers must never see the two fields differ.
    std::atomic<bool> stop{false};
    std::thread writer([&] {
      for (std::uint64_t i = 0; !stop.load(); ++i) {
        {
          st::StateSegment::Write w(seg);
          seg.state().counters.releases = i;
          seg.state().grants[st::kMaxGrants - 1].bytes = i;
        }
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
    });
    int torn = 0;
    int odd = 0;
    std::string error;
    try {
      for (int i = 0; i < 200; ++i) {
        const auto s = reader.snapshot();
        if (s->counters.releases != s->grants[st::kMaxGrants - 1].bytes) ++torn;
        if ((s->header.generation & 1) != 0) ++odd;
      }
    } catch (const std::exception& e) {
      error = e.what();
    }
    stop = true;
    writer.join();
    CHECK(error.empty());
    CHECK(odd == 0);
    CHECK(torn == 0);
    seg.remove();
  }
  // A segment of another layout is refused with how to reset it.
  {
    std::string bytes(4096, '\0');
    st::Header h{};
    h.magic = st::kMagic;
    h.layout_version = 99;
    std::memcpy(bytes.data(), &h, sizeof h);
    std::ofstream(st::segment_path(name), std::ios::binary)
        .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  try {
    st::StateSegment seg(name);
    FAIL("accepted a foreign layout");
  } catch (const st::StateError& e) {
    CHECK_THAT(e.what(), Catch::Contains("layout version 99"));
    CHECK_THAT(e.what(), Catch::Contains("remove " + st::segment_path(name)));
  }
  CHECK_THROWS_AS(st::StateReader(name), st::StateError);
  ::unlink(st::segment_path(name).c_str());
  CHECK_THROWS_WITH(st::StateReader(name), Catch::Contains("cannot open state segment"));
}

TEST_CASE("state names: refusal reasons and the swap states whose memory is on the host", "[contracts][state]") {
  const char* const names[] = {"tenant_limit",  "namespace_limit", "guarantee", "out_of_memory",
                               "limit_reached", "unknown_device",  "internal",  "restore_timeout"};
  static_assert(sizeof names / sizeof names[0] == st::kRefusalReasons);
  CHECK(std::string(st::refusal_reason_name(st::kRefusalTenantLimit)) == "tenant_limit");
  CHECK(std::string(st::refusal_reason_name(st::kRefusalRestoreTimeout)) == "restore_timeout");
  for (std::uint32_t r = 1; r <= st::kRefusalReasons; ++r)
    CHECK(std::string(st::refusal_reason_name(r)) == names[r - 1]);
  CHECK(std::string(st::refusal_reason_name(0)) == "unknown");
  CHECK(std::string(st::refusal_reason_name(st::kRefusalReasons + 1)) == "unknown");
  CHECK_FALSE(st::swapped_out(st::kSwapNone));
  CHECK_FALSE(st::swapped_out(st::kSwapNotified));
  CHECK_FALSE(st::swapped_out(st::kSwapCheckpointing));
  CHECK(st::swapped_out(st::kSwapHost));
  CHECK(st::swapped_out(st::kSwapRestoring));
  CHECK(st::swapped_out(st::kSwapLost));
}
