// The vlaked wire protocol, version 1: what a hook (tenant process) and the pool daemon say to
// each other over a Unix SOCK_SEQPACKET socket. One message is one datagram. A contract
// (contracts/): vlaked, the hook and the tests' clients all build on this file and codec.hpp.
//
// Contract
// - Every message starts with Header {magic, version, type, size}; `size` is the byte length of
//   the whole datagram and must equal sizeof() of the struct its type names. Anything else —
//   wrong magic, version, type, size, out-of-range fields, descriptors attached to a message
//   that carries none — is malformed: the daemon logs the reason and closes that connection.
//   codec.hpp is the one encoder/decoder of these structs and holds every check a receiver can
//   make without state; both ends use it.
// - The first message on a connection is Hello; the daemon answers HelloAck (or Error and
//   closes). Tenant identity comes from the socket (SO_PEERCRED, or which socket it is), never
//   from a field a client sends.
// - Requests carry a client-chosen `request_id`, echoed in the reply. A connection has at most
//   one request in flight (the hook serializes), so replies arrive in order.
// - Handles travel as POSIX file descriptors (SCM_RIGHTS) attached to GrantReply, one per
//   HandleDesc, in order, to ShareReply, one per piece without kShareKeep, to IpcOpenReply and
//   to TierPlan, one per piece. No other message carries descriptors.
// - Restart: grants and usage live in the daemon's state segment and survive a daemon crash.
//   A hook whose connection broke reconnects and sends Hello{old_session}; the daemon re-binds
//   that session (and its grants) only if the peer is the very process that opened it (pid
//   and start time). Memory granted before the crash stays with the tenant (an imported handle
//   cannot be exported back); releasing such a grant just uncharges it. CUDA IPC imports and
//   tokens (IpcExport/IpcOpen) are not kept: after a restart an old token is unknown_handle.
// - All structs are trivially copyable with fixed sizes (static_asserts below); fields are
//   host-endian (both ends are on one machine). Adding a field means a new version.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace vlake::proto {

inline constexpr std::uint32_t kMagic = 0x314b4c56;  // "VLK1" little-endian
// 2: HandleDesc::key, kReleaseKeepMapped, Drop/Dropped; 3: ReserveReport::flags, wait_ms,
// HelloAck::flags; 4: ContextRequest/ContextReply; 5: TierNotice/TierStep/TierPlan;
// 6: GrantRequest::flags (kGrantNoWait), TierSteps while a request of the client waits.
inline constexpr std::uint16_t kVersion = 6;
inline constexpr std::size_t kMaxMessageBytes = 4096;
inline constexpr std::uint32_t kMaxHandlesPerGrant = 32;
inline constexpr std::uint32_t kMaxDevices = 16;

enum class MsgType : std::uint16_t {
  hello = 1,
  hello_ack = 2,
  grant_request = 3,
  grant_reply = 4,
  release = 5,
  release_ack = 6,
  usage_query = 7,
  usage_reply = 8,
  error = 9,
  guard_event = 10,       // client -> daemon, no reply: an out-of-bounds access the hook saw
  pressure = 11,          // daemon -> client, unsolicited, no reply: return reserve memory
  reserve_report = 12,    // client -> daemon, no reply: the bytes the hook keeps in its reserve
  share_request = 13,     // client -> daemon: share whole chunks of a grant read-only (docs/dedup.md)
  share_reply = 14,       // daemon -> client: one batch of the grant's new layout, with descriptors
  share_commit = 15,      // client -> daemon: the new layout is mapped (commit) or not (abort)
  share_ack = 16,         // daemon -> client
  ipc_export = 17,        // client -> daemon: a CUDA IPC handle for an alloc grant (docs/ipc.md)
  ipc_export_reply = 18,  // daemon -> client
  ipc_open = 19,          // client -> daemon: open another process's IPC handle
  ipc_open_reply = 20,    // daemon -> client, with one descriptor per piece
  ipc_close = 21,         // client -> daemon: the importer unmapped an opened handle
  ipc_close_ack = 22,     // daemon -> client
  readonly_write = 23,    // client -> daemon, no reply: a copy or memset into shared memory was refused
  drop = 24,              // daemon -> client, unsolicited, no reply: unmap these kept handles
  dropped = 25,           // client -> daemon, no reply: these kept handles are unmapped and closed
  swap_notice = 26,       // daemon -> client, unsolicited: the process is about to be swapped out / is back
  swap_ready = 27,        // client -> daemon, no reply: this process's hooked calls now wait
  swap_in = 28,           // client -> daemon: bring this process back to the GPU
  swap_in_reply = 29,     // daemon -> client
  context_request = 30,   // client -> daemon (version 4): admit / release a CUDA context's memory
  context_reply = 31,     // daemon -> client
  tier_notice = 32,       // daemon -> client, unsolicited (version 5): move grants to host memory or back
  tier_step = 33,         // client -> daemon: ready for / done with one grant of a move
  tier_plan = 34,         // daemon -> client: the next grant to move, with one descriptor per piece
};

