// vlake::scheduler events — Kubernetes Events for vlaked's refusals and guard alarms
// (docs/kubernetes.md, "Kubernetes Events"), posted by `vlake-events`.
//
// Pieces
// - EventMapper (pure): reads the refusal ring and the guard ring of a state snapshot
//   (contracts/state.hpp, RefusalLog and GuardLog) past a Cursor (the last seq seen of each) and
//   returns the Events to post and the new Cursor.
// - to_json(): the core/v1 Event object the API server takes on
//   POST /api/v1/namespaces/<namespace>/events.
// - ApiSink: that POST over HTTP(S) with libcurl (bearer token, CA file, short timeouts).
// - EventsOptions / events_main(): the `vlake-events` program.
//
// Mapping (EventMapper::map)
// - A tenant named "pod:<namespace>/<pod>/<container>" whose namespace and pod name are valid
//   Kubernetes names gets its events on that Pod, in the Pod's namespace. Every other tenant
//   (Unix users and groups, "alloc:<id>", a shortened pod name "…~<hash>") gets them on the Node
//   (EventMapper's node name), in namespace "default" (where cluster-scoped objects' events go).
// - Refusals: reason "VlakeRefused". Refusals of one tenant with one RefusalReason on one GPU
//   read in the same call become one event: count = how many, first/last timestamps = the oldest
//   and the newest, the message = the newest's, followed by "(N refusals like it)" when N > 1.
// - Guard alarms: reason "VlakeKernelFault" for a kernel fault (GuardKind fault and
//   fault_maps_shared), "VlakeGuardAlarm" for canary and readonly_write; one event each.
// - Every event has type "Warning". Guard events come first, then refusals, each oldest first.
//   At most `max_per_poll` events are returned, taken in turns by involved object (each one's
//   oldest first; one Pod's flood cannot crowd another's events out); `dropped` counts the rest
//   (never posted). Records pushed out of a ring before they were read are counted in
//   `overwritten`.
// - Cursors: start() gives the current end of both rings (only what happens afterwards is
//   posted), or {0, 0} to replay what the rings hold. When a ring's next seq is below the
//   cursor (a new segment after the daemon's state was reset), map() reads it from its start.
//   The rings are kept per tenant (a flood pushes out its own tenant's records, not the oldest;
//   contracts/state.hpp GuardLog): records are read in seq order (state::ring_order) and the
//   cursor is a seq, so a record older than another tenant's newest is still read.
//
// Thread-safety: EventMapper and to_json are pure; ApiSink is used from one thread.
// Errors: ApiSink::post never throws (failures are in its PostResult); EventsOptions::parse
// throws OptionsError; events_main catches everything and returns an exit status.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "vlake/contracts/state.hpp"
#include "vlake/scheduler/options.hpp"

namespace vlake::scheduler {

inline constexpr const char* kEventRefused = "VlakeRefused";
inline constexpr const char* kEventGuardAlarm = "VlakeGuardAlarm";
inline constexpr const char* kEventKernelFault = "VlakeKernelFault";
inline constexpr std::size_t kDefaultEventsPerPoll = 20;

struct KubeEvent {
  std::string ns;                // where the Event object is created
  std::string object_kind;       // "Pod" or "Node"
  std::string object_name;       // the pod's or the node's name
  std::string object_namespace;  // the pod's namespace; "" for the Node
  std::string reason;            // kEventRefused, kEventGuardAlarm, kEventKernelFault
  std::string type = "Warning";
  std::string message;  // one line
  std::uint64_t first_unix_ns = 0;
  std::uint64_t last_unix_ns = 0;
  std::uint32_t count = 1;
};

// The last seq read from each ring (0: none).
struct EventCursor {
  std::uint64_t refusal_seq = 0;
  std::uint64_t guard_seq = 0;
  bool operator==(const EventCursor&) const = default;
};

struct EventBatch {
  std::vector<KubeEvent> events;  // at most max_per_poll
  EventCursor cursor;             // past everything read, posted or dropped
  std::uint64_t dropped = 0;      // events over the cap
  std::uint64_t overwritten = 0;  // records overwritten in the ring before they were read
};

class EventMapper {
 public:
  explicit EventMapper(std::string node, std::size_t max_per_poll = kDefaultEventsPerPoll);

