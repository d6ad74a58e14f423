// vlake::pool::Node — vlaked's decisions, without I/O: tenants, sessions, grants, namespaces,
// accounting and the device pools of one node, and the façade of its feature rooms (parked
// grants, swapping, CUDA IPC, guards, dedup, memory outside vlake: pool/features/), which it owns.
// What its operations want done outside (sends, builds, swap jobs, kills) is one Effects value
// (core/effects.hpp) that the loop takes after each event (settle()).
//
// What it does
//   The daemon's event loop decodes a message, calls one typed operation here and encodes
//   what comes back; watchers (quota file, Kubernetes allocation directories, process exits,
//   timers) call the matching operation. A Node has no socket, no file descriptor of its own
//   (the exported handle descriptors belong to its DevicePools), no clock (every operation
//   that needs time takes a `Now`) and never calls back into the loop. Identity is what the
//   loop observed (Peer: SO_PEERCRED, /proc, the socket a connection came through), never what
//   a message says. The operations below are grouped by who calls them (start-up, sessions,
//   requests, contexts, swapping, IPC, parked grants, the quota file, Kubernetes allocations,
//   periodic work, effects, views), each with its contract.
// Bounds (docs/daemon.md, "Limits"): the caps of NodeSettings (core/settings.hpp). Tenant
//   records are freed as soon as they hold nothing (core/records.hpp, TenantRecord).
//
// Ownership: the Node owns its tenants, sessions, grants (and their handles), namespaces,
//   pools and the dedup table; it borrows the Driver and the Logger (both must outlive it).
//   Descriptors in a Granted or ShareOut are borrowed: valid until the next call on the Node.
// Errors: operations answer bad input with Malformed (the loop drops the connection) or a
//   Status in the reply; they throw only on internal failures (std::exception), after which
//   the Node is still consistent. validate() throws quota::ConfigError.
// Thread-safety: none; one thread (the event loop) calls every method.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <variant>
#include <vector>

#include "vlake/common/driver.hpp"
#include "vlake/common/log.hpp"
#include "vlake/contracts/state.hpp"
#include "vlake/pool/accounting.hpp"
#include "vlake/pool/core/effects.hpp"
#include "vlake/pool/core/outcomes.hpp"
#include "vlake/pool/core/records.hpp"
#include "vlake/pool/core/rooms.hpp"
#include "vlake/pool/core/settings.hpp"
#include "vlake/pool/nvml_source.hpp"
#include "vlake/pool/proc_identity.hpp"
#include "vlake/quota/quota_config.hpp"

namespace vlake::pool {

class Dedup;
namespace st = vlake::state;

class Node {
 public:
  using Tenant = TenantRecord;
  using Namespace = NamespaceRecord;
  using Session = SessionRecord;
  using Grant = GrantRecord;
  using Import = ImportRecord;
  using Device = DeviceRecord;
  using Wait = SessionWait;

  // Opens a pool on every GPU of `driver` (throws std::runtime_error: none, or too many).
  Node(Driver& driver, const Logger& log, NodeSettings settings, NodeEnv env);
  ~Node();
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  // ---- start-up
  // Creates one handle per GPU and, with a warm reserve, fills it (throws on failure).
  void warm_up();
  // Takes a previous daemon's accounting: tenants keep their ids, sessions in `alive` (by id) are kept detached
  // with their grants (orphaned: their handles died with that daemon), the rest is dropped. Counters, the guard
  // log, ids and the config generation carry on. Returns the kept session ids.
  std::vector<std::uint64_t> resume(const st::State& old, const std::set<std::uint64_t>& alive);

  // ---- sessions
  HelloOut open_session(const Peer& peer, const proto::Hello& m);
  // The connection closed. The process lives on (`exited` false): its session is detached and keeps its grants
  // (a host tier move ends); otherwise the session ends.
  void connection_closed(ConnId conn, std::uint64_t session, bool exited);
  // The session's process exited: its grants return. Returns its connection (0: none) to close.
  ConnId end_session(std::uint64_t session, const char* why);

