// The allocation policy (hook/src/alloc/policy.hpp) over fakes: no process, no driver, no daemon.
// One case per rule; each fails if its rule is removed.
#include <catch2/catch.hpp>

#include <deque>
#include <ostream>
#include <utility>
#include <vector>

#include "alloc/policy.hpp"
#include "units.hpp"

using namespace vlake;
using namespace vlake::hook;
using namespace vlake::hook::alloc;
using proto::GrantPurpose;
using proto::Status;

using namespace vlake::testunits;  // kMiB, kGiB, MiB (units.hpp)

namespace {

constexpr std::uint64_t kGran = 2 * MiB;
const DeviceOrdinal kDev{0};
CUcontext const kCtx = reinterpret_cast<CUcontext>(0x10);

Answer reply(Status st, std::uint64_t bytes = kGran, std::uint64_t limit = 1024 * MiB, std::uint64_t used = 0) {
  Answer a;
  a.kind = Answer::Kind::reply;
  a.result.status = st;
  a.result.grant_id = st == Status::ok ? 7 : 0;
  a.result.bytes = bytes;
  a.result.limit = limit;
  a.result.used = used;
  a.granularity = kGran;
  return a;
}

Answer no_reply(Answer::Kind kind) {
  Answer a;
  a.kind = kind;
  a.why = "why";
  return a;
}

struct FakeDaemon : Daemon {
  std::deque<Answer> answers;  // scripted; ok when none is left
  std::vector<GrantPurpose> asked;
  std::vector<std::pair<std::uint64_t, std::uint32_t>> released;
  int dropped = 0;
  bool overcommitting = false;

  FakeDaemon& then(Answer a) {
    answers.push_back(std::move(a));
    return *this;
  }
  Answer grant(const Uuid&, Bytes, GrantPurpose purpose, std::uint32_t) override {
    asked.push_back(purpose);
    if (answers.empty()) return reply(Status::ok);
    Answer a = std::move(answers.front());
    answers.pop_front();
    return a;
  }
  void release(std::uint64_t grant_id, std::uint32_t flags) override { released.emplace_back(grant_id, flags); }
  void drop_kept(DeviceOrdinal) override { ++dropped; }
  bool overcommit() override { return overcommitting; }
};

struct FakeDriver : Driver {
  CUresult map_rc = CUDA_SUCCESS;
  int mapped = 0;
  int placed = 0;
  std::size_t retired = 0;
  std::vector<std::pair<CUdeviceptr, std::uint64_t>> counted;
  std::uint64_t queued = 0;
  std::uint64_t completed = 0;
  std::uint64_t completes_on_settle = 0;  // frees a settle finds the streams have passed
  int settled = 0;
  int hits = 0;
  int misses = 0;

