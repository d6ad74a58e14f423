#include "vlake/scheduler/events.hpp"

#include <curl/curl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string_view>
#include <thread>
#include <tuple>

#include "vlake/common/cli.hpp"
#include "vlake/common/log.hpp"
#include "vlake/common/size.hpp"

namespace vlake::scheduler {
namespace st = vlake::state;

namespace {

template <std::size_t N>
std::string bounded(const char (&chars)[N]) {
  return std::string(chars, std::find(chars, chars + N, '\0'));
}

// A DNS-1123 label: what Kubernetes namespaces are.
bool dns_label(std::string_view s) {
  if (s.empty() || s.size() > 63) return false;
  for (char c : s) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) return false;
  }
  return s.front() != '-' && s.back() != '-';
}

// A DNS-1123 subdomain: what pod names are.
bool dns_subdomain(std::string_view s) {
  if (s.empty() || s.size() > 253) return false;
  for (char c : s) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.')) return false;
  }
  const auto alnum = [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); };
  return alnum(s.front()) && alnum(s.back());
}

std::string gpu_text(std::uint32_t device) {
  return device == st::kGuardNoDevice ? std::string("an unknown GPU") : "GPU " + std::to_string(device);
}

std::string who(std::uint32_t pid, const std::string& tenant) {
  return "pid " + std::to_string(pid) + " (tenant " + (tenant.empty() ? std::string("unknown") : tenant) + ")";
}

std::string sz(std::uint64_t b) { return format_size(Bytes{b}); }

std::string refusal_message(const st::RefusalRecord& r, const std::string& tenant) {
  std::string m = "vlake refused " + (r.bytes != 0 ? sz(r.bytes) : std::string("a request")) + " on " +
                  gpu_text(r.device) + " for " + who(r.pid, tenant) + ": " + st::refusal_reason_name(r.reason);
  switch (r.reason) {
    case st::kRefusalTenantLimit:
    case st::kRefusalNamespaceLimit:
    case st::kRefusalGuarantee:
      if (r.limit != 0) m += ", used " + sz(r.used) + " of " + sz(r.limit);
      break;
    case st::kRefusalOutOfMemory:
    case st::kRefusalRestoreTimeout: m += ", " + sz(r.used) + " free on the GPU"; break;
    case st::kRefusalLimitReached:
      if (r.limit != 0) m += ", " + std::to_string(r.used) + " of at most " + std::to_string(r.limit);
      break;
    default: break;
  }
  if (r.waited_ms != 0) m += ", after waiting " + std::to_string(r.waited_ms) + "ms";
  return m;
}

std::string guard_message(const st::GuardEventRecord& e, const std::string& tenant) {
  const std::string call = bounded(e.call);
  const std::string where = " on " + gpu_text(e.device) + " in " + who(e.pid, tenant) + ": ";
  const auto kind = static_cast<proto::GuardKind>(e.kind);
  if (kind == proto::GuardKind::fault || kind == proto::GuardKind::fault_maps_shared) {
    const bool shared = kind == proto::GuardKind::fault_maps_shared || (e.flags & st::kFaultMapsShared) != 0;
    return "vlake: kernel fault" + where + (call.empty() ? std::string("a call") : call) + " returned CUDA error " +
           std::to_string(e.cuda_status) + " (guarded=" + ((e.flags & st::kFaultGuarded) != 0 ? "yes" : "no") +
           ", maps_shared=" + (shared ? "yes" : "no") + ")";
  }
  if (kind == proto::GuardKind::canary) {
    return "vlake guard alarm" + where + "the canary after a " + sz(e.requested_bytes) +
           " allocation was damaged at offset " + std::to_string(e.first_bad_offset) + " (grant " +
           std::to_string(e.grant_id) + (call.empty() ? std::string() : ", found on " + call) + ")";
  }
  if (kind == proto::GuardKind::readonly_write) {
    return "vlake guard alarm" + where + (call.empty() ? std::string("a call") : call) + " tried to write " +
           sz(e.requested_bytes) + " into shared read-only memory (offset " + std::to_string(e.first_bad_offset) +
           " of the allocation; refused with CUDA error " + std::to_string(e.cuda_status) + ")";
  }
  return "vlake guard alarm" + where + "kind " + std::to_string(e.kind);
}