  // A well-formed message arrived / a connection was dropped for a malformed one (counters).
  void count_request() noexcept { ++counters_.requests; }
  void count_malformed() noexcept { ++counters_.malformed; }
  // Connections the loop closed for a cap (docs/daemon.md, "Limits"): a uid's, or awaiting Hello.
  void count_connection_cap() noexcept { ++counters_.denials_connection_cap; }
  void count_unauthenticated() noexcept { ++counters_.denials_unauthenticated; }
  // The rate limiter for log lines a tenant or peer can trigger (counts Counters::log_suppressed).
  LogLimiter& log_limiter() noexcept { return limited_; }
  // Sessions and grants a tenant holds now (what the caps count).
  [[nodiscard]] std::size_t sessions_of(TenantId t) const;
  [[nodiscard]] std::size_t grants_of(TenantId t) const;
  // Tenants holding at least one session / grant / import (the fair shares' owner counts).
  [[nodiscard]] std::size_t session_holders() const;
  [[nodiscard]] std::size_t grant_holders() const;
  [[nodiscard]] std::size_t import_holders() const;

  // ---- requests of a bound session (`session` is the connection's)
  // Granted | Refused | Parked | Malformed. A grant the pool cannot serve is parked (Pressure to flagged
  // sessions holding reserve) until memory comes back (retry_parked) or its deadline passes (out_of_memory).
  GrantOut grant(ConnId conn, std::uint64_t session, const proto::GrantRequest& m, Now now);
  // The reply of a Granted could not be delivered: the grant is undone.
  void undo_grant(std::uint64_t grant);
  // Receive-to-reply-sent time of a delivered grant (the grant-latency histogram).
  void record_grant_latency(std::chrono::nanoseconds d);
  std::variant<proto::ReleaseAck, Malformed> release(std::uint64_t session, const proto::Release& m);
  std::variant<proto::UsageReply, Malformed> usage(std::uint64_t session, const proto::UsageQuery& m);
  // Kept mappings (docs/hook.md): the session unmapped and closed these kept handles.
  std::optional<Malformed> dropped(std::uint64_t session, const proto::Dropped& m);
  // Warm reserve and stock (settings.background_builds): every handle queued in Effects::builds comes back as
  // adopt() (built, zeroed) or build_failed() (no_room: the GPU lacked room; its builds pause for a second).
  void adopt(DeviceOrdinal device, BuiltHandle h);
  void build_failed(DeviceOrdinal device, Bytes size, bool no_room);
  // Keys sent in Drop messages since start.
  [[nodiscard]] std::uint64_t kept_drops() const noexcept { return kept_drops_; }
  std::optional<Malformed> reserve_report(std::uint64_t session, const proto::ReserveReport& m);
  // ---- CUDA contexts (node_contexts.cpp, docs/quota.md "Contexts")
  // ContextRequest{admit}: the GPU's context size (contexts().size()) is charged to the session's
  // tenant if its limit, its namespace's and the guarantees allow it (a refusal is counted,
  // logged and recorded like a grant's); {release}: one admitted context is gone.
  std::variant<proto::ContextReply, Malformed> context(std::uint64_t session, const proto::ContextRequest& m, Now now);
  // ---- swapping idle processes to host memory (node_swap.cpp, docs/swap.md)
  // The session's hooked calls now wait: its checkpoint is queued (Effects::swap_jobs). A SwapReady for another
  // swap id, or in another state, is ignored.
  std::optional<Malformed> swap_ready(std::uint64_t session, const proto::SwapReady& m);
  // Answers now, or nullopt: the answer comes later in Effects::swap_replies.
  std::optional<proto::SwapInReply> swap_in(ConnId conn, std::uint64_t session, const proto::SwapIn& m, Now now);
  // A SwapJob finished: `bytes` is what the checkpoint freed (0 unknown) or, for a restore,
  // unused; `error` is the driver's message when !ok.
  void swap_done(const SwapJob& job, bool ok, Bytes bytes, std::chrono::nanoseconds took, const std::string& error,
                 Now now);
  // Restores waiting for room, notices nobody answered: called by the loop after every event.
  void swap_tick(Now now);
  // ---- the host tier (node_tier.cpp, docs/swap.md): a step of the session's move (Malformed: another grant's);
  // every piece queued in Effects::host_builds comes back as host_built() or host_build_failed().
  std::variant<TierOut, Malformed> tier_step(std::uint64_t session, const proto::TierStep& m, Now now);
  void host_built(HostPiece p);
  void host_build_failed(Bytes size, const std::string& error);
  std::optional<Malformed> guard_event(std::uint64_t session, const proto::GuardEvent& m, Now now);
  // A copy or memset into a shared range of one of the session's grants was refused
  // (docs/guard.md): recorded as a readonly_write event; one naming no grant of the session
  // with shared chunks on that GPU is rejected (counted), over the tenant's rate dropped.
  std::optional<Malformed> readonly_write(std::uint64_t session, const proto::ReadOnlyWrite& m, Now now);
  std::variant<ShareOut, Malformed> share_request(std::uint64_t session, const proto::ShareRequest& m);
  // The ShareReply could not be delivered: the pending share is aborted.
  void share_undeliverable(std::uint64_t session);
  std::variant<proto::ShareAck, Malformed> share_commit(std::uint64_t session, const proto::ShareCommit& m);
  // CUDA IPC (node_ipc.cpp, docs/ipc.md). Descriptors in an IpcOpened are borrowed (valid until the next call on
  // the Node); an IpcOpenReply that could not be delivered is undone with ipc_undeliverable(import id).
  std::variant<proto::IpcExportReply, Malformed> ipc_export(std::uint64_t session, const proto::IpcExport& m);
  struct IpcOpened {
    proto::IpcOpenReply reply{};
    std::vector<int> fds;
  };
  std::variant<IpcOpened, Malformed> ipc_open(std::uint64_t session, const proto::IpcOpen& m, Now now);
  void ipc_undeliverable(std::uint64_t import_id);
  std::variant<proto::IpcCloseAck, Malformed> ipc_close(std::uint64_t session, const proto::IpcClose& m);
  // Imports a tenant's sessions hold (they count against its grant cap).
  [[nodiscard]] std::size_t imports_of(TenantId t) const;