// Status codes carried in replies. A client treats a non-ok status it does not know as a
// refusal (values may be added within a protocol version; none is ever reused).
enum class Status : std::int32_t {
  ok = 0,
  over_limit = 1,            // the tenant's limit would be exceeded (nothing was charged)
  out_of_memory = 2,         // the GPU has no memory left for the pool
  bad_request = 3,           // a field was out of range (the connection is closed after the reply)
  unknown_device = 4,        // no such GPU on this node
  unknown_grant = 5,         // release of a grant this session does not hold
  version_mismatch = 6,      // Hello with a protocol version the daemon does not speak
  internal = 7,              // the daemon failed; see its log
  namespace_over_limit = 8,  // the tenant's namespace would exceed its limit (GrantReply limit/used
                             // are the namespace's)
  guarantee = 9,             // the rest of the GPU is guaranteed to other namespaces (limit/used are
                             // the tenant's)
  dedup_disabled = 10,       // a transparent ShareRequest (kShareTransparent) from a tenant whose
                             // namespace is not in `dedup: transparent` mode (docs/dedup.md)
  passthrough = 11,          // HelloAck to a Hello with kHelloPassthrough that the quota file allows:
                             // no session was opened; the hook passes every call through
  limit_reached = 12,        // a per-tenant or per-uid cap (sessions, grants) or the tenant table is
                             // full; Error text / reply names which (docs/security.md)
  ipc_denied = 13,           // IpcOpen of a handle whose owner's tenant the importer may not reach
                             // (another tenant outside the owner's `ipc_domain`, docs/ipc.md)
  unknown_handle = 14,       // IpcOpen/IpcClose of a token the daemon does not know (never issued,
                             // wrong secret, or its grant is gone)
  drop_kept = 15,            // GrantReply (version 2): the grant fits once this process drops the
                             // mappings it keeps on that GPU (docs/hook.md, "Kept mappings"):
                             // drop them, say Dropped, ask again. Not a refusal (not counted)
};

struct Header {
  std::uint32_t magic;
  std::uint16_t version;
  MsgType type;
  std::uint32_t size;
  std::uint32_t reserved;
  std::uint64_t request_id;
};

// Hello::flags.
enum HelloFlags : std::uint32_t {
  // The client reads unsolicited Pressure messages (it may receive one before any reply, and
  // must skip it while waiting for that reply) and answers them by returning its local reserve
  // and, when its ReserveReport says kReportReclaim, by asking its framework to empty its cache.
  // The daemon sends Pressure only to clients that set this flag.
  kHelloPressure = 1u << 0,
  // The process was started with VLAKE_DISABLE=1 and asks to pass everything through. The daemon
  // answers Status::passthrough (no session) where the tenant's namespace has `allow_disable:
  // true`, else a normal HelloAck: the hook then stays on (docs/security.md).
  kHelloPassthrough = 1u << 1,
  // Version 3: Hello::wait_ms is the process's own wait for memory (VLAKE_WAIT), instead of its
  // namespace's `wait` (docs/quota.md, "Waiting for memory").
  kHelloWait = 1u << 2,
};
inline constexpr std::uint32_t kHelloKnownFlags = kHelloPressure | kHelloPassthrough | kHelloWait;
// The longest wait for memory a Hello may ask for (the quota file's bound as well).
inline constexpr std::uint32_t kMaxWaitMs = 600'000;

// client -> daemon, first message.
struct Hello {
  Header h;
  std::uint32_t pid;          // informational: the daemon uses SO_PEERCRED
  std::uint32_t flags;        // HelloFlags
  std::uint64_t old_session;  // 0, or the session this process held before its connection broke
  char client[32];            // e.g. "hook 0.1.0", NUL-terminated
  std::uint32_t wait_ms;      // version 3, with kHelloWait: 0..kMaxWaitMs
  std::uint32_t reserved;
};

struct DeviceQuota {
  std::uint8_t uuid[16];
  std::uint64_t total;  // the GPU's memory
  std::uint64_t limit;  // the tenant's limit on this GPU
  std::uint64_t used;   // the tenant's usage on this GPU, all its processes
};

// Out-of-bounds protection of a tenant's allocations (docs/guard.md), from the quota file.
enum class GuardMode : std::uint32_t {
  off = 0,
  canary = 1,  // the slack after each allocation holds a pattern the daemon checks
  fault = 2,   // each allocation ends at its last chunk's end, followed by unmapped guard VA
};