  CUresult device_uuid(DeviceOrdinal, Uuid& out) override {
    out = Uuid{};
    return CUDA_SUCCESS;
  }
  CUresult map(GrantResult&, DeviceOrdinal, CUcontext, Bytes, CUdeviceptr* dptr) override {
    if (map_rc != CUDA_SUCCESS) return map_rc;
    ++mapped;
    *dptr = 0x1000;
    return CUDA_SUCCESS;
  }
  void place(LogicalAlloc a, bool, CUcontext, Bytes, CUdeviceptr* dptr) override {
    ++placed;
    *dptr = static_cast<CUdeviceptr>(a.base);
  }
  void retire(std::vector<ReserveBlock>& blocks) override {
    retired += blocks.size();
    blocks.clear();
  }
  void record_counted(CUdeviceptr ptr, std::uint64_t grant_id) override { counted.emplace_back(ptr, grant_id); }
  std::uint64_t frees_queued() override { return queued; }
  std::uint64_t frees_completed() override { return completed; }
  void settle_frees(bool) override {
    ++settled;
    completed += completes_on_settle;
  }
  void prefetch_hit(DeviceOrdinal, Bytes, CUcontext) override { ++hits; }
  void prefetch_miss(DeviceOrdinal, Bytes, CUcontext) override { ++misses; }
};

struct FakeReports : Reports {
  int refusals = 0;
  int limit_refusals = 0;
  int unreachables = 0;
  int passthroughs = 0;
  int map_failures = 0;
  void refusal(const GrantResult&, DeviceOrdinal, Bytes) override { ++refusals; }
  void limit_refusal(const std::string&, DeviceOrdinal, Bytes) override { ++limit_refusals; }
  void unreachable(const std::string&, DeviceOrdinal, Bytes) override { ++unreachables; }
  void passthrough(const std::string&) override { ++passthroughs; }
  void map_failed(DeviceOrdinal, Bytes, CUresult) override { ++map_failures; }
};

// What a request did: requests sent, refusals reported, settles, reserve blocks retired.
struct Tally {
  std::size_t asked = 0;
  int refusals = 0;
  int settled = 0;
  std::size_t retired = 0;
  bool operator==(const Tally&) const = default;
};

std::ostream& operator<<(std::ostream& o, const Tally& t) {
  return o << "{asked " << t.asked << ", refusals " << t.refusals << ", settled " << t.settled << ", retired "
           << t.retired << "}";
}

// A policy over fakes; `reserve_bytes` 0: no local reserve.
struct Rig {
  explicit Rig(std::uint64_t reserve_bytes = 0, OnUnreachable on_unreachable = OnUnreachable::refuse)
      : reserve(reserve_bytes, std::chrono::seconds(10)), policy(daemon, driver, reports, reserve, on_unreachable) {}

  CUresult alloc(std::uint64_t bytes = kGran) {
    return policy.serve_alloc(kDev, kCtx, Bytes{bytes}, &ptr, [this] {
      ++direct;
      return direct_rc;
    });
  }
  // Learns the granularity from one grant (the reserve is only used once it is known).
  void learn_granularity() {
    REQUIRE(alloc() == CUDA_SUCCESS);
    daemon.asked.clear();
    driver.mapped = 0;
    driver.misses = 0;
  }
  void put_block(std::uint64_t bytes, bool prefetched = false) {
    ReserveBlock b;
    b.alloc.base = 0x2000;
    b.alloc.mapped = bytes;
    b.alloc.reserved = bytes;
    b.alloc.device = kDev.value();
    b.prefetched = prefetched;
    REQUIRE(reserve.put(std::move(b)).empty());
  }

  [[nodiscard]] Tally tally() const {
    return Tally{daemon.asked.size(), reports.refusals, driver.settled, driver.retired};
  }

  FakeDaemon daemon;
  FakeDriver driver;
  FakeReports reports;
  LocalReserve reserve;
  AllocPolicy policy;
  CUdeviceptr ptr = 0;
  int direct = 0;
  CUresult direct_rc = CUDA_SUCCESS;
};

}  // namespace

TEST_CASE("alloc policy: a reserve hit is placed without asking the daemon", "[alloc_policy]") {
  Rig r(64 * MiB);
  r.learn_granularity();
  r.put_block(kGran);
  CHECK(r.alloc() == CUDA_SUCCESS);
  CHECK(r.daemon.asked.empty());
  CHECK(r.driver.placed == 1);
  CHECK(r.ptr == 0x2000);
  CHECK(r.driver.hits == 0);
}

TEST_CASE("alloc policy: a prefetched block used tells the prefetcher", "[alloc_policy]") {
  Rig r(64 * MiB);
  r.learn_granularity();
  r.put_block(kGran, /*prefetched=*/true);
  CHECK(r.alloc() == CUDA_SUCCESS);
  CHECK(r.driver.hits == 1);
}

TEST_CASE("alloc policy: drop_kept drops the kept mappings and asks again", "[alloc_policy]") {
  Rig r;
  r.daemon.then(reply(Status::drop_kept)).then(reply(Status::drop_kept));
  CHECK(r.alloc() == CUDA_SUCCESS);
  CHECK(r.daemon.dropped == 2);
  CHECK(r.daemon.asked.size() == 3);
  CHECK(r.driver.mapped == 1);
}