  // ---- parked grants (docs/pool.md, "Pressure protocol")
  // True when memory came back since the last retry or a deadline passed at `now`.
  [[nodiscard]] bool retry_due(Now now) const;
  // Serves, keeps or times out every parked grant (answers in Effects::completions; for gone connections
  // dropped). A grant still parked kAskAgain after its last asks asks the next sessions: its Completion then
  // holds Parked with their Pressure notes (it stays parked).
  void retry_parked(Now now);
  [[nodiscard]] std::optional<std::chrono::steady_clock::time_point> next_deadline() const;

  // ---- quota file
  // Throws quota::ConfigError when `cfg` does not fit this node (namespace table, GPU sizes).
  void validate(const quota::QuotaConfig& cfg) const;
  // Applies a validated configuration: namespaces, every tenant re-resolved (sessions move, grants and all),
  // namespaces gone from it dropped. `source`: the file ("" for built-in).
  void apply(quota::QuotaConfig cfg, const std::string& source, bool from_file, Now now, const std::string& why);
  // A file that could not be applied (the configuration in force stays).
  void config_rejected(const std::string& error, Now now);
  [[nodiscard]] const quota::QuotaConfig& config() const noexcept { return config_; }

  // ---- Kubernetes allocations
  void allocation_added(const AllocationInfo& a);
  void allocation_owner(const std::string& id, const alloc::Owner& owner);
  void allocation_removed(const std::string& id);

  // ---- periodic work
  // Warm reserve and stock (release the surplus, build or queue what is missing), idle release (settings.
  // pool_idle_release) and, when due, a canary sweep.
  void tick(Now now);
  // Frees every tenant record that holds nothing (after NVML sampling, a reload). Returns how many.
  std::size_t free_idle_tenants();
  [[nodiscard]] NonpoolInputs nonpool_inputs() const;
  void set_nonpool(const NonpoolResult& r);
  // One NVML reading of every process, attributed as unhooked_book.hpp says (`users`: the processes with the
  // driver's device files open; pids without an identity in `ids` are not attributed). Records NVML's used
  // figure and the unlisted memory (Device::unlisted) per GPU; processes to kill (`enforce: kill`) go to kills.
  void observe_gpus(const std::vector<GpuSample>& sample, const std::vector<ProcessIdentity>& ids, Now now,
                    const std::vector<ProcessIdentity>& users = {});
  // The unlisted memory of one GPU's reading, as observe_gpus computes it (the loop scans for device-file users
  // only when some GPU has more than kUnlistedTolerance).
  [[nodiscard]] Bytes unlisted_memory(const GpuSample& g) const;
  // What became of a KillOrder (`killed` false: it was already gone or could not be signalled).
  void unhooked_killed(const KillOrder& k, bool killed);