// daemon -> client.
struct HelloAck {
  Header h;
  Status status;
  std::uint32_t tenant_id;
  std::uint64_t session_id;
  std::uint64_t granularity;
  std::uint32_t device_count;
  GuardMode guard_mode;  // out-of-bounds protection for this tenant's allocations
  char tenant_name[64];
  DeviceQuota devices[kMaxDevices];
  // Version 3: how long a grant of this session that no memory can serve now waits for memory
  // (the Hello's own wait, else the namespace's `wait`); the hook waits as long for replies.
  std::uint32_t wait_ms;
  std::uint32_t flags;  // version 3: HelloAckFlags
};

// Swapping idle processes to host memory (docs/swap.md), version 3. Only sessions of namespaces
// with `overcommit: true` that said kHelloPressure take part.
//   SwapNotice{out} (daemon -> client, unsolicited, request_id 0): vlaked wants to checkpoint
//     this process. The client makes its hooked calls wait (the "gate"), then answers
//     SwapReady{swap_id}; vlaked then locks and checkpoints the process with the driver.
//   SwapIn (client -> daemon): a hooked call found the gate closed; vlaked restores the process
//     (once the GPU has room for what it held) and answers SwapInReply{ok}; out_of_memory when no
//     room came within the session's wait (the process stays on the host; the next call asks
//     again); internal when the driver could not restore it. A SwapIn before the checkpoint
//     began calls the swap off (ok at once).
//   SwapNotice{back} (daemon -> client, unsolicited): the swap was called off or failed before
//     the checkpoint; the client opens its gate.
//   SwapNotice{host} (daemon -> client, unsolicited): the checkpoint is done (the process is on
//     the host): from now on the client asks SwapIn as soon as its threads compute, even before
//     a hooked call (one they make to an entry point the hook does not intercept would block).
enum class SwapPhase : std::uint32_t {
  out = 1,
  back = 2,
  host = 3,
};
struct SwapNotice {
  Header h;
  SwapPhase phase;
  std::uint32_t reserved;
  std::uint64_t swap_id;  // > 0
};
struct SwapReady {
  Header h;
  std::uint64_t swap_id;  // the SwapNotice{out}'s
};
struct SwapIn {
  Header h;
  std::uint64_t reserved;
};
struct SwapInReply {
  Header h;
  Status status;
  std::uint32_t reserved;
  std::uint64_t waited_ms;  // how long the process was kept off the GPU after it asked
};

// HelloAck::flags (version 3).
enum HelloAckFlags : std::uint32_t {
  // The tenant's namespace has `overcommit: true` (docs/swap.md): the hook has the process's own
  // driver allocate its device memory (charged first with GrantRequest{counted}) instead of
  // mapping pool handles, so that vlaked can checkpoint the process to host memory when it is
  // idle and the GPU is full.
  kAckOvercommit = 1u << 0,
};
inline constexpr std::uint32_t kAckKnownFlags = kAckOvercommit;

enum class GrantPurpose : std::uint32_t {
  alloc = 1,    // cuMemAlloc / cuMemAllocPitch / cuMemAllocAsync: the hook maps it
  create = 2,   // cuMemCreate: the handle itself goes to the application
  counted = 3,  // charged only (cuMemAllocManaged): no handle is sent
};

// GrantRequest::flags (version 6).
enum GrantFlags : std::uint32_t {
  // The request must not wait for memory (the hook's prefetch, docs/hook.md): with no room now it
  // is answered out_of_memory at once: it is never parked, asks nobody to give memory back and
  // moves nobody to host memory.
  kGrantNoWait = 1u << 0,
};
inline constexpr std::uint32_t kGrantKnownFlags = kGrantNoWait;

struct GrantRequest {
  Header h;
  std::uint8_t device_uuid[16];
  std::uint64_t bytes;  // > 0; rounded up to the granularity by the daemon
  GrantPurpose purpose;
  std::uint32_t flags;  // GrantFlags
};

struct HandleDesc {
  std::uint64_t size;
  std::uint64_t offset;  // where this handle goes inside the grant's VA range
  // Version 2 (docs/hook.md, "Kept mappings"): nonzero when the handle is bound to the
  // requesting tenant (`--handle-reuse tenant`) and may stay mapped in this process after its
  // grant is released (kReleaseKeepMapped): the same physical handle carries the same key for
  // the daemon's lifetime, and keys are never reused by one daemon. 0: unmap it on release.
  std::uint64_t key;
};

struct GrantReply {
  Header h;
  Status status;
  std::uint32_t handle_count;  // descriptors attached, in order
  std::uint64_t grant_id;
  std::uint64_t bytes;  // granted (rounded); on refusal, the rounded request
  std::uint64_t limit;  // the tenant's limit on that GPU
  std::uint64_t used;   // the tenant's usage on that GPU after this grant (before, if refused)
  HandleDesc handles[kMaxHandlesPerGrant];
};

