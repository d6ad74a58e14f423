// The daemon side of the instruction-count gates (bench/count/gate.py): grants and releases
// of 2 MiB made straight to vlake::pool::Node (the daemon's decisions, on the simulated driver,
// in this process), only vlake_count_grants() collected by callgrind (--toggle-collect). The
// socket part of vlaked is not in it: valgrind 3.19 (Debian bookworm) does not implement
// pidfd_open, so vlaked refuses every session under it. The count of pairs comes from
// VLAKE_COUNT_GRANTS (default 50); three untimed pairs come first.
#include <cstdlib>
#include <string>

#include "../pool/node_world.hpp"

using namespace vlake::nodetest;

namespace {
struct Counted {
  World* w;
  std::uint64_t session;
};
}  // namespace

// The counted region: n grant + release pairs. noinline, C linkage: one exact name to collect.
extern "C" __attribute__((noinline, used)) void vlake_count_grants(void* p, long n) {
  auto* c = static_cast<Counted*>(p);
  for (long i = 0; i < n; ++i) {
    GrantOut out = c->w->grant(ConnId{1}, c->session, 2 * kMiB);
    const auto* g = std::get_if<Granted>(&out);
    if (g == nullptr) std::abort();
    proto::Release m = proto::make<proto::Release>(9);
    m.grant_id = g->grant;
    auto ack = c->w->node->release(c->session, m);
    const auto* a = std::get_if<proto::ReleaseAck>(&ack);
    if (a == nullptr || a->status != proto::Status::ok) std::abort();
  }
}

TEST_CASE("count: grant and release pairs straight to the Node", "[count]") {
  const char* env = std::getenv("VLAKE_COUNT_GRANTS");
  const long n = env != nullptr ? std::atol(env) : 50;
  REQUIRE(n > 0);
  World w("version: 1\ndefault:\n  limit: 4GiB\n");
  Counted c{&w, w.hello(ConnId{1}, 100, 1000)};
  for (int i = 0; i < 3; ++i) w.release(c.session, w.granted(ConnId{1}, c.session, 2 * kMiB));
  vlake_count_grants(&c, n);
  SUCCEED("pairs counted: " << n);
}