  // ---- effects (effects.hpp)
  // After each event: retries the parked grants when due (retry_due), runs swap_tick and the host tier's tick,
  // and hands over every effect recorded since the last hand-over, for the loop to carry out.
  Effects settle(Now now);
  // Every effect recorded since the last hand-over (Drops of kept handles retired or handed elsewhere are
  // gathered from the pools here: per session, at most kMaxDropKeys keys each; detached sessions are skipped,
  // their process drops everything when it reconnects).
  Effects hand_over();

  // ---- shutdown: every handle released (tenants' imports keep granted memory alive); returns the grants live
  // processes still hold.
  std::size_t shutdown();

  // ---- views (for the publisher, tests and logs)
  [[nodiscard]] const Device* device_by_uuid(const std::uint8_t* uuid) const;
  [[nodiscard]] const std::vector<Device>& devices() const noexcept { return devices_; }
  [[nodiscard]] const std::map<std::uint32_t, Tenant>& tenants() const noexcept { return tenants_; }
  [[nodiscard]] const std::map<std::string, Namespace>& namespaces() const noexcept { return namespaces_; }
  [[nodiscard]] const std::unordered_map<std::uint64_t, Session>& sessions() const noexcept { return sessions_; }
  [[nodiscard]] const std::unordered_map<std::uint64_t, Grant>& grants() const noexcept { return grants_; }
  [[nodiscard]] const Accounting& accounting() const noexcept { return acct_; }
  [[nodiscard]] const st::Counters& counters() const noexcept { return counters_; }
  // The feature rooms (core/rooms.hpp): IPC, parked grants, swaps, reclaim, counted grants, memory outside
  // vlake, contexts, guard events, refusals, the host tier.
  [[nodiscard]] const Rooms& rooms() const noexcept { return rooms_; }
  // CLOCK_REALTIME of a steady-clock time point, through NodeEnv::clock (0 without one).
  [[nodiscard]] std::uint64_t unix_of(std::chrono::steady_clock::time_point t) const;
  // What a session waits for now (a parked grant, else a restore), for the publisher and tests.
  [[nodiscard]] Wait wait_of_session(const Session& s) const;
  [[nodiscard]] const st::ConfigRecord& config_record() const noexcept { return config_record_; }
  [[nodiscard]] std::uint64_t next_session_id() const noexcept { return next_session_id_; }
  [[nodiscard]] std::uint64_t next_grant_id() const noexcept { return next_grant_id_; }
  [[nodiscard]] std::uint32_t starts() const noexcept { return starts_; }
  [[nodiscard]] const NodeSettings& settings() const noexcept { return settings_; }
  [[nodiscard]] const Tenant* tenant(TenantId id) const;
  [[nodiscard]] const Session* session(std::uint64_t id) const;
  [[nodiscard]] Bytes dedup_logical(DeviceOrdinal d) const;
  [[nodiscard]] Bytes dedup_physical(DeviceOrdinal d) const;
  // Everything that changed since the last call (the publisher's), and a look without taking; the sessions
  // waiting for memory (parked grants) now or at the previous call are always included.
  Changes changes_to_publish();
  [[nodiscard]] const Changes& pending_changes() const noexcept { return changes_; }

 private:
  // The least wait for memory of an overcommit tenant's session (docs/swap.md).
  static constexpr std::chrono::milliseconds kOvercommitWait{120000};