enum ReleaseFlags : std::uint32_t {
  // The application exported the handle (cuMemExportToShareableHandle): another process may
  // still hold the memory, so the daemon must retire it instead of pooling it.
  kReleaseExported = 1u << 0,
  // The grant has one handle with a nonzero key and this process keeps it imported and mapped
  // (docs/hook.md, "Kept mappings"): the daemon pools it bound to the tenant as usual, remembers
  // that this session keeps it, and sends Drop before the handle is retired or goes to
  // another process. Ignored for other grants.
  kReleaseKeepMapped = 1u << 1,
};

struct Release {
  Header h;
  std::uint64_t grant_id;
  std::uint32_t flags;  // ReleaseFlags
  std::uint32_t reserved;
};

struct ReleaseAck {
  Header h;
  Status status;
  std::uint32_t reserved;
  std::uint64_t used;  // the tenant's usage on that grant's GPU afterwards
};

struct UsageQuery {
  Header h;
  std::uint8_t device_uuid[16];
};

struct UsageReply {
  Header h;
  Status status;
  std::uint32_t reserved;
  std::uint64_t total;
  std::uint64_t limit;
  std::uint64_t used;
};

// What an event reports (docs/guard.md). A client sends GuardEvent with `fault` or
// `fault_maps_shared`; `canary` and `readonly_write` are recorded by the daemon (canary: its own
// check; readonly_write: from a ReadOnlyWrite message).
enum class GuardKind : std::uint32_t {
  fault = 1,              // a sticky kernel fault (e.g. CUDA_ERROR_ILLEGAL_ADDRESS): not a guard hit
  canary = 2,             // damaged canary slack, found by the daemon
  fault_maps_shared = 3,  // a kernel fault in a process that maps shared read-only chunks on that
                          // GPU (was named `readonly`: the driver does not say what was accessed)
  readonly_write = 4,     // a copy or memset into a shared read-only range, refused by the driver
};

// What the hook knows when a kernel of this process faulted (CUDA_ERROR_ILLEGAL_ADDRESS seen on
// a synchronizing call): the driver does not say which address. The hook sends its most
// recently allocated live allocations on that GPU (newest first) as the likely suspects.
struct GuardSuspect {
  std::uint64_t address;  // the pointer the application got
  std::uint64_t bytes;    // requested size
  std::uint64_t age_ns;   // time since it was allocated
};
inline constexpr std::uint32_t kMaxGuardSuspects = 8;
struct GuardEvent {
  Header h;
  GuardKind kind;
  std::uint32_t suspect_count;
  std::uint8_t device_uuid[16];
  std::int32_t cuda_status;  // the CUresult the application is about to see
  std::uint32_t live_allocations;
  char call[32];  // the driver call that reported it, e.g. "cuStreamSynchronize"
  GuardSuspect suspects[kMaxGuardSuspects];
};

// client -> daemon, no reply: a copy or memset of this process whose destination overlaps a
// shared read-only range of one of its alloc grants failed with `cuda_status` (the driver refuses
// such a copy up front: CUDA_ERROR_INVALID_VALUE, the context keeps working). Sent only on that
// failure path. The daemon records it as a guard event of kind readonly_write (docs/guard.md).
struct ReadOnlyWrite {
  Header h;
  std::uint8_t device_uuid[16];
  std::uint64_t grant_id;       // the grant of the allocation holding the shared range
  std::uint64_t address;        // the call's destination
  std::uint64_t bytes;          // > 0: the bytes the call writes from `address` (its span)
  std::uint64_t alloc_address;  // the allocation's pointer (what the application got)
  std::uint64_t alloc_bytes;    // > 0: its requested size
  std::uint64_t alloc_age_ns;   // time since it was allocated
  std::uint64_t shared_offset;  // first shared byte the destination overlaps, from alloc_address
  std::uint64_t shared_bytes;   // > 0: shared bytes the destination overlaps
  std::int32_t cuda_status;     // the CUresult the application sees
  std::uint32_t reserved;
  char call[32];  // the driver call, e.g. "cuMemsetD8"
};

// Memory pressure (docs/pool.md, "Pressure protocol"). daemon -> client, unsolicited
// (request_id 0): the node is short of `bytes` on that GPU; the client should release memory
// it holds unused in its local reserve (as ordinary Release messages), most idle first, up to
// `bytes` (0: all of it). Sent only to clients whose Hello set kHelloPressure. No reply.
enum class PressureReason : std::uint32_t {
  pool_exhausted = 1,  // a grant could not be served from the free pool or new handles
  low_memory = 2,      // the GPU's free memory fell below the daemon's low watermark
};
struct Pressure {
  Header h;
  std::uint8_t device_uuid[16];
  std::uint64_t bytes;
  PressureReason reason;
  std::uint32_t reserved;
};

