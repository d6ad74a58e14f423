// vlake::pool records of a Node: tenants, namespaces, sessions, grants, IPC imports and
// devices, as the Node keeps them (Node::Tenant, Node::Session, ... name them).
//
// Plain values; the Node owns them (a GrantRecord owns its handles, a DeviceRecord its pool and
// warm stock). Thread-safety: none.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "vlake/common/strong_types.hpp"
#include "vlake/contracts/protocol.hpp"
#include "vlake/contracts/state.hpp"
#include "vlake/pool/accounting.hpp"
#include "vlake/pool/core/outcomes.hpp"
#include "vlake/pool/device_pool.hpp"
#include "vlake/pool/features/ipc/ipc_registry.hpp"
#include "vlake/pool/warm_stock.hpp"
#include "vlake/quota/quota_config.hpp"

namespace vlake::pool {

namespace st = vlake::state;

// A tenant: who is charged (a uid/gid, or a Kubernetes allocation), under which namespace's rules.
// It is freed (slot, id and name reusable, Counters::tenants_freed) as soon as it has no session,
// no grant, no usage (granted, reserved, non-pool, outside vlake) and, for an allocation's tenant,
// no live allocation: at session end, at allocation removal, after resume (tenants of dead
// processes are not resurrected) and on Node::free_idle_tenants().
struct TenantRecord {
  TenantId id;
  std::uint32_t slot = 0;
  std::string name;
  quota::Limit limit = quota::Limit::bytes(Bytes{0});
  NamespaceId ns{0};
  bool have_ids = false;  // uid/gid known (created by a session of this daemon)
  std::uint32_t uid = 0;
  std::uint32_t gid = 0;
  quota::GuardMode guard = quota::GuardMode::off;
  quota::DedupMode dedup = quota::DedupMode::off;
  std::string dedup_domain;  // its namespace's dedup trust domain; "": shares only with itself
  std::string ipc_domain;    // its namespace's CUDA IPC domain (docs/ipc.md); "": only itself
  std::string alloc_id;      // a Kubernetes allocation's tenant; "": a uid/gid tenant
  // Memory outside vlake (docs/quota.md): its namespace's policy (UnhookedBook holds the figures).
  quota::Enforce enforce = quota::Enforce::kill;
  std::chrono::milliseconds kill_grace = quota::kDefaultKillGrace;
  bool allow_disable = false;
  bool overcommit = false;            // its processes allocate their own memory and may be swapped out
  std::chrono::milliseconds wait{0};  // its namespace's `wait` for memory
  std::array<std::uint64_t, st::kRefusalReasons> denials{};  // by st::RefusalReason - 1
};
// A namespace of the quota file, with its slot in the state segment.
struct NamespaceRecord {
  NamespaceId id;
  std::uint32_t slot = 0;
  quota::NamespaceSpec spec;
};
// One process's session (a Hello), bound to a connection or detached.
struct SessionRecord {
  std::uint64_t id = 0;
  std::uint32_t slot = 0;
  std::uint32_t pid = 0;
  std::uint64_t start_time = 0;
  std::uint32_t uid = 0;
  std::uint32_t gid = 0;
  TenantId tenant;
  ConnId conn = 0;  // 0: detached
  std::vector<std::uint64_t> grants;
  // Whether `grant` is one of its own grants.
  [[nodiscard]] bool holds(std::uint64_t grant) const {
    return std::find(grants.begin(), grants.end(), grant) != grants.end();
  }
  std::string alloc_id;                                  // opened through that allocation's socket
  bool pressure = false;                                 // its latest Hello set kHelloPressure
  proto::GuardMode guard = proto::GuardMode::off;        // the mode its latest HelloAck gave
  std::array<std::uint64_t, st::kMaxDevices> reserve{};  // last ReserveReport per GPU
  bool reclaim = false;  // its last ReserveReport said kReportReclaim (a framework gives back its cache)
  // Its last GrantRequest, its Hello, or a ReserveReport saying kReportActive (a CUDA call).
  std::chrono::steady_clock::time_point last_active{};
  std::optional<std::chrono::milliseconds> wait;  // its Hello's own wait (kHelloWait)
  // Swapping to host memory (docs/swap.md): SwapBook, by session id.
};
// Memory granted to a session: its handles (none for a counted grant) on one GPU.
struct GrantRecord {
  std::uint64_t id = 0;
  std::uint32_t slot = 0;
  std::uint64_t session = 0;
  TenantId tenant;
  DeviceOrdinal device{0};
  Bytes bytes{0};
  proto::GrantPurpose purpose = proto::GrantPurpose::alloc;
  bool orphaned = false;  // its handles died with a previous daemon
  std::vector<std::unique_ptr<PoolHandle>> handles;
  std::uint32_t handle_count = 0;  // handles the tenant mapped (kept when orphaned)
  std::uint64_t requested = 0;     // GrantRequest::bytes
  std::uint64_t created_unix_ns = 0;
  bool canary = false;  // its slack holds the canary pattern (docs/guard.md)
  // CUDA IPC (exports, imports, a grant held for its imports): IpcRegistry, by grant id.
};
// One GPU: its pool of handles, warm stock and what the node knows of its memory.
struct DeviceRecord {
  DeviceOrdinal ordinal{0};
  Uuid uuid{};
  Bytes total{0};
  Bytes granularity{0};
  std::unique_ptr<DevicePool> pool;
  Bytes granted{0};                     // grants with handles
  Bytes orphaned{0};                    // grants whose handles died with a previous daemon
  Bytes counted{0};                     // `counted` grants
  std::uint64_t pool_peak = 0;          // highest pool bytes ever published (across restarts)
  Bytes nvml_used{0};                   // NVML's used memory at the latest sample (0: none)
  Bytes unlisted{0};                    // of it, charged to no process NVML lists (observe_gpus)
  Bytes daemon_nvml{0};                 // of it, charged to vlaked's own process (0: not listed)
  std::uint64_t retired_held_seen = 0;  // pool->retired_held() already in the counters
  // A previous daemon's idle_released_bytes (resume).
  std::uint64_t idle_released_base = 0;
  std::unique_ptr<WarmStock> stock;                             // warm reserve and stock (warm_stock.hpp)
  WarmStock::Counts building;                                   // queued builds by size (background_builds)
  std::chrono::steady_clock::time_point builds_paused_until{};  // a build found no room
};
// What a session waits for now (a parked grant, else a restore), for the publisher and tests.
struct SessionWait {
  std::uint32_t kind = st::kWaitNone;  // st::SessionWait
  DeviceOrdinal device{0};
  Bytes bytes{0};
  std::chrono::steady_clock::time_point since{};
  std::chrono::steady_clock::time_point deadline{};
  std::vector<std::uint64_t> waits_for;  // sessions asked to give back, or swapped out, for it
};

// A grant that passed admission (caps, limits, room) and holds its reservation, to be served.
struct AdmittedGrant {
  DeviceRecord* dev = nullptr;
  const TenantRecord* tenant = nullptr;
  Bytes bytes{0};  // rounded up to the GPU's granularity
  Accounting::Reservation res;
  proto::GrantReply reply{};  // header, bytes, used and limit filled
};

}  // namespace vlake::pool