  // tenants (node.cpp)
  Tenant& tenant_for(const quota::TenantSpec& spec, std::uint32_t uid, std::uint32_t gid, const AllocationInfo* alloc);
  Tenant& tenant_for_uid(std::uint32_t uid, std::uint32_t gid);
  Tenant& tenant_for_alloc(const AllocationInfo& a);
  void move_session(Session& s, Tenant& to);
  void retarget_tenants();
  void apply_namespaces();
  void charge_unhooked(Tenant& t);
  // The tenant's non-pool charge on every GPU (NVML's figure and its contexts, context_book.hpp).
  void charge_contexts(TenantId t);
  // Feeds one reading to the context book: each admitted session's figure, vlaked's own context.
  void observe_contexts(const std::vector<GpuSample>& sample);
  [[nodiscard]] bool over_a_limit(const Tenant& t) const;
  Tenant* unhooked_tenant(const ProcessIdentity& p);
  void reattribute(const AllocationInfo& a);
  [[nodiscard]] NamespaceId namespace_id(const std::string& name) const;
  [[nodiscard]] NamespaceId namespace_of_name(const std::string& tenant_name) const;
  Tenant* tenant_mut(TenantId id);
  Device* device_mut(const std::uint8_t* uuid);
  Device* device_by_ordinal(DeviceOrdinal d);
  [[nodiscard]] proto::DeviceQuota device_quota(const Tenant& t, const Device& d) const;
  [[nodiscard]] Bytes reported_used(TenantId t, const Device& d, const Accounting::Usage& u) const;
  void finish_grant(Grant& g, TenantId releaser, bool exported, std::uint64_t kept_by = 0);
  void collect_drops();
  bool settle_device(Device& d, bool all = false);
  void sync_retained(Device& d);
  void end_session_locked(Session& s, const char* why);
  std::optional<std::uint32_t> free_slot(std::vector<bool>& used);
  void touch_tenant(TenantId id);
  void touch_tenant_named(const std::string& name);  // none of that name: nothing
  void touch_session(const Session& s) { changes_.sessions.insert(s.slot); }
  [[nodiscard]] bool tenant_idle(const Tenant& t) const;
  bool free_tenant_if_idle(TenantId id);
  [[nodiscard]] std::chrono::steady_clock::time_point steady_now() const;

  // grants (node_grant.cpp)
  // A grant in two steps: admit() (device, caps, limits, room) answers or reserves it; serve() answers it.
  GrantOut grant_impl(ConnId conn, Session& s, const proto::GrantRequest& m, Now now, const ParkedGrant* retry);
  using Admitted = AdmittedGrant;
  using Admission = std::variant<Admitted, GrantOut>;
  Admission admit(ConnId conn, Session& s, const proto::GrantRequest& m, Now now, const ParkedGrant* retry);
  GrantOut serve(ConnId conn, Session& s, const proto::GrantRequest& m, Now now, const ParkedGrant* retry,
                 Admitted admitted);
  Refused refuse(const Tenant& t, const Device& dev, Bytes bytes, Refusal why, proto::GrantReply reply, Now now);
  void record_refusal(TenantId t, std::uint32_t pid, const Device* dev, st::RefusalReason reason, Bytes bytes,
                      std::uint64_t used, std::uint64_t limit, std::chrono::milliseconds waited, Now now);
  void record_refused_grant(const Session& s, const proto::GrantRequest& m, const proto::GrantReply& r,
                            std::chrono::steady_clock::time_point received, Now now);
  // `trust_claims` false: sessions never asked are asked, not counted on (docs/pool.md, "Claims and measurements").
  std::vector<PressureNote> pressure_for(const Session& requester, const Device& dev, Bytes shortfall,
                                         const std::vector<std::uint64_t>& exclude = {}, bool same_namespace = false,
                                         bool trust_claims = true);
  // Closes the asks past their deadline (ReclaimTrust): logs the sessions that gave nothing.
  void judge_reclaims(Now now);
  std::optional<GrantOut> park_or_timeout(ConnId conn, const Session& s, const Tenant& t, Device& dev,
                                          const proto::GrantRequest& m, Bytes bytes, Bytes shortfall, Now now,
                                          const ParkedGrant* retry, bool same_namespace, bool retired);
  std::optional<GrantOut> over_parked_cap(const Session& s, const Tenant& t, const Device& dev,
                                          const proto::GrantRequest& m, Bytes bytes, Now now);
  std::optional<GrantOut> make_room(ConnId conn, const Session& s, Device& dev, const proto::GrantRequest& m,
                                    Bytes bytes, Now now, const ParkedGrant* retry);
  Bytes start_swaps(const Session& requester, const Device& dev, Bytes need, Now now);
  [[nodiscard]] Bytes device_free(const Device& dev);
  [[nodiscard]] Bytes room(const Device& dev);
  [[nodiscard]] Bytes counted_on(const Session& s, DeviceOrdinal d) const;
  [[nodiscard]] bool swaps_possible() const;
  void try_restore(Session& s, Now now);
  // One NVML reading against the sessions' counted grants (CountedAudit): revokes the unrealized.
  void audit_counted(const std::vector<GpuSample>& sample, Now now);
  // Victims moved out for `session` (on `d`; any GPU when nullopt) go back as soon as there is room.
  void bring_back_victims_of(std::uint64_t session, std::optional<DeviceOrdinal> d);
  void notify(const Session& s, proto::SwapPhase phase);
  // the host tier (node_tier.cpp)
  [[nodiscard]] bool demotable(const Grant& g) const;
  Bytes start_demotes(const Session& requester, const Device& dev, Bytes want, Now now);
  void tier_tick(Now now);
  void drop_pending(TierMove& m);
  void end_move(std::uint64_t session, Now now);
  void commit_move(TierMove& m, Now now);
  bool next_of_move(TierMove& m, const Session& s);
  Bytes retire_others_bound(const Tenant& t, Device& dev, Bytes bytes, bool same_namespace);
  [[nodiscard]] std::chrono::milliseconds wait_of(const Session& s) const;
  [[nodiscard]] std::int32_t priority_of(TenantId t) const;
  void plan_warm(Device& d, std::chrono::steady_clock::time_point now, std::size_t max_inline, bool queue);
  static constexpr std::size_t kMaxBuildsInFlight = 4;
  void release_idle(Now now);