// Kept mappings (docs/hook.md, "Kept mappings"). Drop: daemon -> client, unsolicited
// (request_id 0): unmap, release and close the kept handles with these keys (the daemon retires
// them or hands them to another process). Dropped: client -> daemon, no reply: the kept handles
// with these keys are unmapped, released and closed in this process (after a Drop, or on the
// client's own account). Keys this process does not keep are ignored by both sides.
inline constexpr std::uint32_t kMaxDropKeys = 64;
struct Drop {
  Header h;
  std::uint32_t count;  // 1..kMaxDropKeys
  std::uint32_t reserved;
  std::uint64_t keys[kMaxDropKeys];
};
struct Dropped {
  Header h;
  std::uint32_t count;  // 1..kMaxDropKeys
  std::uint32_t reserved;
  std::uint64_t keys[kMaxDropKeys];
};

// client -> daemon, no reply: how much granted memory this process keeps mapped but unused in
// its local reserve on one GPU (so operators see it, and pressure goes where memory is idle),
// and whether a framework in the process gives back its cache when asked (kReportReclaim: a
// reclaim callback is registered, docs/hook.md "Reclaim"). Sent off the allocation path, when
// either changed.
enum ReportFlags : std::uint32_t {
  kReportReclaim = 1u << 0,
  // The process made a hooked CUDA call since its last report (sent at most once a second: how
  // vlaked tells idle processes, for swapping (docs/swap.md) and for vlakectl and the metrics).
  kReportActive = 1u << 1,
};
inline constexpr std::uint32_t kReportKnownFlags = kReportReclaim | kReportActive;
struct ReserveReport {
  Header h;
  std::uint8_t device_uuid[16];
  std::uint64_t bytes;   // reserve bytes (a subset of the session's granted bytes)
  std::uint64_t blocks;  // blocks in the reserve
  std::uint32_t flags;   // ReportFlags
  std::uint32_t reserved;
};

// Dedup of read-only data (docs/dedup.md). The hook asks the daemon to share the whole chunks
// (granularity G) of bytes [offset, offset + bytes) of one of its alloc grants (offset and bytes
// multiples of G). The daemon hashes each chunk, confirms candidates with a byte compare, and
// plans the grant's new layout: shared chunks (mapped read-only, one physical copy per node and
// GPU), private copies of the rest of changed handles, and handles kept as they are. The plan is
// fetched in batches of at most kMaxHandlesPerGrant pieces: ShareRequest{first_piece 0} plans and
// returns the first batch, ShareRequest{first_piece k} (same grant) the batch from piece k. Then
// ShareCommit{commit 1} makes the new layout the grant's (the replaced handles return to the
// pool) or ShareCommit{commit 0} drops it; either way the daemon answers ShareAck. A session has
// at most one share in flight; a new ShareRequest{first_piece 0} aborts an unfinished one.
enum SharePieceFlags : std::uint32_t {
  kShareReadOnly = 1u << 0,  // a shared chunk: map it read-only
  kShareKeep = 1u << 1,      // the grant's old handle number `keep_index`, no descriptor attached
};
struct SharePiece {
  std::uint64_t size;
  std::uint64_t offset;      // inside the grant's VA range
  std::uint32_t flags;       // SharePieceFlags
  std::uint32_t keep_index;  // with kShareKeep: index of the old handle (grant order)
};
// ShareRequest::flags.
enum ShareRequestFlags : std::uint32_t {
  // An upload the hook offers on its own (transparent mode, docs/dedup.md): refused with
  // Status::dedup_disabled unless the tenant's namespace says `dedup: transparent`.
  kShareTransparent = 1u << 0,
};
struct ShareRequest {
  Header h;
  std::uint64_t grant_id;
  std::uint64_t offset;  // multiple of the granularity
  std::uint64_t bytes;   // > 0, multiple of the granularity
  std::uint32_t first_piece;
  std::uint32_t flags;  // ShareRequestFlags (was `reserved`: 0 = an explicit share)
};
struct ShareReply {
  Header h;
  Status status;              // ok, unknown_grant, bad_request (the grant cannot be shared), internal,
                              // out_of_memory (no room for the copies)
  std::uint32_t piece_count;  // pieces in this batch; a descriptor per piece without kShareKeep
  std::uint32_t first_piece;
  std::uint32_t total_pieces;
  std::uint64_t grant_id;
  std::uint64_t shared_bytes;  // bytes of the range now shared (whole chunks)
  std::uint64_t merged_bytes;  // of those, chunks that matched an existing shared chunk
  std::uint64_t copied_bytes;  // bytes copied into private handles (the rest of changed handles)
  SharePiece pieces[kMaxHandlesPerGrant];
};
struct ShareCommit {
  Header h;
  std::uint64_t grant_id;
  std::uint32_t commit;  // 1: the hook mapped the new layout; 0: abort
  std::uint32_t reserved;
};
struct ShareAck {
  Header h;
  Status status;
  std::uint32_t reserved;
  std::uint64_t shared_bytes;
};

