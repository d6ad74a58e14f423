// Kubernetes Events (scheduler/include/vlake/scheduler/events.hpp): EventMapper and to_json over
// synthetic states, the options; then vlake-events as a process against a state segment the
// test writes and a loopback HTTP server standing in for the API server; and against a real
// vlaked on the simulator whose refusal ring colluding tenants flood (rings per tenant).
#include <arpa/inet.h>
#include <grp.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ctl_process.hpp"
#include "harness.hpp"
#include "http_get.hpp"
#include "json_parse.hpp"
#include "pool_client.hpp"
#include "process.hpp"
#include "vlake/common/fixed_chars.hpp"
#include "vlake/contracts/state.hpp"
#include "vlake/scheduler/events.hpp"

using namespace vlake;
using namespace vlake::scheduler;
namespace st = vlake::state;
using vlake::ctltest::parse_json;

namespace {

constexpr std::uint64_t kT0 = 1'767'225'600ull * 1'000'000'000ull;  // 2026-01-01T00:00:00Z

struct Refusal {
  std::string tenant;
  std::uint32_t tenant_id = 1;
  std::uint32_t reason = st::kRefusalTenantLimit;
  std::uint32_t device = 0;
  std::uint32_t pid = 1234;
  std::uint64_t bytes = 4ull << 30;
  std::uint64_t used = 3584ull << 20;
  std::uint64_t limit = 4ull << 30;
  std::uint64_t time = kT0;
};

void add_refusal(st::State& s, const Refusal& r) {
  if (s.refusals.next_seq == 0) s.refusals.next_seq = 1;
  const std::uint64_t seq = s.refusals.next_seq++;
  st::RefusalRecord& x = s.refusals.refusals[(seq - 1) % st::kRefusalEvents];
  x = st::RefusalRecord{};
  x.seq = seq;
  x.time_unix_ns = r.time;
  x.tenant = r.tenant_id;
  x.pid = r.pid;
  x.device = r.device;
  x.reason = r.reason;
  x.bytes = r.bytes;
  x.used = r.used;
  x.limit = r.limit;
  copy_chars(x.tenant_name, r.tenant);
}

void add_guard(st::State& s, proto::GuardKind kind, const std::string& tenant, std::uint32_t flags = 0) {
  if (s.guard.next_seq == 0) s.guard.next_seq = 1;
  const std::uint64_t seq = s.guard.next_seq++;
  st::GuardEventRecord& e = s.guard.events[(seq - 1) % st::kGuardEvents];
  e = st::GuardEventRecord{};
  e.seq = seq;
  e.time_unix_ns = kT0 + seq * 1'000'000'000ull;
  e.kind = static_cast<std::uint32_t>(kind);
  e.tenant = 2;
  e.device = 1;
  e.pid = 77;
  e.flags = flags;
  e.cuda_status = 700;
  e.requested_bytes = 2ull << 20;
  e.first_bad_offset = 2097152;
  e.grant_id = 9;
  copy_chars(e.call, kind == proto::GuardKind::canary ? "sweep" : "cuStreamSynchronize");
  copy_chars(e.tenant_name, tenant);
}

std::unique_ptr<st::State> empty_state() { return std::make_unique<st::State>(); }

}  // namespace