KubeEvent make_event(const std::string& tenant, const std::string& node, const char* reason, std::string message,
                     std::uint64_t t) {
  KubeEvent k;
  const InvolvedObject o = involved_object(tenant, node);
  k.object_kind = o.kind;
  k.object_name = o.name;
  k.object_namespace = o.ns;
  k.ns = o.ns.empty() ? "default" : o.ns;
  k.reason = reason;
  k.message = std::move(message);
  k.first_unix_ns = t;
  k.last_unix_ns = t;
  return k;
}

// The records of a ring (GuardLog, RefusalLog) after the cursor `last`, oldest first; `cursor`
// becomes the ring's newest seq. The rings are kept per tenant, not in slot order: the records
// are taken by seq (state::ring_order), and every seq after `last` that the ring no longer
// holds was pushed out before it was read (counted in `overwritten`). A cursor past the ring's
// end (a new segment after a reset) restarts at 0.
template <typename Log>
auto unread(const Log& log, std::uint64_t last, std::uint64_t& cursor, std::uint64_t& overwritten) {
  const std::uint64_t next = log.next_seq == 0 ? 1 : log.next_seq;
  if (last >= next) last = 0;  // the ring is behind the cursor: a new segment
  auto records = st::ring_order(log);
  std::erase_if(records, [&](const auto* r) { return r->seq <= last || r->seq >= next; });
  overwritten += (next - 1 - last) - records.size();
  cursor = next - 1;
  return records;
}

// Of `all` (more than `cap`), `cap` events taken in turns by involved object (each one's oldest
// first), in their order in `all`: one tenant's flood cannot crowd another's events out of a poll.
std::vector<KubeEvent> fair_share(std::vector<KubeEvent> all, std::size_t cap) {
  std::vector<std::string> order;                             // involved objects, by first event
  std::map<std::string, std::vector<std::size_t>> by_object;  // object -> indexes in `all`
  for (std::size_t i = 0; i < all.size(); ++i) {
    const std::string key = all[i].ns + '\n' + all[i].object_kind + '\n' + all[i].object_name;
    auto [it, fresh] = by_object.try_emplace(key);
    if (fresh) order.push_back(key);
    it->second.push_back(i);
  }
  std::vector<std::size_t> taken;
  for (std::size_t round = 0; taken.size() < cap; ++round) {
    for (const std::string& key : order) {
      const auto& mine = by_object.at(key);
      if (round < mine.size() && taken.size() < cap) taken.push_back(mine[round]);
    }
  }
  std::sort(taken.begin(), taken.end());
  std::vector<KubeEvent> out;
  out.reserve(taken.size());
  for (std::size_t i : taken) out.push_back(std::move(all[i]));
  return out;
}

void json_string(std::string& out, std::string_view s) {
  out += '"';
  std::size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      if (c == '"') out += "\\\"";
      else if (c == '\\') out += "\\\\";
      else if (c == '\n') out += "\\n";
      else if (c == '\t') out += "\\t";
      else if (c < 0x20 || c == 0x7f) {
        char buf[8];
        std::snprintf(buf, sizeof buf, "\\u%04x", c);
        out += buf;
      } else out += static_cast<char>(c);
      ++i;
      continue;
    }
    // A UTF-8 sequence: copied when well formed (no overlongs, surrogates or > U+10FFFF).
    std::size_t n = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc2 ? 2 : 0;
    if (c > 0xf4) n = 0;
    bool good = n != 0 && i + n <= s.size();
    for (std::size_t k = 1; good && k < n; ++k) good = (static_cast<unsigned char>(s[i + k]) & 0xc0) == 0x80;
    if (good && n >= 3) {
      const auto c1 = static_cast<unsigned char>(s[i + 1]);
      if (c == 0xe0 && c1 < 0xa0) good = false;   // overlong
      if (c == 0xed && c1 >= 0xa0) good = false;  // surrogate
      if (c == 0xf0 && c1 < 0x90) good = false;   // overlong
      if (c == 0xf4 && c1 >= 0x90) good = false;  // > U+10FFFF
    }
    if (good) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      out += "\\ufffd";
      ++i;
    }
  }
  out += '"';
}

