// The Node test world (vlake::pool::Node without a process): the simulated driver loaded into
// the test process, time as a value, identities as plain numbers. Shared by the test_node*.cpp
// files; each ctest test case runs in its own process.
#pragma once

#include <catch2/catch.hpp>

#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "fd_holder.hpp"
#include "sim_gpu.hpp"
#include "units.hpp"
#include "vlake/contracts/codec.hpp"
#include "vlake/pool/holder_scan.hpp"
#include "vlake/pool/node.hpp"
#include "vlake/pool/publisher.hpp"

namespace vlake::nodetest {

using namespace vlake;
using namespace vlake::pool;
using namespace vlake::literals;

using namespace vlake::testunits;  // kMiB, kGiB, MiB (units.hpp)

using pooltest::SimGpu;

inline SimGpu& sim_gpu() {
  static SimGpu gpu;
  return gpu;
}

inline quota::QuotaConfig config(const std::string& yaml) { return quota::QuotaConfig::parse(yaml, "test.yaml"); }

// A Node on the simulated GPU with a controllable clock.
struct World {
  explicit World(const std::string& yaml, NodeSettings settings = {}, HolderScan holders = {}) {
    settings.daemon_pid = 1;
    node = std::make_unique<Node>(
        sim_gpu().driver(), log, settings,
        NodeEnv{[](uid_t, gid_t gid) { return std::vector<gid_t>{gid}; }, [this] { return t; }, std::move(holders)});
    quota::QuotaConfig cfg = config(yaml);
    node->validate(cfg);
    node->apply(std::move(cfg), "test.yaml", true, t, "");
  }
  ~World() {
    node->shutdown();
    if (outside.value() != 0) sim_gpu().driver().release(outside);
  }
  // Takes `bytes` of the GPU outside the pool (another program's memory).
  void take_outside(Bytes bytes) { outside = sim_gpu().driver().create(DeviceOrdinal{0}, bytes); }

  // Opens a session for (pid, uid) on connection `conn`; returns its id.
  std::uint64_t hello(ConnId conn, std::uint32_t pid, std::uint32_t uid, bool pressure = false,
                      const std::string& alloc_id = "") {
    proto::Hello m = proto::make<proto::Hello>(1);
    m.flags = pressure ? std::uint32_t{proto::kHelloPressure} : 0u;
    HelloOut out = node->open_session(Peer{conn, pid, uid, uid, 1000 + pid, alloc_id}, m);
    REQUIRE(std::holds_alternative<proto::HelloAck>(out.answer));
    return out.session;
  }
  proto::GrantRequest request(std::uint64_t bytes) const {
    proto::GrantRequest m = proto::make<proto::GrantRequest>(7);
    node->devices().front().uuid.copy_to(m.device_uuid);
    m.bytes = bytes;
    m.purpose = proto::GrantPurpose::alloc;
    return m;
  }
  GrantOut grant(ConnId conn, std::uint64_t session, std::uint64_t bytes) {
    return node->grant(conn, session, request(bytes), t);
  }
  // A grant that must succeed; returns its id.
  std::uint64_t granted(ConnId conn, std::uint64_t session, std::uint64_t bytes) {
    GrantOut out = grant(conn, session, bytes);
    const auto* g = std::get_if<Granted>(&out);
    REQUIRE(g != nullptr);
    CHECK(g->reply.status == proto::Status::ok);
    CHECK(g->fds.size() == g->reply.handle_count);
    return g->grant;
  }
  proto::Status refused(ConnId conn, std::uint64_t session, std::uint64_t bytes) {
    GrantOut out = grant(conn, session, bytes);
    const auto* r = std::get_if<Refused>(&out);
    REQUIRE(r != nullptr);
    return r->reply.status;
  }
  void release(std::uint64_t session, std::uint64_t grant) {
    proto::Release m = proto::make<proto::Release>(9);
    m.grant_id = grant;
    auto out = node->release(session, m);
    REQUIRE(std::get<proto::ReleaseAck>(out).status == proto::Status::ok);
  }
  Bytes used(std::uint64_t session) const {
    const Node::Session* s = node->session(session);
    REQUIRE(s != nullptr);
    return node->accounting().usage(s->tenant, DeviceOrdinal{0}).used();
  }
  std::string tenant_of(std::uint64_t session) const { return node->tenant(node->session(session)->tenant)->name; }
  void advance(std::chrono::milliseconds d) {
    t.steady += d;
    t.unix_ns += static_cast<std::uint64_t>(std::chrono::nanoseconds(d).count());
  }