// CUDA IPC of pool memory (docs/ipc.md). Served memory is VMM memory, which the driver's legacy
// IPC refuses, so the hook emulates cuIpcGetMemHandle / cuIpcOpenMemHandle / cuIpcCloseMemHandle
// through the daemon. IpcExport names one of the session's alloc grants; the daemon answers a
// token and a secret (random, unguessable) that stay the same for that grant until it is gone.
// The hook writes them into the application's 64-byte CUipcMemHandle (IpcHandleBlob). Another
// process (same tenant, or a tenant of the owner's `ipc_domain`) sends IpcOpen{token, secret};
// the daemon answers the grant's current layout, one descriptor per piece, and an import id.
// The memory stays charged to the owner: a grant the owner releases while imports are open stays
// held (and charged) until the last import is closed (IpcClose) or its session ends.
struct IpcExport {
  Header h;
  std::uint64_t grant_id;  // an alloc grant of this session
};
struct IpcExportReply {
  Header h;
  Status status;  // ok, unknown_grant, bad_request (not an alloc grant), limit_reached
  std::uint32_t reserved;
  std::uint64_t grant_id;
  std::uint64_t token;
  std::uint64_t secret;
  std::uint64_t bytes;  // the grant's bytes (its VA range)
};
struct IpcOpen {
  Header h;
  std::uint64_t token;
  std::uint64_t secret;
};
// IpcOpenReply::pieces[].flags use SharePieceFlags: kShareReadOnly marks a shared (dedup) chunk
// to be mapped read-only; kShareKeep never appears.
struct IpcOpenReply {
  Header h;
  Status status;                 // ok, unknown_handle, ipc_denied, limit_reached, internal
  std::uint32_t piece_count;     // descriptors attached, in order
  std::uint64_t import_id;       // names this import in IpcClose
  std::uint64_t bytes;           // the grant's bytes
  std::uint8_t device_uuid[16];  // the GPU the memory is on
  std::uint32_t owner_tenant;    // tenant id of the exporting session
  std::uint32_t reserved;
  SharePiece pieces[kMaxHandlesPerGrant];
};
struct IpcClose {
  Header h;
  std::uint64_t import_id;
};
struct IpcCloseAck {
  Header h;
  Status status;  // ok, unknown_handle
  std::uint32_t reserved;
};

// What the hook writes into a CUipcMemHandle (64 bytes, CU_IPC_HANDLE_SIZE) for served memory:
// processes pass it around as opaque bytes (torch.multiprocessing pickles it). `magic` tells a
// vlake handle from the driver's own; `offset` is where the exported pointer lies inside the
// grant's VA range (the importer returns its mapping's base + offset).
inline constexpr char kIpcHandleMagic[8] = {'v', 'l', 'k', 'I', 'P', 'C', '0', '1'};
struct IpcHandleBlob {
  char magic[8];
  std::uint64_t token;
  std::uint64_t secret;
  std::uint64_t offset;
  std::uint64_t bytes;  // the grant's bytes
  std::uint8_t device_uuid[16];
  std::uint64_t reserved;
};
static_assert(std::is_trivially_copyable_v<IpcHandleBlob> && sizeof(IpcHandleBlob) == 64);

// CUDA contexts (version 4, docs/quota.md "Contexts"). A context takes device memory (about
// 518 MiB on an H100) the moment the driver creates it, before any allocation, so the hook asks
// vlaked to admit that memory BEFORE it lets the driver create a context (a primary context's
// first retain, cuCtxCreate*, a green context): ContextRequest{admit} charges the GPU's context
// size (measured by vlaked: docs/daemon.md, "Contexts") to the session's tenant if its limit and
// its namespace's allow it, else answers over_limit / namespace_over_limit (nothing charged) and
// the hook fails the call with CUDA_ERROR_OUT_OF_MEMORY. ContextRequest{release} says a context
// admitted before is destroyed (unknown_grant when the session has no admitted context on that
// GPU). A session's admissions end with it. Once NVML lists the process on that GPU, its charge
// is the larger of NVML's figure and its admitted contexts times the context size.
enum class ContextOp : std::uint32_t {
  admit = 1,
  release = 2,
};
struct ContextRequest {
  Header h;
  std::uint8_t device_uuid[16];
  ContextOp op;
  std::uint32_t reserved;
};
struct ContextReply {
  Header h;
  Status status;           // ok, over_limit, namespace_over_limit, unknown_device, unknown_grant, limit_reached
  std::uint32_t contexts;  // the session's admitted contexts on that GPU afterwards
  std::uint64_t bytes;     // the context size charged per context on that GPU
  std::uint64_t limit;     // the tenant's (namespace_over_limit: the namespace's) limit on that GPU
  std::uint64_t used;      // its usage on that GPU afterwards (before, if refused)
};