void field(std::string& out, const char* name, std::string_view value, bool comma = true) {
  if (comma) out += ',';
  json_string(out, name);
  out += ':';
  json_string(out, value);
}

}  // namespace

InvolvedObject involved_object(const std::string& tenant, const std::string& node) {
  constexpr std::string_view kPod = "pod:";
  if (tenant.rfind(kPod, 0) == 0) {
    const std::string_view rest = std::string_view(tenant).substr(kPod.size());
    const auto a = rest.find('/');
    const auto b = a == std::string_view::npos ? a : rest.find('/', a + 1);
    if (b != std::string_view::npos) {
      const std::string_view ns = rest.substr(0, a);
      const std::string_view pod = rest.substr(a + 1, b - a - 1);
      if (dns_label(ns) && dns_subdomain(pod)) return {"Pod", std::string(pod), std::string(ns)};
    }
  }
  return {"Node", node, ""};
}

std::string rfc3339(std::uint64_t unix_ns) {
  const std::time_t t = static_cast<std::time_t>(unix_ns / 1'000'000'000ull);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

EventMapper::EventMapper(std::string node, std::size_t max_per_poll)
    : node_(std::move(node)), max_per_poll_(max_per_poll) {}

EventCursor EventMapper::start(const st::State& s, bool replay) noexcept {
  if (replay) return {};
  return {s.refusals.next_seq > 0 ? s.refusals.next_seq - 1 : 0, s.guard.next_seq > 0 ? s.guard.next_seq - 1 : 0};
}

EventBatch EventMapper::map(const st::State& s, EventCursor last) const {
  EventBatch out;
  std::vector<KubeEvent> all;

  for (const st::GuardEventRecord* ep : unread(s.guard, last.guard_seq, out.cursor.guard_seq, out.overwritten)) {
    const st::GuardEventRecord& e = *ep;
    const auto kind = static_cast<proto::GuardKind>(e.kind);
    const bool fault = kind == proto::GuardKind::fault || kind == proto::GuardKind::fault_maps_shared;
    const std::string tenant = bounded(e.tenant_name);
    all.push_back(make_event(tenant, node_, fault ? kEventKernelFault : kEventGuardAlarm, guard_message(e, tenant),
                             e.time_unix_ns));
  }

  // (tenant id, tenant name, reason, device) -> index in `all`
  std::map<std::tuple<std::uint32_t, std::string, std::uint32_t, std::uint32_t>, std::size_t> groups;
  for (const st::RefusalRecord* rp : unread(s.refusals, last.refusal_seq, out.cursor.refusal_seq, out.overwritten)) {
    const st::RefusalRecord& r = *rp;
    const std::string tenant = bounded(r.tenant_name);
    const auto key = std::make_tuple(r.tenant, tenant, r.reason, r.device);
    if (auto it = groups.find(key); it != groups.end()) {
      KubeEvent& k = all[it->second];
      ++k.count;
      k.first_unix_ns = std::min(k.first_unix_ns, r.time_unix_ns);
      k.last_unix_ns = std::max(k.last_unix_ns, r.time_unix_ns);
      k.message = refusal_message(r, tenant);
      continue;
    }
    groups.emplace(key, all.size());
    all.push_back(make_event(tenant, node_, kEventRefused, refusal_message(r, tenant), r.time_unix_ns));
  }
  for (KubeEvent& k : all) {
    if (k.count > 1) k.message += " (" + std::to_string(k.count) + " refusals like it)";
  }

  if (all.size() > max_per_poll_) {
    out.dropped = all.size() - max_per_poll_;
    all = fair_share(std::move(all), max_per_poll_);
  }
  out.events = std::move(all);
  return out;
}

std::string to_json(const KubeEvent& e, const std::string& node, const std::string& component) {
  std::string j = "{";
  field(j, "apiVersion", "v1", false);
  field(j, "kind", "Event");
  j += ",\"metadata\":{";
  field(j, "generateName", "vlake-", false);
  field(j, "namespace", e.ns);
  j += "},\"involvedObject\":{";
  field(j, "apiVersion", "v1", false);
  field(j, "kind", e.object_kind);
  field(j, "name", e.object_name);
  if (!e.object_namespace.empty()) field(j, "namespace", e.object_namespace);
  j += '}';
  field(j, "reason", e.reason);
  field(j, "message", e.message);
  field(j, "type", e.type);
  j += ",\"count\":" + std::to_string(e.count);
  field(j, "firstTimestamp", rfc3339(e.first_unix_ns));
  field(j, "lastTimestamp", rfc3339(e.last_unix_ns));
  j += ",\"source\":{";
  field(j, "component", component, false);
  field(j, "host", node);
  j += '}';
  field(j, "reportingComponent", "vlake.io/vlaked");
  field(j, "reportingInstance", node);
  j += '}';
  return j;
}

// ---- ApiSink

namespace {

std::size_t keep_body(char* data, std::size_t size, std::size_t n, void* user) {
  auto* body = static_cast<std::string*>(user);
  const std::size_t bytes = size * n;
  if (body->size() < 4096) body->append(data, std::min(bytes, 4096 - body->size()));
  return bytes;
}

}  // namespace

ApiSink::ApiSink(ApiConfig config) : config_(std::move(config)), curl_(curl_easy_init()) {
  if (curl_ == nullptr) throw std::runtime_error("libcurl: curl_easy_init failed");
}

ApiSink::~ApiSink() { curl_easy_cleanup(static_cast<CURL*>(curl_)); }

std::string ApiSink::refresh_token() {
  if (config_.token_file.empty()) return {};
  std::ifstream in(config_.token_file);
  if (!in) return "cannot read the token file " + config_.token_file;
  std::stringstream ss;
  ss << in.rdbuf();
  std::string t = ss.str();
  while (!t.empty() && std::isspace(static_cast<unsigned char>(t.back())) != 0) t.pop_back();
  if (t.empty()) return "the token file " + config_.token_file + " is empty";
  token_ = std::move(t);
  return {};
}

PostResult ApiSink::post(const std::string& ns, const std::string& json) noexcept {
  PostResult r;
  try {
    CURL* c = static_cast<CURL*>(curl_);
    curl_easy_reset(c);
    const std::string url = config_.server + "/api/v1/namespaces/" + ns + "/events";
    curl_slist* headers = curl_slist_append(nullptr, "Content-Type: application/json");
    headers = curl_slist_append(headers, "Accept: application/json");
    std::string auth;
    if (!token_.empty()) {
      auth = "Authorization: Bearer " + token_;
      headers = curl_slist_append(headers, auth.c_str());
    }
    char err[CURL_ERROR_SIZE] = {};
    curl_easy_setopt(c, CURLOPT_URL, url.c_str());
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(c, CURLOPT_POST, 1L);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, json.c_str());
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, static_cast<long>(json.size()));
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(config_.connect_timeout.count()));
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, static_cast<long>(config_.timeout.count()));
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, err);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, keep_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &r.body);
    if (!config_.ca_file.empty()) curl_easy_setopt(c, CURLOPT_CAINFO, config_.ca_file.c_str());
    const CURLcode rc = curl_easy_perform(c);
    curl_slist_free_all(headers);
    if (rc != CURLE_OK) {
      r.error = err[0] != '\0' ? std::string(err) : std::string(curl_easy_strerror(rc));
      return r;
    }
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r.status);
    r.ok = r.status >= 200 && r.status < 300;
  } catch (const std::exception& e) {
    r.error = e.what();
  }
  return r;
}