  // The rings' current end, or {0, 0} when `replay`.
  [[nodiscard]] static EventCursor start(const state::State& s, bool replay) noexcept;
  // The events of the records after `last` (see the header comment).
  [[nodiscard]] EventBatch map(const state::State& s, EventCursor last) const;

  [[nodiscard]] const std::string& node() const noexcept { return node_; }

 private:
  std::string node_;
  std::size_t max_per_poll_;
};

// Where a tenant's events go: {kind, name, namespace} ("Pod", pod, ns) for a valid
// "pod:<ns>/<pod>/<container>" name, else ("Node", node, "").
struct InvolvedObject {
  std::string kind;
  std::string name;
  std::string ns;
};
[[nodiscard]] InvolvedObject involved_object(const std::string& tenant, const std::string& node);

// "2026-01-02T03:04:05Z" (UTC, whole seconds).
[[nodiscard]] std::string rfc3339(std::uint64_t unix_ns);

// The core/v1 Event JSON (one line): metadata {generateName "vlake-", namespace}, involvedObject,
// reason, message, type, count, firstTimestamp, lastTimestamp, source {component, host},
// reportingComponent "vlake.io/vlaked", reportingInstance `node`. Strings are JSON-escaped
// (control characters as \u00XX; bytes >= 0x80 that are not valid UTF-8 as U+FFFD).
[[nodiscard]] std::string to_json(const KubeEvent& e, const std::string& node, const std::string& component = "vlake");

// Where and how to reach the API server.
struct ApiConfig {
  std::string server;      // "https://10.0.0.1:443", "http://127.0.0.1:8080" (no trailing '/')
  std::string token_file;  // "": no Authorization header; read again for every batch (tokens rotate)
  std::string ca_file;     // "": the system's CAs
  std::chrono::milliseconds connect_timeout{2000};
  std::chrono::milliseconds timeout{5000};
};

struct PostResult {
  bool ok = false;    // HTTP 2xx
  long status = 0;    // 0: no HTTP answer (see error)
  std::string error;  // transport error (connect, TLS, timeout), or ""
  std::string body;   // the answer's body (at most 4 KiB kept)
  bool transport_failed() const noexcept { return status == 0; }
};

// POST <server>/api/v1/namespaces/<ns>/events with the JSON body. One libcurl handle, reused.
class ApiSink {
 public:
  explicit ApiSink(ApiConfig config);
  ~ApiSink();
  ApiSink(const ApiSink&) = delete;
  ApiSink& operator=(const ApiSink&) = delete;

  // Reads the token file (once per call to refresh_token()); returns "" on success, else why.
  std::string refresh_token();
  [[nodiscard]] PostResult post(const std::string& ns, const std::string& json) noexcept;

 private:
  ApiConfig config_;
  std::string token_;
  void* curl_ = nullptr;  // CURL*
};

// vlake-events' command line.
struct EventsOptions {
  std::string state = "vlake-state";  // $VLAKE_STATE when set
  std::string node;                   // $NODE_NAME, else the host name
  std::chrono::milliseconds interval{2000};
  std::string api_server;  // "": https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT
  std::string token_file = "/var/run/secrets/kubernetes.io/serviceaccount/token";
  std::string ca_file = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt";
  std::size_t max_per_poll = kDefaultEventsPerPoll;
  bool once = false;
  bool replay = false;
  LogLevel log_level = LogLevel::info;
  bool help = false;

  // Environment defaults from `getenv` (VLAKE_STATE, NODE_NAME, KUBERNETES_SERVICE_HOST/PORT).
  // Throws OptionsError (bad values; no API server given and none in the environment).
  static EventsOptions parse(int argc, const char* const* argv);
  static std::string usage();
};

// The program: polls the state segment every interval and posts the events. Never throws.
int events_main(int argc, char** argv);

}  // namespace vlake::scheduler