// The host tier (version 5, docs/swap.md "Host tier"): vlaked moves whole alloc grants of an
// idle process to pinned host memory (VMM handles located on the host, mapped at the same
// addresses: the process keeps running, its kernels reach that memory over PCIe) and back. The
// process's hook does the move itself, so that nothing but its own worker touches its memory:
//   TierNotice{move_id, direction} (daemon -> client, unsolicited, request_id 0): a move starts.
//     The client closes its gate (hooked calls of application threads wait at entry), waits
//     until no application thread is inside a hooked call and synchronizes its contexts; then
//     it asks TierStep{move_id, grant 0}. A process that cannot stop now (a thread stays inside
//     a call) asks TierStep{move_id, grant 0, busy} and opens its gate.
//   TierPlan (reply): status ok with `grant_id` > 0: move that grant (its whole VA range,
//     `bytes`) to the pieces listed, `total_pieces` in all, this batch from `first_piece` (a
//     descriptor per piece, in order); TierStep{move_id, grant, none, first_piece k} fetches the
//     batch from piece k. Once it has every piece, the client copies the grant's data into them,
//     maps them in place of the old handles at the same addresses, releases the old handles and
//     asks TierStep{move_id, grant, moved} (or declined/failed: the grant stays as it was).
//     status ok with `grant_id` 0: the move is over; the client opens its gate. Any other status
//     (unknown_grant: the move was called off) also ends it.
//   Version 6: a client one of whose threads waits for an answer (a parked grant) is moved as
//     well: that thread is outside the gate while it waits and stops at it when the answer
//     comes. Its TierSteps then arrive while that request is unanswered (sent beside it), and
//     the TierPlan may reach whichever of its threads reads the connection: replies are matched
//     by request_id, never by order.
enum class TierDirection : std::uint32_t {
  to_host = 1,    // demote: device memory -> host memory
  to_device = 2,  // promote: host memory -> device memory
};
struct TierNotice {
  Header h;
  TierDirection direction;
  std::uint32_t reserved;
  std::uint64_t move_id;  // > 0
};
enum class TierResult : std::uint32_t {
  none = 0,      // ready (grant 0), or fetching a grant's next batch of pieces
  moved = 1,     // the grant's data is in the new pieces, mapped at its addresses; old handles released
  declined = 2,  // the grant cannot be moved (not found, peer-mapped, shared): it stays as it was
  busy = 3,      // (grant 0) the process could not stop: the move is off, the gate is open
  failed = 4,    // copying or mapping failed; the grant stays on its old handles
  // Version 6: nobody used the grant (it was in the client's local reserve): the client unmapped
  // it and released its imports instead of moving it; vlaked takes it back as a Release.
  released = 5,
};
struct TierStep {
  Header h;
  std::uint64_t move_id;
  std::uint64_t grant_id;  // 0: ready / busy
  TierResult result;
  std::uint32_t first_piece;  // result none with a grant: the batch wanted
};
struct TierPiece {
  std::uint64_t size;    // a multiple of the granularity
  std::uint64_t offset;  // inside the grant's VA range
};
struct TierPlan {
  Header h;
  Status status;              // ok, unknown_grant (no such move: it was called off)
  std::uint32_t piece_count;  // descriptors attached, in order
  std::uint64_t move_id;
  std::uint64_t grant_id;  // 0: the move is over
  std::uint64_t bytes;     // the grant's bytes (sum of every piece's size)
  TierDirection direction;
  std::uint32_t first_piece;
  std::uint32_t total_pieces;
  std::uint32_t reserved;
  TierPiece pieces[kMaxHandlesPerGrant];
};

struct Error {
  Header h;
  Status status;
  std::uint32_t reserved;
  char message[128];
};