  Logger log{LogLevel::error};
  Now t{std::chrono::steady_clock::time_point(std::chrono::hours(1)), 1'700'000'000'000'000'000ULL};
  std::unique_ptr<Node> node;
  PhysicalHandle outside{};

  // What the node handed over (effects.hpp) that the test has not looked at yet.
  Effects fx;
  template <class T>
  std::vector<T> take(std::vector<T> Effects::*which) {
    fx.append(node->hand_over());
    return std::exchange(fx.*which, {});
  }
  std::vector<Completion> retry_parked(Now now) {
    node->retry_parked(now);
    return take(&Effects::completions);
  }
  // The parked grants' retry is due now (REQUIRE): retried, their completions.
  std::vector<Completion> retry_due_parked() {
    REQUIRE(node->retry_due(t));
    return retry_parked(t);
  }
  // The due retry serves exactly one parked grant, that of connection `conn`.
  void retry_grants_one(ConnId conn) {
    const std::vector<Completion> done = retry_due_parked();
    REQUIRE(done.size() == 1);
    CHECK(done[0].conn == conn);
    CHECK(std::holds_alternative<Granted>(done[0].out));
  }
  std::vector<KillOrder> observe_gpus(const std::vector<GpuSample>& sample, const std::vector<ProcessIdentity>& ids,
                                      Now now, const std::vector<ProcessIdentity>& users = {}) {
    node->observe_gpus(sample, ids, now, users);
    return take(&Effects::kills);
  }
};

// ---- limits

// A plausible kernel fault report on the world's first GPU: one suspect of `bytes`.
inline proto::GuardEvent fault_event(const World& w, std::uint64_t bytes = 4096) {
  proto::GuardEvent m = proto::make<proto::GuardEvent>(3);
  m.kind = proto::GuardKind::fault;
  w.node->devices().front().uuid.copy_to(m.device_uuid);
  m.cuda_status = 700;
  m.live_allocations = 1;
  m.suspect_count = 1;
  m.suspects[0] = proto::GuardSuspect{0x7f0000000000ULL, bytes, 1000};
  return m;
}

// A Hello that must be refused: returns the Fatal.
inline Fatal refused_hello(World& w, ConnId conn, std::uint32_t pid, std::uint32_t uid) {
  proto::Hello m = proto::make<proto::Hello>(1);
  HelloOut out = w.node->open_session(Peer{conn, pid, uid, uid, 1000 + pid, ""}, m);
  REQUIRE(std::holds_alternative<Fatal>(out.answer));
  return std::get<Fatal>(out.answer);
}

inline bool has_tenant(const Node& n, const std::string& name) {
  for (const auto& [id, t] : n.tenants()) {
    if (t.name == name) return true;
  }
  return false;
}

// ---- memory outside vlake

inline ProcessIdentity who(std::uint32_t pid, std::uint32_t uid, std::vector<std::string> allocs = {}) {
  ProcessIdentity p;
  p.pid = pid;
  p.start_time = 5000 + pid;
  p.uid = uid;
  p.gid = uid;
  p.alloc_ids = std::move(allocs);
  return p;
}

inline GpuSample gpu0(Bytes used, std::vector<ProcessUsage> procs) {
  GpuSample g;
  g.device = DeviceOrdinal{0};
  g.used = used;
  g.processes = std::move(procs);
  return g;
}

inline const Node::Tenant* tenant_named(const Node& n, const std::string& name) {
  for (const auto& [id, t] : n.tenants()) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

// A counted grant of `bytes` for `session` (memory its process allocates itself).
inline GrantOut counted_grant(World& w, ConnId conn, std::uint64_t session, std::uint64_t bytes) {
  proto::GrantRequest m = w.request(bytes);
  m.purpose = proto::GrantPurpose::counted;
  return w.node->grant(conn, session, m, w.t);
}

// `session` exports its grant `grant` for CUDA IPC (REQUIREs the reply).
inline proto::IpcExportReply ipc_export(World& w, std::uint64_t session, std::uint64_t grant) {
  proto::IpcExport m = proto::make<proto::IpcExport>(11);
  m.grant_id = grant;
  auto out = w.node->ipc_export(session, m);
  REQUIRE(std::holds_alternative<proto::IpcExportReply>(out));
  return std::get<proto::IpcExportReply>(out);
}

// A state segment of this test process, removed at the end.
struct TestSegment {
  explicit TestSegment(const std::string& prefix) : name(prefix + std::to_string(::getpid())), seg(name) {}
  ~TestSegment() { ::unlink(state::segment_path(name).c_str()); }
  TestSegment(const TestSegment&) = delete;
  TestSegment& operator=(const TestSegment&) = delete;
  std::string name;
  state::StateSegment seg;
};

}  // namespace vlake::nodetest