// ---- the program

EventsOptions EventsOptions::parse(int argc, const char* const* argv) {
  EventsOptions o;
  if (const char* s = std::getenv("VLAKE_STATE"); s != nullptr && *s != '\0') o.state = s;
  if (const char* n = std::getenv("NODE_NAME"); n != nullptr && *n != '\0') o.node = n;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--once") {
      o.once = true;
      continue;
    }
    if (a == "--replay") {
      o.replay = true;
      continue;
    }
    static constexpr std::string_view kKnown[] = {"--state",      "--node",    "--interval",   "--api-server",
                                                  "--token-file", "--ca-file", "--max-events", "--log-level"};
    const cli::Option opt = cli::read_option<OptionsError>(argc, argv, i, kKnown);
    if (opt.help) {
      o.help = true;
      continue;
    }
    const std::string& arg = opt.name;
    const std::string& value = opt.value;
    if (arg == "--token-file") o.token_file = value;  // "" allowed: no token
    else if (arg == "--ca-file") o.ca_file = value;   // "" allowed: the system's CAs
    else if (value.empty()) throw OptionsError("option " + arg + " needs a non-empty value");
    else if (arg == "--state") o.state = value;
    else if (arg == "--node") o.node = value;
    else if (arg == "--api-server") {
      o.api_server = value;
      while (!o.api_server.empty() && o.api_server.back() == '/') o.api_server.pop_back();
      if (o.api_server.rfind("http://", 0) != 0 && o.api_server.rfind("https://", 0) != 0)
        throw OptionsError("--api-server must be an http:// or https:// URL, got '" + value + "'");
    } else if (arg == "--interval") {
      try {
        o.interval = parse_duration(value);
      } catch (const std::invalid_argument& e) {
        throw OptionsError("--interval: " + std::string(e.what()));
      }
    } else if (arg == "--max-events") {
      const bool digits = value.size() <= 6 && std::all_of(value.begin(), value.end(), [](char c) {
                            return std::isdigit(static_cast<unsigned char>(c)) != 0;
                          });
      if (!digits || std::stoul(value) == 0)
        throw OptionsError("--max-events must be a whole number from 1 to 999999, got '" + value + "'");
      o.max_per_poll = std::stoul(value);
    } else if (arg == "--log-level") {
      try {
        o.log_level = parse_log_level(value);
      } catch (const std::invalid_argument& e) {
        throw OptionsError("--log-level: " + std::string(e.what()));
      }
    }
  }
  if (o.help) return o;
  if (o.node.empty()) {
    char host[256] = {};
    if (::gethostname(host, sizeof host - 1) == 0) o.node = host;
    if (o.node.empty()) throw OptionsError("no node name: set --node or NODE_NAME");
  }
  if (o.api_server.empty()) {
    const char* h = std::getenv("KUBERNETES_SERVICE_HOST");
    const char* p = std::getenv("KUBERNETES_SERVICE_PORT");
    if (h == nullptr || *h == '\0')
      throw OptionsError("no API server: set --api-server, or run in a pod (KUBERNETES_SERVICE_HOST)");
    const std::string host = h;
    o.api_server = "https://" + (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" +
                   (p != nullptr && *p != '\0' ? p : "443");
  }
  return o;
}