#define VLAKE_PROTO_CHECK(T, bytes)                                       \
  static_assert(std::is_trivially_copyable_v<T>, #T " must be POD");      \
  static_assert(std::is_standard_layout_v<T>, #T " must be standard");    \
  static_assert(sizeof(T) == (bytes), #T " changed size: bump kVersion"); \
  static_assert(sizeof(T) <= kMaxMessageBytes)
VLAKE_PROTO_CHECK(Header, 24);
VLAKE_PROTO_CHECK(Hello, 80);
VLAKE_PROTO_CHECK(DeviceQuota, 40);
VLAKE_PROTO_CHECK(HelloAck, 768);
VLAKE_PROTO_CHECK(GrantRequest, 56);
VLAKE_PROTO_CHECK(GrantReply, 832);
VLAKE_PROTO_CHECK(Release, 40);
VLAKE_PROTO_CHECK(ReleaseAck, 40);
VLAKE_PROTO_CHECK(UsageQuery, 40);
VLAKE_PROTO_CHECK(UsageReply, 56);
VLAKE_PROTO_CHECK(Error, 160);
VLAKE_PROTO_CHECK(GuardEvent, 280);
VLAKE_PROTO_CHECK(Pressure, 56);
VLAKE_PROTO_CHECK(ReserveReport, 64);
VLAKE_PROTO_CHECK(SharePiece, 24);
VLAKE_PROTO_CHECK(ShareRequest, 56);
VLAKE_PROTO_CHECK(ShareReply, 840);
VLAKE_PROTO_CHECK(ShareCommit, 40);
VLAKE_PROTO_CHECK(ShareAck, 40);
VLAKE_PROTO_CHECK(IpcExport, 32);
VLAKE_PROTO_CHECK(IpcExportReply, 64);
VLAKE_PROTO_CHECK(IpcOpen, 40);
VLAKE_PROTO_CHECK(IpcOpenReply, 840);
VLAKE_PROTO_CHECK(IpcClose, 32);
VLAKE_PROTO_CHECK(IpcCloseAck, 32);
VLAKE_PROTO_CHECK(ReadOnlyWrite, 144);
VLAKE_PROTO_CHECK(Drop, 544);
VLAKE_PROTO_CHECK(Dropped, 544);
VLAKE_PROTO_CHECK(SwapNotice, 40);
VLAKE_PROTO_CHECK(SwapReady, 32);
VLAKE_PROTO_CHECK(SwapIn, 32);
VLAKE_PROTO_CHECK(SwapInReply, 40);
VLAKE_PROTO_CHECK(ContextRequest, 48);
VLAKE_PROTO_CHECK(ContextReply, 56);
VLAKE_PROTO_CHECK(TierNotice, 40);
VLAKE_PROTO_CHECK(TierStep, 48);
VLAKE_PROTO_CHECK(TierPiece, 16);
VLAKE_PROTO_CHECK(TierPlan, 584);
#undef VLAKE_PROTO_CHECK

// The struct each message type travels as.
constexpr std::size_t size_of(MsgType t) noexcept {
  switch (t) {
    case MsgType::hello: return sizeof(Hello);
    case MsgType::hello_ack: return sizeof(HelloAck);
    case MsgType::grant_request: return sizeof(GrantRequest);
    case MsgType::grant_reply: return sizeof(GrantReply);
    case MsgType::release: return sizeof(Release);
    case MsgType::release_ack: return sizeof(ReleaseAck);
    case MsgType::usage_query: return sizeof(UsageQuery);
    case MsgType::usage_reply: return sizeof(UsageReply);
    case MsgType::error: return sizeof(Error);
    case MsgType::guard_event: return sizeof(GuardEvent);
    case MsgType::pressure: return sizeof(Pressure);
    case MsgType::reserve_report: return sizeof(ReserveReport);
    case MsgType::share_request: return sizeof(ShareRequest);
    case MsgType::share_reply: return sizeof(ShareReply);
    case MsgType::share_commit: return sizeof(ShareCommit);
    case MsgType::share_ack: return sizeof(ShareAck);
    case MsgType::ipc_export: return sizeof(IpcExport);
    case MsgType::ipc_export_reply: return sizeof(IpcExportReply);
    case MsgType::ipc_open: return sizeof(IpcOpen);
    case MsgType::ipc_open_reply: return sizeof(IpcOpenReply);
    case MsgType::ipc_close: return sizeof(IpcClose);
    case MsgType::ipc_close_ack: return sizeof(IpcCloseAck);
    case MsgType::readonly_write: return sizeof(ReadOnlyWrite);
    case MsgType::drop: return sizeof(Drop);
    case MsgType::dropped: return sizeof(Dropped);
    case MsgType::swap_notice: return sizeof(SwapNotice);
    case MsgType::swap_ready: return sizeof(SwapReady);
    case MsgType::swap_in: return sizeof(SwapIn);
    case MsgType::swap_in_reply: return sizeof(SwapInReply);
    case MsgType::context_request: return sizeof(ContextRequest);
    case MsgType::context_reply: return sizeof(ContextReply);
    case MsgType::tier_notice: return sizeof(TierNotice);
    case MsgType::tier_step: return sizeof(TierStep);
    case MsgType::tier_plan: return sizeof(TierPlan);
  }
  return 0;
}

// Fills a header for message type T.
template <class T>
constexpr Header make_header(MsgType type, std::uint64_t request_id) {
  return Header{kMagic, kVersion, type, static_cast<std::uint32_t>(sizeof(T)), 0, request_id};
}

}  // namespace vlake::proto