TEST_CASE("events: pod tenants name their Pod and other tenants the Node", "[events]") {
  auto s = empty_state();
  add_refusal(*s, {.tenant = "pod:team-a/trainer-0/main"});
  add_refusal(*s, {.tenant = "team/user:alice", .tenant_id = 2});
  add_refusal(*s, {.tenant = "uid:1000", .tenant_id = 3});
  add_refusal(*s, {.tenant = "pod:team-a/averyveryverylongpodname~1a2b3c4d/main", .tenant_id = 4});
  add_refusal(*s, {.tenant = "alloc:0123456789abcdef", .tenant_id = 5});
  const EventBatch b = EventMapper("node-1").map(*s, {});
  REQUIRE(b.events.size() == 5);
  const KubeEvent& pod = b.events[0];
  CHECK(pod.object_kind == "Pod");
  CHECK(pod.object_name == "trainer-0");
  CHECK(pod.object_namespace == "team-a");
  CHECK(pod.ns == "team-a");
  CHECK(pod.reason == "VlakeRefused");
  CHECK(pod.type == "Warning");
  CHECK(pod.count == 1);
  CHECK(pod.message ==
        "vlake refused 4GiB on GPU 0 for pid 1234 (tenant pod:team-a/trainer-0/main): tenant_limit, used 3584MiB of "
        "4GiB");
  for (std::size_t i = 1; i < 5; ++i) {
    INFO(b.events[i].message);
    CHECK(b.events[i].object_kind == "Node");
    CHECK(b.events[i].object_name == "node-1");
    CHECK(b.events[i].object_namespace.empty());
    CHECK(b.events[i].ns == "default");
  }
  CHECK(b.cursor == EventCursor{5, 0});
  CHECK(involved_object("pod:Bad_NS/p/c", "n").kind == "Node");
  CHECK(involved_object("pod:ns/p", "n").kind == "Node");
  CHECK(involved_object("pod:ns/p.q-1/c", "n").name == "p.q-1");
}