  // CUDA IPC (node_ipc.cpp)
  // Drops one import; a released grant whose last import this was is finished (retired).
  void drop_import(std::uint64_t import_id);
  void drop_imports_of(std::uint64_t session);
  bool hold_for_imports(Grant& g);

  // guards and dedup (node_guard.cpp)
  void canary_fill(const Grant& g);
  bool canary_check(const Grant& g, const char* when, std::uint64_t now_unix_ns);
  void canary_sweep(std::uint64_t now_unix_ns);
  void record_guard_event(st::GuardEventRecord e, std::uint64_t now_unix_ns);
  bool guard_admitted(const Tenant& t, const Session& s, const char* what, const std::string& bad, Now now);
  Dedup& dedup();

  Driver& driver_;
  const Logger& log_;
  NodeSettings settings_;
  NodeEnv env_;
  quota::QuotaConfig config_;
  Accounting acct_;
  std::vector<Device> devices_;
  std::map<std::string, Namespace> namespaces_;  // by name
  std::unordered_map<std::string, TenantId> tenant_ids_;
  std::map<std::uint32_t, Tenant> tenants_;  // by TenantId value
  std::unordered_map<std::uint64_t, Session> sessions_;
  std::unordered_map<std::uint64_t, Grant> grants_;
  std::map<std::string, AllocationInfo> allocs_;  // by allocation id
  std::unique_ptr<Dedup> dedup_;                  // created on first use
  Rooms rooms_;                                   // the feature rooms (pool/features/)
  Effects fx_;                                    // what operations recorded since the last hand_over()
  std::uint64_t kept_drops_ = 0;

  // slot tables (mirroring the state segment's)
  std::vector<bool> tenant_slots_ = std::vector<bool>(st::kMaxTenants);
  std::vector<bool> namespace_slots_ = std::vector<bool>(st::kMaxNamespaces);
  std::vector<bool> session_slots_ = std::vector<bool>(st::kMaxSessions);
  std::vector<bool> grant_slots_ = std::vector<bool>(st::kMaxGrants);

  // what the state segment carries across restarts
  st::Counters counters_{};
  LogLimiter limited_;                                // counts into counters_.log_suppressed
  std::chrono::steady_clock::time_point last_now_{};  // the latest Now seen (for untimed operations)
  std::set<std::uint32_t> waiting_slots_;             // session slots waiting at the last changes_to_publish()
  st::ConfigRecord config_record_{};
  std::uint64_t next_session_id_ = 1;
  std::uint64_t next_grant_id_ = 1;
  std::uint32_t starts_ = 1;
  std::uint64_t handles_created_base_ = 0;
  std::uint64_t handles_released_base_ = 0;

  Changes changes_;

  friend class StatePublisher;
};

}  // namespace vlake::pool