std::string EventsOptions::usage() {
  return "usage: vlake-events [options]\n"
         "Posts Kubernetes Events for vlaked's refusals and guard alarms (docs/kubernetes.md).\n"
         "  --state NAME|PATH     vlaked's state segment (default $VLAKE_STATE, else vlake-state): a\n"
         "                        name in $VLAKE_STATE_DIR (default /run/vlake/state) or an absolute path\n"
         "  --node NAME           this node's name (default $NODE_NAME, else the host name)\n"
         "  --interval DUR        how often the segment is read (default 2s)\n"
         "  --api-server URL      the API server (default https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT)\n"
         "  --token-file PATH     bearer token, read before each batch; '' for none\n"
         "                        (default /var/run/secrets/kubernetes.io/serviceaccount/token)\n"
         "  --ca-file PATH        CA bundle for the API server; '' for the system's\n"
         "                        (default /var/run/secrets/kubernetes.io/serviceaccount/ca.crt)\n"
         "  --max-events N        events posted per read at most; the rest are counted and dropped (default 20)\n"
         "  --once                read once, post, exit (0: all posted)\n"
         "  --replay              also post what the rings hold at start (default: only what comes after)\n"
         "  --log-level LEVEL     debug, info, warn or error (default info)\n"
         "  --help                this text\n";
}