TEST_CASE("alloc policy: drop_kept rounds stop after four", "[alloc_policy]") {
  Rig r;
  for (int i = 0; i < 6; ++i) r.daemon.then(reply(Status::drop_kept));
  CHECK(r.alloc() == CUDA_ERROR_OUT_OF_MEMORY);
  CHECK(r.tally() == Tally{kDropKeptRounds + 1, 1, 0, 0});
  CHECK(r.daemon.dropped == kDropKeptRounds);
}

TEST_CASE("alloc policy: a refusal is retried once when the reserve or stream-ordered frees give memory back",
          "[alloc_policy]") {
  // A refusal, what could be given back, and what the policy does about it.
  struct RefusalCase {
    const char* name;
    bool reserve;                       // a 64 MiB reserve, the granularity learned
    bool block;                         // a 4-granule block (too large for the request) in the reserve
    std::uint64_t queued;               // stream-ordered frees outstanding
    std::uint64_t completes_on_settle;  // of those, passed once settled
    std::vector<Status> replies;        // the daemon's answers, in order
    CUresult rc;
    Tally tally;
  };
  const RefusalCase cases[] = {
      {"a quota refusal drains the reserve and asks once more",
       true,
       true,
       0,
       0,
       {Status::over_limit},
       CUDA_SUCCESS,
       Tally{2, 0, 1, 1}},
      {"a quota refusal settles stream-ordered frees and asks once more",
       false,
       false,
       1,
       1,
       {Status::out_of_memory},
       CUDA_SUCCESS,
       Tally{2, 0, 1, 0}},
      // once more, not twice
      {"the retry is refused: reported once, after it",
       true,
       true,
       0,
       0,
       {Status::over_limit, Status::over_limit, Status::ok},
       CUDA_ERROR_OUT_OF_MEMORY,
       Tally{2, 1, 1, 1}},
      // a free outstanding that the streams have not passed
      {"nothing given back: no retry, the refusal reported once",
       true,
       false,
       1,
       0,
       {Status::guarantee},
       CUDA_ERROR_OUT_OF_MEMORY,
       Tally{1, 1, 1, 0}},
      {"without reserve or frees the first refusal is reported, no settle",
       false,
       false,
       0,
       0,
       {Status::over_limit},
       CUDA_ERROR_OUT_OF_MEMORY,
       Tally{1, 1, 0, 0}},
      {"a refusal the reserve cannot change is reported without a retry",
       true,
       true,
       0,
       0,
       {Status::limit_reached},
       CUDA_ERROR_OUT_OF_MEMORY,
       Tally{1, 1, 0, 0}},
  };
  for (const RefusalCase& c : cases) {
    INFO(c.name);
    Rig r(c.reserve ? 64 * MiB : 0);
    if (c.reserve) r.learn_granularity();
    if (c.block) r.put_block(4 * kGran);
    r.driver.queued = c.queued;
    r.driver.completes_on_settle = c.completes_on_settle;
    for (const Status st : c.replies) r.daemon.then(reply(st));
    CHECK(r.alloc() == c.rc);
    CHECK(r.tally() == c.tally);
  }
}