TEST_CASE("events: refusals of one tenant and reason and GPU in one read become one event with a count", "[events]") {
  auto s = empty_state();
  add_refusal(*s, {.tenant = "pod:ns/p/c", .time = kT0});
  add_refusal(*s, {.tenant = "pod:ns/p/c", .device = 1, .time = kT0 + 1});
  add_refusal(*s, {.tenant = "pod:ns/p/c", .bytes = 1ull << 30, .time = kT0 + 5'000'000'000ull});
  add_refusal(*s, {.tenant = "pod:ns/p/c",
                   .reason = st::kRefusalOutOfMemory,
                   .bytes = 8ull << 30,
                   .used = 512ull << 20,
                   .limit = 0,
                   .time = kT0 + 2});
  add_refusal(*s, {.tenant = "pod:ns/q/c", .tenant_id = 2, .time = kT0 + 3});
  const EventBatch b = EventMapper("n").map(*s, {});
  REQUIRE(b.events.size() == 4);
  const KubeEvent& agg = b.events[0];
  CHECK(agg.count == 2);
  CHECK(agg.first_unix_ns == kT0);
  CHECK(agg.last_unix_ns == kT0 + 5'000'000'000ull);
  CHECK(agg.message ==
        "vlake refused 1GiB on GPU 0 for pid 1234 (tenant pod:ns/p/c): tenant_limit, used 3584MiB of 4GiB (2 "
        "refusals like it)");
  CHECK(b.events[1].message.find("on GPU 1 ") != std::string::npos);
  CHECK(b.events[1].count == 1);
  CHECK(b.events[2].message ==
        "vlake refused 8GiB on GPU 0 for pid 1234 (tenant pod:ns/p/c): out_of_memory, 512MiB free on the GPU");
  CHECK(b.events[3].object_name == "q");
  CHECK(b.dropped == 0);
}

TEST_CASE("events: guard alarms and kernel faults", "[events]") {
  auto s = empty_state();
  add_guard(*s, proto::GuardKind::fault, "pod:ns/p/c", st::kFaultGuarded);
  add_guard(*s, proto::GuardKind::canary, "team/user:bob");
  add_guard(*s, proto::GuardKind::readonly_write, "pod:ns/p/c");
  add_refusal(*s, {.tenant = "pod:ns/p/c"});
  const EventBatch b = EventMapper("n").map(*s, {});
  REQUIRE(b.events.size() == 4);
  CHECK(b.events[0].reason == "VlakeKernelFault");
  CHECK(b.events[0].message ==
        "vlake: kernel fault on GPU 1 in pid 77 (tenant pod:ns/p/c): cuStreamSynchronize returned CUDA error 700 "
        "(guarded=yes, maps_shared=no)");
  CHECK(b.events[1].reason == "VlakeGuardAlarm");
  CHECK(b.events[1].object_kind == "Node");
  CHECK(b.events[1].message ==
        "vlake guard alarm on GPU 1 in pid 77 (tenant team/user:bob): the canary after a 2MiB allocation was damaged "
        "at offset 2097152 (grant 9, found on sweep)");
  CHECK(b.events[2].reason == "VlakeGuardAlarm");
  CHECK(b.events[2].message.find("into shared read-only memory") != std::string::npos);
  CHECK(b.events[3].reason == "VlakeRefused");
  CHECK(b.cursor == EventCursor{1, 3});
}

TEST_CASE("events: at most max_per_poll events and the rest counted as dropped", "[events]") {
  auto s = empty_state();
  for (std::uint32_t i = 0; i < 30; ++i) add_refusal(*s, {.tenant = "uid:" + std::to_string(i), .tenant_id = i + 1});
  const EventBatch b = EventMapper("n").map(*s, {});
  CHECK(b.events.size() == kDefaultEventsPerPoll);
  CHECK(b.dropped == 30 - kDefaultEventsPerPoll);
  CHECK(b.cursor.refusal_seq == 30);
  CHECK(b.events.front().message.find("tenant uid:0)") != std::string::npos);
  const EventBatch small = EventMapper("n", 3).map(*s, {});
  CHECK(small.events.size() == 3);
  CHECK(small.dropped == 27);
}

TEST_CASE("events: start at the end of the rings or replay them", "[events]") {
  auto s = empty_state();
  const EventCursor none = EventMapper::start(*s, false);
  CHECK(none == EventCursor{0, 0});
  add_refusal(*s, {.tenant = "uid:1"});
  add_refusal(*s, {.tenant = "uid:1", .reason = st::kRefusalGuarantee});
  add_guard(*s, proto::GuardKind::canary, "uid:1");
  const EventMapper m("n");
  const EventCursor end = EventMapper::start(*s, false);
  CHECK(end == EventCursor{2, 1});
  CHECK(m.map(*s, end).events.empty());
  CHECK(m.map(*s, end).cursor == end);
  const EventCursor replay = EventMapper::start(*s, true);
  CHECK(replay == EventCursor{0, 0});
  CHECK(m.map(*s, replay).events.size() == 3);
  add_refusal(*s, {.tenant = "uid:2", .tenant_id = 2});
  const EventBatch next = m.map(*s, end);
  REQUIRE(next.events.size() == 1);
  CHECK(next.events[0].message.find("tenant uid:2") != std::string::npos);
  CHECK(next.cursor == EventCursor{3, 1});
  // A ring behind the cursor (a new segment): read from its start.
  const EventBatch reset = m.map(*s, {100, 50});
  CHECK(reset.events.size() == 4);
  CHECK(reset.cursor == EventCursor{3, 1});
}

TEST_CASE("events: the ring wraps around", "[events]") {
  auto s = empty_state();
  const std::uint64_t total = st::kRefusalEvents + 40;
  for (std::uint64_t i = 1; i <= total; ++i) {
    add_refusal(*s, {.tenant = "uid:" + std::to_string(i % 5),
                     .tenant_id = static_cast<std::uint32_t>(i % 5 + 1),
                     .time = kT0 + i});
  }
  const EventMapper m("n");
  // Cursor 10: seqs 11..40 were overwritten; 41..296 are in the ring (256 records, 5 tenants).
  const EventBatch b = m.map(*s, {10, 0});
  CHECK(b.overwritten == 30);
  CHECK(b.cursor.refusal_seq == total);
  REQUIRE(b.events.size() == 5);
  std::uint32_t count = 0;
  for (const KubeEvent& e : b.events) count += e.count;
  CHECK(count == st::kRefusalEvents);
  CHECK(b.events[0].first_unix_ns == kT0 + 41);
  // Only the records after the cursor, across the wrap: seqs 290..296.
  const EventBatch tail = m.map(*s, {total - 7, 0});
  CHECK(tail.overwritten == 0);
  count = 0;
  for (const KubeEvent& e : tail.events) count += e.count;
  CHECK(count == 7);
  // A slot whose seq does not match (being overwritten) is skipped.
  s->refusals.refusals[(total - 1) % st::kRefusalEvents].seq = 0;
  count = 0;
  for (const KubeEvent& e : m.map(*s, {total - 7, 0}).events) count += e.count;
  CHECK(count == 6);
}

TEST_CASE("events: to_json writes a core/v1 Event with odd tenant names escaped", "[events]") {
  auto s = empty_state();
  const std::string odd = std::string("team/user:\"a\\b\"\n\x01\x7f") + "\xc3\xa9" + "\xff" + "\xe2\x82";
  add_refusal(*s, {.tenant = odd, .time = kT0 + 1'500'000'000ull});
  add_refusal(*s, {.tenant = "pod:ns/p/c", .tenant_id = 2, .time = kT0});
  const EventBatch b = EventMapper("node-1").map(*s, {});
  REQUIRE(b.events.size() == 2);
  const std::string text = to_json(b.events[0], "node-1");
  INFO(text);
  // strict: control characters and bad UTF-8 rejected. One U+FFFD per byte that is not UTF-8 (\xff,
  // and \xe2 \x82, a sequence cut short).
  const auto j = parse_json(text);
  CHECK(j.at("apiVersion").str() == "v1");
  CHECK(j.at("kind").str() == "Event");
  CHECK(j.at("metadata").at("generateName").str() == "vlake-");
  CHECK(j.at("metadata").at("namespace").str() == "default");
  CHECK(j.at("involvedObject").at("kind").str() == "Node");
  CHECK(j.at("involvedObject").at("name").str() == "node-1");
  CHECK_FALSE(j.at("involvedObject").has("namespace"));
  CHECK(j.at("reason").str() == "VlakeRefused");
  CHECK(j.at("type").str() == "Warning");
  CHECK(j.at("count").u64() == 1);
  CHECK(j.at("firstTimestamp").str() == "2026-01-01T00:00:01Z");
  CHECK(j.at("lastTimestamp").str() == "2026-01-01T00:00:01Z");
  CHECK(j.at("source").at("component").str() == "vlake");
  CHECK(j.at("source").at("host").str() == "node-1");
  CHECK(j.at("reportingComponent").str() == "vlake.io/vlaked");
  CHECK(j.at("reportingInstance").str() == "node-1");
  CHECK(j.at("message").str() ==
        "vlake refused 4GiB on GPU 0 for pid 1234 (tenant "
        "team/user:\"a\\b\"\n\x01\x7f\xc3\xa9\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"
        "): tenant_limit, used 3584MiB of 4GiB");
  const auto pod = parse_json(to_json(b.events[1], "node-1"));
  CHECK(pod.at("metadata").at("namespace").str() == "ns");
  CHECK(pod.at("involvedObject").at("kind").str() == "Pod");
  CHECK(pod.at("involvedObject").at("name").str() == "p");
  CHECK(pod.at("involvedObject").at("namespace").str() == "ns");
  CHECK(rfc3339(kT0) == "2026-01-01T00:00:00Z");
}

TEST_CASE("events: options", "[events]") {
  const char* argv[] = {"vlake-events", "--node", "n1",     "--interval=500ms", "--api-server", "http://127.0.0.1:9/",
                        "--ca-file",    "",       "--once", "--replay",         "--max-events", "5"};
  const EventsOptions o = EventsOptions::parse(12, argv);
  CHECK(o.node == "n1");
  CHECK(o.interval.count() == 500);
  CHECK(o.api_server == "http://127.0.0.1:9");
  CHECK(o.ca_file.empty());
  CHECK(o.token_file == "/var/run/secrets/kubernetes.io/serviceaccount/token");
  CHECK(o.once);
  CHECK(o.replay);
  CHECK(o.max_per_poll == 5);
  const char* bad[] = {"vlake-events", "--interval", "2x", "--api-server", "http://a"};
  CHECK_THROWS_AS(EventsOptions::parse(5, bad), OptionsError);
  const char* ftp[] = {"vlake-events", "--api-server", "ftp://a"};
  CHECK_THROWS_WITH(EventsOptions::parse(3, ftp), "--api-server must be an http:// or https:// URL, got 'ftp://a'");
  const char* help[] = {"vlake-events", "--help"};
  CHECK(EventsOptions::parse(2, help).help);
  CHECK(EventsOptions::usage().find("--replay") != std::string::npos);
}

// ---- the process

namespace {

// A loopback HTTP/1.1 server that records each request and answers `status` with "{}".
class FakeApiServer {
 public:
  struct Request {
    std::string method, path, authorization, body;
  };

  explicit FakeApiServer(int status) : status_(status) {
    fd_ = vlake::exptest::listen_loopback(16, port_);
    thread_ = std::thread([this] { serve(); });
  }
  ~FakeApiServer() {
    stop_ = true;
    ::shutdown(fd_, SHUT_RDWR);
    thread_.join();
    ::close(fd_);
  }
  [[nodiscard]] std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  std::vector<Request> requests() {
    std::lock_guard<std::mutex> g(mu_);
    return requests_;
  }

 private:
  void serve() {
    while (!stop_) {
      const int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) return;
      timeval tv{5, 0};
      ::setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
      // Keep-alive: several requests per connection until the client closes it.
      std::string buf;
      for (;;) {
        std::size_t end;
        while ((end = buf.find("\r\n\r\n")) == std::string::npos) {
          if (!read_more(c, buf)) break;
        }
        if (end == std::string::npos) break;
        Request r;
        const std::string head = buf.substr(0, end);
        std::istringstream lines(head);
        std::string line;
        std::getline(lines, line);
        std::istringstream first(line);
        first >> r.method >> r.path;
        auto fields = vlake::exptest::header_fields(lines);
        const std::size_t length = fields.count("content-length") != 0 ? std::stoul(fields["content-length"]) : 0;
        r.authorization = fields["authorization"];
        buf.erase(0, end + 4);
        while (buf.size() < length) {
          if (!read_more(c, buf)) break;
        }
        r.body = buf.substr(0, length);
        buf.erase(0, std::min(length, buf.size()));
        {
          std::lock_guard<std::mutex> g(mu_);
          requests_.push_back(r);
        }
        const std::string answer = "HTTP/1.1 " + std::to_string(status_) + (status_ < 300 ? " Created" : " Forbidden") +
                                   "\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}";
        if (::send(c, answer.data(), answer.size(), MSG_NOSIGNAL) < 0) break;
      }
      ::close(c);
    }
  }
  static bool read_more(int c, std::string& buf) {
    char tmp[4096];
    const ssize_t n = ::recv(c, tmp, sizeof tmp, 0);
    if (n <= 0) return false;
    buf.append(tmp, static_cast<std::size_t>(n));
    return true;
  }

  int status_;
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::mutex mu_;
  std::vector<Request> requests_;
};

// A state segment written by the test, removed at the end.
struct TestSegment {
  std::string name = "vlake-events-test-" + std::to_string(::getpid());
  st::StateSegment seg{name};
  ~TestSegment() { seg.remove(); }
};

struct Run {
  int exit_code = -1;
  std::string output;
};

Run run_events(const std::vector<std::string>& args) {
  vlake::testsupport::Spawn spec;
  spec.argv = {VLAKE_EVENTS_PATH};
  spec.argv.insert(spec.argv.end(), args.begin(), args.end());
  spec.env = vlake::testsupport::Env::inherited().unset("VLAKE_STATE").unset("KUBERNETES_SERVICE_HOST").strings();
  spec.err = vlake::testsupport::Stream::merged;
  const vlake::testsupport::Result r = vlake::testsupport::run(spec, 30000);
  return Run{!r.timed_out && WIFEXITED(r.status) ? WEXITSTATUS(r.status) : -1, r.out};
}

}  // namespace

TEST_CASE("events: vlake-events posts the rings to the API server", "[events][process]") {
  TestSegment t;
  {
    st::StateSegment::Write w(t.seg);
    st::State& s = t.seg.state();
    add_refusal(s, {.tenant = "pod:team-a/trainer-0/main"});
    add_refusal(s, {.tenant = "pod:team-a/trainer-0/main", .time = kT0 + 1'000'000'000ull});
    add_refusal(s, {.tenant = "research/user:\"alice\"", .tenant_id = 2, .reason = st::kRefusalNamespaceLimit});
    add_guard(s, proto::GuardKind::fault, "pod:team-b/infer/c");
  }
  const vlake::testsupport::TempDir tmp("vlake-events-");
  const std::string& dir = tmp.path();
  const std::string token = dir + "/token";
  std::ofstream(token) << "s3cret-token\n";

  SECTION("replay: every event posted with the bearer token") {
    FakeApiServer api(201);
    const Run r = run_events({"--once", "--replay", "--state", t.name, "--node", "gpu-node-1", "--api-server",
                              api.url(), "--token-file", token, "--ca-file", ""});
    INFO(r.output);
    CHECK(r.exit_code == 0);
    const auto reqs = api.requests();
    REQUIRE(reqs.size() == 3);
    for (const auto& q : reqs) {
      CHECK(q.method == "POST");
      CHECK(q.authorization == "Bearer s3cret-token");
    }
    CHECK(reqs[0].path == "/api/v1/namespaces/team-b/events");
    CHECK(parse_json(reqs[0].body).at("reason").str() == "VlakeKernelFault");
    CHECK(reqs[1].path == "/api/v1/namespaces/team-a/events");
    const auto pod = parse_json(reqs[1].body);
    CHECK(pod.at("involvedObject").at("kind").str() == "Pod");
    CHECK(pod.at("involvedObject").at("name").str() == "trainer-0");
    CHECK(pod.at("count").u64() == 2);
    CHECK(pod.at("firstTimestamp").str() == "2026-01-01T00:00:00Z");
    CHECK(pod.at("lastTimestamp").str() == "2026-01-01T00:00:01Z");
    CHECK(pod.at("reportingInstance").str() == "gpu-node-1");
    CHECK(reqs[2].path == "/api/v1/namespaces/default/events");
    const auto node = parse_json(reqs[2].body);
    CHECK(node.at("involvedObject").at("kind").str() == "Node");
    CHECK(node.at("involvedObject").at("name").str() == "gpu-node-1");
    CHECK(node.at("message").str().find("tenant research/user:\"alice\"): namespace_limit") != std::string::npos);
  }
  SECTION("without --replay only later records are posted: none here") {
    FakeApiServer api(201);
    const Run r = run_events({"--once", "--state", t.name, "--node", "n", "--api-server", api.url(), "--token-file",
                              token, "--ca-file", ""});
    INFO(r.output);
    CHECK(r.exit_code == 0);
    CHECK(api.requests().empty());
  }
  SECTION("an API error is logged with its status and body, and the exit status says so") {
    FakeApiServer api(403);
    const Run r = run_events({"--once", "--replay", "--state", t.name, "--node", "n", "--api-server", api.url(),
                              "--token-file", "", "--ca-file", ""});
    INFO(r.output);
    CHECK(r.exit_code == 1);
    CHECK(r.output.find("failed: HTTP 403: {}") != std::string::npos);
    const auto reqs = api.requests();
    REQUIRE(reqs.size() == 3);
    CHECK(reqs[0].authorization.empty());
  }
  SECTION("an unreachable API server fails fast") {
    const Run r = run_events({"--once", "--replay", "--state", t.name, "--node", "n", "--api-server",
                              "http://127.0.0.1:1", "--token-file", token, "--ca-file", ""});
    INFO(r.output);
    CHECK(r.exit_code == 1);
    CHECK(r.output.find("POST events to http://127.0.0.1:1 failed") != std::string::npos);
  }
}

namespace {

// Forks a child that drops to `uid` (gid = uid) and exits with body()'s result (1: it threw or
// could not drop). Returns its pid.
pid_t fork_as(std::uint32_t uid, const std::function<int()>& body) {
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    int code = 1;
    if (::setgroups(0, nullptr) == 0 && ::setgid(uid) == 0 && ::setuid(uid) == 0) {
      try {
        code = body();
      } catch (...) {
        code = 1;
      }
    }
    ::_exit(code);
  }
  return pid;
}

int wait_code(pid_t pid) {
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// A tenant that asks `n` times for more than its limit; 0 when every grant was refused for it.
int refused_grants(const std::string& socket, int n) {
  vlake::pooltest::PoolClient c(socket);
  const proto::HelloAck ack = c.hello();
  const Uuid dev = Uuid::from_bytes(ack.devices[0].uuid);
  for (int i = 0; i < n; ++i) {
    if (c.grant(dev, 1ull << 30).reply.status != proto::Status::over_limit) return 2;
  }
  return 0;
}

// 8 colluding uids, `n` refusals each, at once.
void flood(const std::string& socket, int n) {
  std::vector<pid_t> pids;
  for (std::uint32_t uid = 60001; uid <= 60008; ++uid) {
    pids.push_back(fork_as(uid, [&] { return refused_grants(socket, n); }));
  }
  for (pid_t p : pids) CHECK(wait_code(p) == 0);
}

}  // namespace

TEST_CASE("events: a tenant's refusal survives 8 tenants' thousands of refusals in the ring, vlakectl and the relay",
          "[events][process][rings]") {
  vlake::pooltest::DaemonProcess d("rflood", "version: 1\ndefault:\n  limit: 64MiB\n");
  REQUIRE(d.start());
  const EventCursor before = EventMapper::start(*vlake::pooltest::snapshot(d.state), false);
  flood(d.socket, 250);
  // The relay's cursor after the first wave; then the victim is refused once, and the flood
  // goes on: the victim's refusal is older than the flooders' newest.
  const EventCursor mid = EventMapper::start(*vlake::pooltest::snapshot(d.state), false);
  CHECK(wait_code(fork_as(60100, [&] { return refused_grants(d.socket, 1); })) == 0);
  flood(d.socket, 250);

  const auto s = vlake::pooltest::snapshot(d.state);
  REQUIRE(s->refusals.next_seq == 4002);
  CHECK(s->refusals.evicted == 4001 - st::kRefusalEvents);
  // In the ring, with what it said.
  int kept = 0;
  for (const st::RefusalRecord* r : st::ring_order(s->refusals)) {
    if (std::string(r->tenant_name) != "uid:60100") continue;
    ++kept;
    CHECK(r->reason == st::kRefusalTenantLimit);
    CHECK(r->bytes == 1ull << 30);
    CHECK(r->limit == 64ull << 20);
  }
  CHECK(kept == 1);
  // (The tenants' records, with their eviction counts, were freed when their processes exited.)

  // The relay's reading: from before the flood and from the middle of it.
  for (const EventCursor& from : {before, mid}) {
    const EventBatch b = EventMapper("n").map(*s, from);
    CHECK(b.cursor.refusal_seq == 4001);
    std::uint64_t unread = 0;  // kept after the cursor
    for (const st::RefusalRecord* x : st::ring_order(s->refusals)) unread += x->seq > from.refusal_seq ? 1 : 0;
    CHECK(b.overwritten == 4001 - from.refusal_seq - unread);
    int victims = 0;
    for (const KubeEvent& e : b.events) {
      if (e.message.find("tenant uid:60100)") != std::string::npos) ++victims;
    }
    CHECK(victims == 1);
  }

  // vlakectl events lists it.
  const vlake::ctltest::CtlResult ctl = vlake::ctltest::run_ctl({"--state", d.state, "events", "--json"});
  INFO(ctl.err);
  REQUIRE(ctl.exit_code == 0);
  int listed = 0;
  const auto listing = parse_json(ctl.out);
  for (const auto& r : listing.at("refusals").items) {
    if (r.at("tenant").str() == "uid:60100") ++listed;
  }
  CHECK(listed == 1);

  // vlake-events posts it.
  FakeApiServer api(201);
  const Run r = run_events({"--once", "--replay", "--state", d.state, "--node", "n", "--api-server", api.url(),
                            "--token-file", "", "--ca-file", ""});
  INFO(r.output);
  CHECK(r.exit_code == 0);
  int posted = 0;
  for (const auto& q : api.requests()) {
    if (parse_json(q.body).at("message").str().find("tenant uid:60100)") != std::string::npos) ++posted;
  }
  CHECK(posted == 1);
  // The daemon's log stays small: the flooders' refusal lines are rate-limited per tenant, and
  // the victim's is written.
  CHECK_THAT(d.log(), Catch::Contains("tenant uid:60100: 1073741824 bytes on GPU 0 refused"));
  CHECK(d.log().size() < 256 * 1024);
}