namespace {

volatile std::sig_atomic_t g_stop = 0;
extern "C" void on_stop(int) { g_stop = 1; }

struct Pending {
  KubeEvent event;
  bool retried = false;
};

int run(const EventsOptions& o, const Logger& log) {
  ApiConfig cfg;
  cfg.server = o.api_server;
  cfg.token_file = o.token_file;
  cfg.ca_file = o.ca_file;
  ApiSink sink(cfg);
  const EventMapper mapper(o.node, o.max_per_poll);
  std::optional<EventCursor> cursor;
  std::vector<Pending> retry;
  std::uint64_t posted = 0;
  std::uint64_t failed = 0;
  std::string last_state_error;
  log.info("posting events of state segment " + o.state + " for node " + o.node + " to " + o.api_server);

  while (g_stop == 0) {
    bool poll_failed = false;
    std::unique_ptr<st::State> snap;
    try {
      const st::StateReader reader(o.state);  // opened each time: follows a recreated segment
      snap = reader.snapshot();
      last_state_error.clear();
    } catch (const std::exception& e) {
      if (e.what() != last_state_error) log.warn(std::string("cannot read the state segment: ") + e.what());
      last_state_error = e.what();
      if (o.once) return 1;
    }
    std::vector<Pending> todo = std::move(retry);
    retry.clear();
    if (snap) {
      if (!cursor) cursor = EventMapper::start(*snap, o.replay);
      EventBatch b = mapper.map(*snap, *cursor);
      cursor = b.cursor;
      if (b.dropped != 0)
        log.warn("dropped " + std::to_string(b.dropped) + " events over the limit of " +
                 std::to_string(o.max_per_poll) + " per read");
      if (b.overwritten != 0)
        log.warn(std::to_string(b.overwritten) +
                 " records were overwritten in the state segment before they were read");
      for (KubeEvent& e : b.events) todo.push_back({std::move(e), false});
    }
    if (!todo.empty()) {
      if (const std::string err = sink.refresh_token(); !err.empty()) log.warn(err);
    }
    bool unreachable = false;
    for (Pending& p : todo) {
      if (!unreachable) {
        const PostResult r = sink.post(p.event.ns, to_json(p.event, o.node));
        if (r.ok) {
          ++posted;
          log.debug("posted " + p.event.reason + " on " + p.event.object_kind + " " + p.event.object_name);
          continue;
        }
        ++failed;
        poll_failed = true;
        if (r.transport_failed()) {
          unreachable = true;  // the rest of this read waits for the next one: no long stalls
          log.warn("POST events to " + o.api_server + " failed: " + r.error);
        } else {
          log.warn("POST events in namespace " + p.event.ns + " failed: HTTP " + std::to_string(r.status) + ": " +
                   r.body);
        }
      }
      // Not posted: tried again on the next read, once.
      if (!p.retried && !o.once) retry.push_back({std::move(p.event), true});
      else log.warn("gave up on a " + p.event.reason + " event for " + p.event.object_kind + " " + p.event.object_name);
    }
    if (o.once) {
      log.info("posted " + std::to_string(posted) + " events, " + std::to_string(failed) + " failed");
      return poll_failed ? 1 : 0;
    }
    const auto until = std::chrono::steady_clock::now() + o.interval;
    while (g_stop == 0 && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  log.info("stopping: posted " + std::to_string(posted) + " events, " + std::to_string(failed) + " failed");
  return 0;
}

}  // namespace

int events_main(int argc, char** argv) {
  try {
    const EventsOptions o = EventsOptions::parse(argc, argv);
    if (o.help) {
      std::fputs(EventsOptions::usage().c_str(), stdout);
      return 0;
    }
    const Logger log(o.log_level);
    struct sigaction sa {};
    sa.sa_handler = on_stop;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, nullptr);
    sigaction(SIGINT, &sa, nullptr);
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
      log.error("libcurl: curl_global_init failed");
      return 1;
    }
    const int rc = run(o, log);
    curl_global_cleanup();
    return rc;
  } catch (const OptionsError& e) {
    std::fprintf(stderr, "vlake-events: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "vlake-events: %s\n", e.what());
    return 1;
  } catch (...) {
    std::fprintf(stderr, "vlake-events: unknown error\n");
    return 1;
  }
}

}  // namespace vlake::scheduler