TEST_CASE("alloc policy: no answer is a passthrough only for an unreachable daemon so configured", "[alloc_policy]") {
  // The daemon gave no grant (`kind`) under VLAKE_ON_UNREACHABLE=`mode`: the request's outcome and
  // what was reported.
  struct NoAnswerCase {
    const char* name;
    OnUnreachable mode;
    Answer::Kind kind;
    CUresult rc;
    int direct;  // allocations the driver made directly
    int passthroughs;
    int unreachables;
    int limit_refusals;
  };
  const NoAnswerCase cases[] = {
      {"unreachable, VLAKE_ON_UNREACHABLE=passthrough: the driver allocates", OnUnreachable::passthrough,
       Answer::Kind::unreachable, CUDA_SUCCESS, 1, 1, 0, 0},
      {"unreachable, refuse: out of memory, reported", OnUnreachable::refuse, Answer::Kind::unreachable,
       CUDA_ERROR_OUT_OF_MEMORY, 0, 0, 1, 0},
      {"the daemon refusing the process is never a passthrough", OnUnreachable::passthrough, Answer::Kind::refused,
       CUDA_ERROR_OUT_OF_MEMORY, 0, 0, 0, 1},
  };
  for (const NoAnswerCase& c : cases) {
    INFO(c.name);
    Rig r(0, c.mode);
    r.daemon.then(no_reply(c.kind));
    CHECK(r.alloc() == c.rc);
    CHECK(r.direct == c.direct);
    CHECK(r.reports.passthroughs == c.passthroughs);
    CHECK(r.reports.unreachables == c.unreachables);
    CHECK(r.reports.limit_refusals == c.limit_refusals);
    CHECK(r.driver.mapped == 0);  // nothing granted, nothing mapped
  }
}

TEST_CASE("alloc policy: an overcommit tenant's allocation takes the counted path", "[alloc_policy]") {
  Rig r(64 * MiB);
  r.daemon.overcommitting = true;
  SECTION("charged, allocated by the driver, recorded") {
    CHECK(r.alloc() == CUDA_SUCCESS);
    REQUIRE(r.daemon.asked.size() == 1);
    CHECK(r.daemon.asked[0] == GrantPurpose::counted);
    CHECK(r.direct == 1);
    CHECK(r.driver.mapped == 0);
    REQUIRE(r.driver.counted.size() == 1);
    CHECK(r.driver.counted[0].second == 7);
  }
  SECTION("the driver fails: the charge is given back") {
    r.direct_rc = CUDA_ERROR_OUT_OF_MEMORY;
    CHECK(r.alloc() == CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(r.driver.counted.empty());
    REQUIRE(r.daemon.released.size() == 1);
    CHECK(r.daemon.released[0] == std::pair<std::uint64_t, std::uint32_t>{7, 0});
  }
  SECTION("refused: the driver is not called") {
    r.daemon.then(reply(Status::over_limit));
    CHECK(r.alloc() == CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(r.direct == 0);
  }
}

TEST_CASE("alloc policy: a grant that cannot be mapped is given back and reported", "[alloc_policy]") {
  Rig r;
  r.driver.map_rc = CUDA_ERROR_OUT_OF_MEMORY;
  CHECK(r.alloc() == CUDA_ERROR_OUT_OF_MEMORY);
  REQUIRE(r.daemon.released.size() == 1);
  CHECK(r.daemon.released[0] == std::pair<std::uint64_t, std::uint32_t>{7, 0});
  CHECK(r.reports.map_failures == 1);
}

TEST_CASE("alloc policy: a reserve miss prefetches only with room for four times the grant", "[alloc_policy]") {
  Rig r(64 * MiB);
  r.learn_granularity();
  r.daemon.then(reply(Status::ok, kGran, 100 * MiB, 100 * MiB - 4 * kGran));
  CHECK(r.alloc() == CUDA_SUCCESS);
  CHECK(r.driver.misses == 1);
  r.daemon.then(reply(Status::ok, kGran, 100 * MiB, 100 * MiB - 4 * kGran + 1));
  CHECK(r.alloc() == CUDA_SUCCESS);
  CHECK(r.driver.misses == 1);
}

TEST_CASE("alloc policy: guard canary mode leaves the reserve alone", "[alloc_policy]") {
  Rig r(64 * MiB);
  auto canary = [] {
    Answer a = reply(Status::ok);
    a.guard = proto::GuardMode::canary;
    return a;
  };
  r.daemon.then(canary());
  REQUIRE(r.alloc() == CUDA_SUCCESS);
  r.driver.misses = 0;
  CHECK_FALSE(r.policy.reserve_usable());
  r.put_block(kGran);
  r.daemon.then(canary());
  CHECK(r.alloc() == CUDA_SUCCESS);
  CHECK(r.driver.placed == 0);
  CHECK(r.driver.misses == 0);
}
