// vlakectl unit tests: options, sizes, the JSON writer, rows from a synthetic State, the text
// renderers, state access errors and quota check (in-process).
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <sstream>

#include "harness.hpp"
#include "json_parse.hpp"
#include "units.hpp"
#include "vlake/common/fixed_chars.hpp"
#include "vlake/contracts/state.hpp"
#include "vlake/ctl/app.hpp"
#include "vlake/ctl/format.hpp"
#include "vlake/ctl/json.hpp"
#include "vlake/ctl/options.hpp"
#include "vlake/ctl/quota_check.hpp"
#include "vlake/ctl/render.hpp"
#include "vlake/ctl/state_source.hpp"
#include "vlake/ctl/view.hpp"

using namespace vlake;
using namespace vlake::ctl;
using vlake::ctltest::Json;
using vlake::ctltest::parse_json;
using vlake::pooltest::session_record;
namespace st = vlake::state;

namespace {

CtlOptions parse(std::vector<std::string> args, const char* env = nullptr) { return CtlOptions::parse(args, env); }

std::string parse_error(std::vector<std::string> args, const char* env = nullptr) {
  try {
    CtlOptions::parse(args, env);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "(no error)";
}

using namespace vlake::testunits;  // kMiB, kGiB, MiB (units.hpp)

std::string unique(const std::string& tag) { return "ctlu" + std::to_string(::getpid()) + "-" + tag; }

// A node: 2 GPUs; tenant 1 "user:alice" uses GPU 0 (grants + non-pool) with 2 sessions;
// tenant 2 "group:ml" uses GPU 1 only; tenant 3 (a name without NUL) has no usage and no
// session; tenant 4 "uid:9" has a session but no memory.
std::unique_ptr<st::State> synthetic_state() {
  auto s = std::make_unique<st::State>();
  std::memset(static_cast<void*>(s.get()), 0, sizeof(st::State));
  s->header.magic = st::kMagic;
  s->header.layout_version = st::kLayoutVersion;
  s->header.daemon_pid = 4242;
  s->header.starts = 3;
  s->header.clean = 0;
  s->header.device_count = 2;
  for (std::uint32_t d = 0; d < 2; ++d) {
    auto& r = s->devices[d];
    r.in_use = 1;
    r.ordinal = d;
    for (std::uint8_t k = 0; k < 16; ++k) r.uuid[k] = static_cast<std::uint8_t>(0x10 * d + k);
    r.total = 80 * kGiB;
    r.granularity = 2 * kMiB;
  }
  s->devices[0].pool_bytes = 40 * kMiB;
  s->devices[0].granted_bytes = 30 * kMiB;
  s->devices[0].free_bytes = 10 * kMiB;
  s->devices[0].free_handles = 2;
  s->devices[0].largest_servable_bytes = 8 * kMiB;
  s->devices[0].largest_servable_unbound_bytes = 4 * kMiB;
  s->devices[0].orphaned_bytes = 4 * kMiB;
  s->devices[0].counted_bytes = 6 * kMiB;
  s->devices[0].nonpool_bytes = 512 * kMiB;
  s->devices[1].granted_bytes = 8 * kGiB;

  auto& a = s->tenants[0];
  a.in_use = 1;
  a.id = 1;
  std::strcpy(a.name, "user:alice");
  a.limit[0] = a.limit[1] = 16 * kGiB;
  a.granted[0] = 36 * kMiB;
  a.nonpool[0] = 512 * kMiB;
  auto& b = s->tenants[1];
  b.in_use = 1;
  b.id = 2;
  std::strcpy(b.name, "group:ml");
  b.limit[0] = b.limit[1] = 40 * kGiB;
  // group:ml is a tenant of namespace "research", which has a guarantee on GPU 1; alice's
  // limit was lowered below her usage on GPU 0 by a reload.
  auto& ns = s->namespaces[3];
  ns.in_use = 1;
  ns.id = 4;
  std::strcpy(ns.name, "research");
  ns.guaranteed[1] = 16 * kGiB;
  b.namespace_id = 4;
  a.over_limit = 1u << 0;
  a.over_reason[0] = st::kOverLowered;
  s->devices[1].guaranteed_bytes = 16 * kGiB;
  s->counters.config_reloads = 3;
  b.granted[1] = 8 * kGiB;
  auto& c = s->tenants[5];  // table slots need not be dense
  c.in_use = 1;
  c.id = 3;
  std::memset(c.name, 'x', sizeof c.name);  // no NUL: the name is cut at the field's size
  c.limit[0] = c.limit[1] = kGiB;

  auto& e = s->tenants[6];
  e.in_use = 1;
  e.id = 4;
  std::strcpy(e.name, "uid:9");
  e.limit[0] = e.limit[1] = kGiB;

  s->sessions[9] = session_record(14, 103, 7001, 9, 4, st::kSessionConnected, 0);
  s->sessions[0] = session_record(11, 100, 5001, 1000, 1, st::kSessionConnected, 2);
  s->sessions[3] = session_record(12, 101, 5002, 1000, 1, st::kSessionDetached, 1);
  s->sessions[4] = session_record(13, 102, 6001, 2000, 2, st::kSessionConnected, 1);
  s->grants[0] = {1, 11, 30 * kMiB, 1, 0, 0, 1, st::kGrantLive, 0, 0, 0, st::kGrantOnGpu, 0};
  s->grants[1] = {2, 11, 6 * kMiB, 1, 0, 2, 0, st::kGrantLive, 0, 0, 0, st::kGrantOnGpu, 0};
  s->grants[7] = {3, 12, 4 * kMiB, 1, 0, 0, 1, st::kGrantOrphaned, 0, 0, 0, st::kGrantOnGpu, 0};
  s->grants[8] = {4, 13, 8 * kGiB, 2, 1, 0, 1, st::kGrantLive, 0, 0, 0, st::kGrantOnGpu, 0};
  s->counters.grants = 17;
  s->counters.denials_over_limit = 2;
  s->counters.scrubs = 5;
  return s;
}

}  // namespace

TEST_CASE("options: commands and global options", "[units]") {
  auto o = parse({"top"});
  CHECK(o.command == Command::top);
  CHECK(o.state == "vlake-state");
  CHECK_FALSE(o.json);
  CHECK_FALSE(o.watch_seconds.has_value());

  o = parse({"--json", "--state", "s1", "tenants"});
  CHECK(o.command == Command::tenants);
  CHECK(o.json);
  CHECK(o.state == "s1");

  o = parse({"pool", "--state=s2", "--json"});  // global options after the command
  CHECK(o.command == Command::pool);
  CHECK(o.state == "s2");
  CHECK(o.json);

  CHECK(parse({"pool"}, "from-env").state == "from-env");
  CHECK(parse({"pool", "--state", "explicit"}, "from-env").state == "explicit");
  CHECK(parse({"pool"}, "").state == "vlake-state");  // empty env counts as unset

  o = parse({"top", "--watch"});
  REQUIRE(o.watch_seconds.has_value());
  CHECK(*o.watch_seconds == 2.0);
  CHECK(*parse({"top", "--watch", "1s"}).watch_seconds == 1.0);
  CHECK(*parse({"top", "--watch=0.5s"}).watch_seconds == 0.5);
  CHECK(*parse({"top", "--watch=250ms"}).watch_seconds == 0.25);
  o = parse({"top", "--watch", "--json"});  // the next word is not a number: default interval
  CHECK(*o.watch_seconds == 2.0);
  CHECK(o.json);

  o = parse({"quota", "check", "/etc/vlake/vlake.yaml"});
  CHECK(o.command == Command::quota_check);
  CHECK(o.quota_file == "/etc/vlake/vlake.yaml");

  CHECK(parse({"--help"}).help);
  CHECK(parse({"bogus", "--help"}).help);  // --help wins over anything else
}

TEST_CASE("options: bad command lines say what is wrong", "[units]") {
  CHECK(parse_error({}) == "no command given (top, tenants, processes, waits, pool, events or quota check FILE)");
  CHECK(parse_error({"frob"}) ==
        "unknown command 'frob' (top, tenants, processes, waits, pool, events or quota check FILE)");
  CHECK(parse_error({"top", "--frob"}) == "unknown option '--frob'");
  CHECK(parse_error({"top", "-x"}) == "unknown option '-x'");
  CHECK(parse_error({"top", "--state"}) == "--state needs a value (a segment name or path)");
  CHECK(parse_error({"top", "--state="}) == "--state needs a non-empty name");
  CHECK(parse_error({"top", "--state", "a/b"}).find("neither a name") != std::string::npos);
  CHECK(parse_error({"top", "--state", "/run/x/"}).find("names a directory") != std::string::npos);
  CHECK(parse_error({"top"}, "a/b").find("neither a name") != std::string::npos);
  CHECK(parse_error({"quota"}) == "quota: missing subcommand (quota check FILE, quota grammar)");
  CHECK(parse_error({"quota", "lint", "f"}) == "quota: unknown subcommand 'lint' (quota check FILE, quota grammar)");
  CHECK(parse_error({"quota", "grammar", "x"}) == "unexpected argument 'x' after 'quota'");
  CHECK(parse_error({"quota", "check"}) == "quota check: missing FILE");
  CHECK(parse_error({"quota", "check", "a", "b"}) == "unexpected argument 'b' after 'quota'");
  CHECK(parse_error({"tenants", "extra"}) == "unexpected argument 'extra' after 'tenants'");
  CHECK(parse_error({"pool", "--watch"}) == "--watch only applies to 'top', 'processes' and 'waits'");
  CHECK(parse_error({"top", "--watch", "0"}) == "--watch: \"0\": must be at least 100ms");
  CHECK(parse_error({"top", "--watch=25h"}) == "--watch: \"25h\": must be at most 24h");
  CHECK(parse_error({"top", "--watch=abc"}) == "--watch: \"abc\": expected a number, such as 500ms, 30s or 2m");
  CHECK(parse_error({"top", "--watch", "2"}) == "--watch: \"2\": a duration needs a unit; write 2s or 2ms");
  CHECK(parse_error({"quota", "check", "f", "--gpu-memory", "80"}) ==
        "--gpu-memory: \"80\": a size needs a unit; write 80B, 80KiB, 80MiB or 80GiB");
}

TEST_CASE("format: human sizes, percentages, uuids, tables", "[units]") {
  CHECK(human_size(Bytes{0}) == "0 B");
  CHECK(human_size(Bytes{1023}) == "1023 B");
  CHECK(human_size(Bytes{1024}) == "1.0 KiB");
  CHECK(human_size(Bytes{1536}) == "1.5 KiB");
  CHECK(human_size(Bytes{3 * kMiB}) == "3.0 MiB");
  CHECK(human_size(Bytes{kMiB + 52428}) == "1.0 MiB");     // 1.04999..
  CHECK(human_size(Bytes{kMiB + 52429}) == "1.1 MiB");     // 1.05000.. rounds half up
  CHECK(human_size(Bytes{kGiB + kGiB / 4}) == "1.3 GiB");  // 1.25 -> 1.3
  CHECK(human_size(Bytes{kGiB - 1}) == "1.0 GiB");         // 1023.99.. MiB is not "1024.0 MiB"
  CHECK(human_size(Bytes{80 * kGiB}) == "80.0 GiB");
  CHECK(human_size(Bytes{1536 * kGiB}) == "1.5 TiB");
  CHECK(human_size(Bytes{std::numeric_limits<std::uint64_t>::max()}) == "16.0 EiB");

  CHECK(percent(12.345) == "12.3%");
  CHECK(percent(0) == "0.0%");
  CHECK(percent(100) == "100.0%");
  CHECK(percent(std::nan("")) == "-");
  CHECK(share_percent(Bytes{kGiB}, Bytes{4 * kGiB}) == 25.0);
  CHECK(share_percent(Bytes{1}, Bytes{0}) == 0.0);

  const std::uint8_t u[16] = {0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77,
                              0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff};
  CHECK(uuid_short(Uuid::from_bytes(u)) == "GPU-00112233");

  Table t({{"NAME"}, {"SIZE", Table::Align::right}});
  t.add_row({"a", "1.0 MiB"});
  t.add_row({"longer", "2 B"});
  CHECK(t.render("  ") ==
        "  NAME       SIZE\n"
        "  a       1.0 MiB\n"
        "  longer      2 B\n");
  CHECK_THROWS_AS(t.add_row({"only one"}), std::invalid_argument);
}

TEST_CASE("json: escaping", "[units]") {
  CHECK(json_quote("plain") == "\"plain\"");
  CHECK(json_quote("a\"b\\c/d") == "\"a\\\"b\\\\c/d\"");
  CHECK(json_quote("\n\r\t\b\f") == "\"\\n\\r\\t\\b\\f\"");
  CHECK(json_quote(std::string("\x01\x1f", 2)) == "\"\\u0001\\u001f\"");
  CHECK(json_quote(std::string("nul\0x", 5)) == "\"nul\\u0000x\"");
  CHECK(json_quote("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80") == "\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\"");
  CHECK(json_quote("bad\xff") == "\"bad\\ufffd\"");
  CHECK(json_quote("cut\xc3") == "\"cut\\ufffd\"");                  // a name truncated mid-character
  CHECK(json_quote("\xc0\xaf") == "\"\\ufffd\\ufffd\"");             // overlong '/'
  CHECK(json_quote("\xed\xa0\x80") == "\"\\ufffd\\ufffd\\ufffd\"");  // a UTF-16 surrogate

  // Every byte value round-trips through the parser as valid JSON.
  std::string all;
  for (int c = 1; c < 128; ++c) all += static_cast<char>(c);
  const Json back = parse_json(json_quote(all));
  CHECK(back.str() == all);
}

TEST_CASE("json: writer structure and round trip", "[units]") {
  for (const bool pretty : {true, false}) {
    JsonWriter j(pretty);
    j.begin_object();
    j.field("name", "t\"1\n");
    j.field_uint("big", std::numeric_limits<std::uint64_t>::max());
    j.key("neg").sint(-5);
    j.key("pct").number(12.3456, 2);
    j.key("inf").number(std::numeric_limits<double>::infinity());
    j.field_bool("yes", true);
    j.key("nothing").null();
    j.key("empty_array").begin_array().end_array();
    j.key("empty_object").begin_object().end_object();
    j.key("list").begin_array().uint(1).string("two").begin_object().field_uint("three", 3).end_object().end_array();
    j.end_object();
    const std::string text = j.str();
    INFO(text);
    const Json v = parse_json(text);
    CHECK(v.at("name").str() == "t\"1\n");
    CHECK(v.at("big").u64() == std::numeric_limits<std::uint64_t>::max());
    CHECK(v.at("neg").num() == -5);
    CHECK(v.at("pct").text == "12.35");
    CHECK(v.at("inf").is_null());
    CHECK(v.at("yes").boolean());
    CHECK(v.at("nothing").is_null());
    CHECK(v.at("empty_array").size() == 0);
    CHECK(v.at("empty_object").size() == 0);
    CHECK(v.at("list").size() == 3);
    CHECK(v.at("list").at(2).at("three").u64() == 3);
    CHECK(v.order.front() == "name");  // keys in the order written
    CHECK((text.find('\n') != std::string::npos) == pretty);
  }
  CHECK(JsonWriter(false).uint(7).str() == "7");
}

TEST_CASE("json: writer misuse throws", "[units]") {
  JsonWriter a;
  a.begin_object();
  CHECK_THROWS_AS(a.uint(1), std::logic_error);  // value without a key
  CHECK_THROWS_AS(a.end_array(), std::logic_error);
  CHECK_THROWS_AS(a.str(), std::logic_error);  // unfinished
  a.key("k");
  CHECK_THROWS_AS(a.key("k2"), std::logic_error);
  CHECK_THROWS_AS(a.end_object(), std::logic_error);  // key without value
  JsonWriter b;
  CHECK_THROWS_AS(b.key("k"), std::logic_error);
  b.begin_array().end_array();
  CHECK_THROWS_AS(b.begin_array(), std::logic_error);  // a second document
}

TEST_CASE("json: the test parser rejects invalid documents", "[units]") {
  for (const char* bad : {"", "{", "{\"a\":1,}", "[1,]", "{\"a\" 1}", "01", "1.", "\"\\x\"", "\"a\nb\"",
                          "{\"a\":1,\"a\":2}", "[1] 2", "nul", "\"\xff\"", "\"\\ud800\""}) {
    INFO(bad);
    CHECK_THROWS(parse_json(bad));
  }
  CHECK(parse_json(" {\"a\": [true, false, null, -1.5e3, \"\\u00e9\"]} ").at("a").at(4).str() == "\xc3\xa9");
}

TEST_CASE("view: rows from a synthetic state", "[units]") {
  const auto s = synthetic_state();
  const NodeView v = build_view(*s, true);
  CHECK(v.daemon.pid == 4242);
  CHECK(v.daemon.starts == 3);
  CHECK(v.daemon.alive);
  CHECK(v.sessions == 4);
  CHECK(v.grants == 4);
  REQUIRE(v.gpus.size() == 2);
  CHECK(v.gpus[0].uuid == "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f");
  CHECK(v.gpus[1].uuid_short == "GPU-10111213");
  CHECK(v.gpus[0].free == 10 * kMiB);
  CHECK(v.gpus[0].orphaned == 4 * kMiB);

  REQUIRE(v.tenants.size() == 4);
  const TenantView& alice = v.tenants[0];
  CHECK(alice.id == 1);
  CHECK(alice.name == "user:alice");
  CHECK(alice.grant_count == 3);  // live + orphaned
  CHECK(alice.pids == std::vector<std::uint32_t>{5001, 5002});
  REQUIRE(alice.sessions.size() == 2);
  CHECK(alice.sessions[0].state == "connected");
  CHECK(alice.sessions[1].state == "detached");
  CHECK(alice.sessions[0].grants == 2);
  REQUIRE(alice.gpus.size() == 2);
  CHECK(alice.gpus[0].used == 548 * kMiB);
  CHECK(alice.gpus[0].granted == 36 * kMiB);
  CHECK(alice.gpus[0].nonpool == 512 * kMiB);
  CHECK(alice.gpus[0].limit == 16 * kGiB);
  CHECK_FALSE(alice.gpus[0].guaranteed.has_value());
  CHECK(alice.gpus[0].over_limit);
  CHECK_FALSE(alice.gpus[1].over_limit);
  CHECK(alice.namespace_name == "default");
  CHECK(v.tenants[1].namespace_name == "research");
  REQUIRE(v.tenants[1].gpus[1].guaranteed.has_value());
  CHECK(*v.tenants[1].gpus[1].guaranteed == 16 * kGiB);
  CHECK(v.gpus[1].guaranteed == 16 * kGiB);
  CHECK(alice.gpus[0].share_percent == Approx(548.0 * 100 / (80 * 1024)));
  CHECK(v.tenants[2].name == std::string(st::kTenantNameBytes, 'x'));
  CHECK(v.tenants[2].grant_count == 0);

  // top: per GPU, the tenants holding memory there; connected tenants without memory apart.
  const auto rows = top_rows(v);
  REQUIRE(rows.size() == 2);
  CHECK((rows[0].gpu == 0 && rows[0].tenant == "user:alice" && rows[0].usage.used == 548 * kMiB));
  CHECK((rows[1].gpu == 1 && rows[1].tenant == "group:ml" && rows[1].usage.used == 8 * kGiB));
  CHECK(rows[1].usage.share_percent == 10.0);
  CHECK(rows[0].pids == std::vector<std::uint32_t>{5001, 5002});
  const auto idle = idle_tenants(v);
  REQUIRE(idle.size() == 1);
  CHECK(idle[0].name == "uid:9");
  CHECK(idle[0].pids == std::vector<std::uint32_t>{7001});

  const auto counter = [&](const std::string& name) {
    for (const auto& [n, value] : v.counters) {
      if (n == name) return value;
    }
    FAIL("no counter " << name);
    return std::uint64_t{0};
  };
  CHECK(counter("grants") == 17);
  CHECK(counter("denials_over_limit") == 2);
  CHECK(counter("scrubs") == 5);
  CHECK(counter("nvml_samples") == 0);
  CHECK(counter("config_reloads") == 3);
}

TEST_CASE("render: top says why a tenant is above its limit", "[units]") {
  const auto s = synthetic_state();
  NodeView v = build_view(*s, false);
  TenantView* alice = nullptr;
  for (TenantView& t : v.tenants) {
    if (t.name == "user:alice") alice = &t;
  }
  REQUIRE(alice != nullptr);
  REQUIRE_FALSE(alice->gpus.empty());
  TenantGpuView& u = alice->gpus.front();
  REQUIRE(u.over_limit);
  // The mark and its footnote follow the reason the daemon published, one footnote per mark.
  u.over_reason = "contexts";
  std::string top = render_top_text(v, "st1", "");
  CHECK(top.find("548.0 MiB+") != std::string::npos);
  CHECK(top.find("\n+ above its limit through its processes' CUDA contexts") != std::string::npos);
  CHECK(top.find("lowered by a reload") == std::string::npos);
  u.over_reason = "outside_vlake";
  top = render_top_text(v, "st1", "");
  CHECK(top.find("548.0 MiB!") != std::string::npos);
  CHECK(top.find("\n! above its limit through memory of its processes without vlake") != std::string::npos);
  u.over_reason = "limit_lowered";
  top = render_top_text(v, "st1", "");
  CHECK(top.find("548.0 MiB*") != std::string::npos);
  CHECK(top.find("\n* above its limit, lowered by a reload") != std::string::npos);
  CHECK(top.find("CUDA contexts") == std::string::npos);
}

TEST_CASE("render: top says when the quota file on disk is rejected", "[units]") {
  auto s = synthetic_state();
  CHECK(render_top_text(build_view(*s, false), "st1", "").find("REJECTED") == std::string::npos);
  vlake::copy_chars(s->config.path, "/etc/vlake/vlake.yaml");
  vlake::copy_chars(s->config.last_error, "/etc/vlake/vlake.yaml:3:10: bad limit \"8GB\": decimal units");
  s->config.rejected = 1;
  s->config.generation = 4;
  const NodeView v = build_view(*s, false);
  const std::string top = render_top_text(v, "st1", "");
  INFO(top);
  // Right under the heading, before any limit is read.
  CHECK(top.find("\nQUOTA FILE REJECTED: /etc/vlake/vlake.yaml:3:10: bad limit \"8GB\": decimal units\n"
                 "  the limits shown are the previous configuration's (generation 4); check the file with: "
                 "vlakectl quota check /etc/vlake/vlake.yaml\n") != std::string::npos);
  CHECK(top.find("REJECTED") < top.find("GPU 0"));
  const Json tj = parse_json(render_top_json(v, "st1"));
  CHECK(tj.at("config").at("rejected").boolean());
  CHECK(tj.at("config").at("generation").u64() == 4);
  CHECK(tj.at("config").at("path").str() == "/etc/vlake/vlake.yaml");
}

TEST_CASE("render: text and JSON of a synthetic state", "[units]") {
  const auto s = synthetic_state();
  const NodeView v = build_view(*s, false);

  const std::string top = render_top_text(v, "st1", "");
  INFO(top);
  CHECK(top.rfind("vlaked pid 4242 (not running), state st1, 4 sessions, 4 grants\n", 0) == 0);
  CHECK(top.find(
            "GPU 0  GPU-00010203  total 80.0 GiB  pool: granted 30.0 MiB / free 10.0 MiB  non-pool 512.0 MiB"
            "  guaranteed 0 B (borrowed 0 B)\n"
            "  NAMESPACE  TENANT            USED  RETAINED  OUTSIDE     LIMIT  GUARANTEED  SHARE  IDLE  PROCS  PIDS\n"
            "  default    user:alice  548.0 MiB*       0 B      0 B  16.0 GiB           -   0.7%     -      2  "
            "5001,5002\n\nGPU 1") != std::string::npos);
  CHECK(
      top.find("\n  NAMESPACE  TENANT       USED  RETAINED  OUTSIDE     LIMIT  GUARANTEED  SHARE  IDLE  PROCS  PIDS\n"
               "  research   group:ml  8.0 GiB       0 B      0 B  40.0 GiB    16.0 GiB  10.0%     -      1  6001\n") !=
      std::string::npos);
  CHECK(top.find("\n* above its limit, lowered by a reload") != std::string::npos);  // the daemon's over_reason
  CHECK(top.find("\nconnected, no memory: uid:9 (7001)\n") != std::string::npos);
  CHECK(top.find("xxxx") == std::string::npos);  // the idle tenant is not in top

  const Json tj = parse_json(render_top_json(v, "st1"));
  CHECK(tj.at("state").str() == "st1");
  CHECK_FALSE(tj.at("daemon").at("running").boolean());
  REQUIRE(tj.at("gpus").size() == 2);
  const Json& g0 = tj.at("gpus").at(0);
  CHECK(g0.at("total").u64() == 80 * kGiB);
  REQUIRE(g0.at("tenants").size() == 1);
  const Json& al = g0.at("tenants").at(0);
  CHECK(al.at("name").str() == "user:alice");
  CHECK(al.at("used").u64() == 548 * kMiB);
  CHECK(al.at("limit").u64() == 16 * kGiB);
  CHECK(al.at("guaranteed").is_null());
  CHECK(al.at("namespace").str() == "default");
  CHECK(al.at("over_limit").boolean());
  CHECK(tj.at("gpus").at(1).at("tenants").at(0).at("guaranteed").u64() == 16 * kGiB);
  CHECK(tj.at("gpus").at(1).at("guaranteed").u64() == 16 * kGiB);
  CHECK(al.at("sessions").u64() == 2);
  CHECK(al.at("pids").at(1).u64() == 5002);
  CHECK(al.at("share_percent").num() == Approx(0.67).margin(0.005));

  REQUIRE(tj.at("idle_tenants").size() == 1);
  CHECK(tj.at("idle_tenants").at(0).at("name").str() == "uid:9");
  CHECK(tj.at("idle_tenants").at(0).at("pids").at(0).u64() == 7001);

  const Json tn = parse_json(render_tenants_json(v, "st1"));
  REQUIRE(tn.at("tenants").size() == 4);
  const Json& t2 = tn.at("tenants").at(2);
  CHECK(t2.at("name").str() == std::string(st::kTenantNameBytes, 'x'));
  CHECK(t2.at("sessions").size() == 0);
  CHECK(tn.at("tenants").at(0).at("sessions").at(1).at("state").str() == "detached");
  CHECK(tn.at("tenants").at(1).at("gpus").at(1).at("granted").u64() == 8 * kGiB);

  const std::string tt = render_tenants_text(v, "st1");
  INFO(tt);
  CHECK(tt.find("\n 1  user:alice ") != std::string::npos);
  CHECK(tt.find(" 0  548.0 MiB*  36.0 MiB       0 B       0 B       0 B  512.0 MiB      0 B  16.0 GiB       3        0"
                "     -  2 (5001,5002)\n") != std::string::npos);
  CHECK(tt.find(" 1     8.0 GiB   8.0 GiB       0 B       0 B       0 B        0 B      0 B  40.0 GiB\n") !=
        std::string::npos);
  CHECK(tt.find("\n* above its limit, lowered by a reload") != std::string::npos);

  const Json pj = parse_json(render_pool_json(v, "st1"));
  CHECK(pj.at("daemon").at("starts").u64() == 3);
  CHECK(pj.at("sessions").u64() == 4);
  CHECK(pj.at("gpus").at(0).at("free_handles").u64() == 2);
  CHECK(pj.at("gpus").at(0).at("largest_servable").u64() == 8 * kMiB);
  CHECK(pj.at("gpus").at(0).at("largest_servable_new_tenant").u64() == 4 * kMiB);
  CHECK(pj.at("gpus").at(0).at("counted").u64() == 6 * kMiB);
  CHECK(pj.at("counters").at("grants").u64() == 17);
  CHECK(pj.at("counters").at("denials_over_limit").u64() == 2);
  CHECK(pj.at("counters").order.front() == "grants");

  const std::string pt = render_pool_text(v, "st1");
  INFO(pt);
  CHECK(pt.find("GPU-00010203-0405-0607-0809-0a0b0c0d0e0f  80.0 GiB  40.0 MiB") != std::string::npos);
  CHECK(pt.find("FREE HANDLES  SERVABLE  ORPHANED") != std::string::npos);
  CHECK(pt.find("  2   8.0 MiB   4.0 MiB") != std::string::npos);  // free handles, servable, orphaned
  CHECK(pt.find("\n  denials_over_limit           2\n") != std::string::npos);
  CHECK(pj.at("counters").at("config_reloads").u64() == 3);
}

TEST_CASE("state source: missing, foreign and mismatched segments", "[units]") {
  const std::string missing = unique("missing");
  try {
    StateSource s(missing);
    FAIL("opened a missing segment");
  } catch (const StateAccessError& e) {
    CHECK(e.kind() == StateAccessError::Kind::missing);
    CHECK(std::string(e.what()) == "cannot read vlaked state '" + missing + "' (" + st::segment_path(missing) +
                                       "): no such segment — is vlaked running? (--state " + missing + ")");
  }

  const std::string name = unique("layout");
  const std::string path = st::segment_path(name);
  st::prepare_state_dir(st::state_dir());
  const auto write_segment = [&](const st::Header& h, std::size_t size) {
    std::string bytes(size, '\0');
    std::memcpy(bytes.data(), &h, std::min(size, sizeof h));
    std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<std::streamsize>(size));
  };
  st::Header h{};
  h.magic = st::kMagic;
  h.layout_version = st::kLayoutVersion + 1;
  h.header_bytes = sizeof(st::Header);
  h.total_bytes = 4096;
  write_segment(h, 4096);
  try {
    StateSource s(name);
    FAIL("opened a segment of another layout");
  } catch (const StateAccessError& e) {
    CHECK(e.kind() == StateAccessError::Kind::layout);
    CHECK_THAT(e.what(), Catch::Contains("has layout version " + std::to_string(st::kLayoutVersion + 1) +
                                         " (4096 bytes); this vlakectl reads layout version " +
                                         std::to_string(st::kLayoutVersion) + " (" + std::to_string(sizeof(st::State)) +
                                         " bytes) — use the vlakectl built with the running vlaked"));
  }
  h.magic = 42;
  write_segment(h, 4096);
  CHECK_THROWS_WITH(StateSource(name), Catch::Contains("not a vlake state segment (bad magic"));
  write_segment(h, 10);
  CHECK_THROWS_WITH(StateSource(name), Catch::Contains("only 10 bytes"));

  // A good header and size: readable, and the snapshot is what was written.
  const auto s = synthetic_state();
  s->header.header_bytes = sizeof(st::Header);
  s->header.total_bytes = sizeof(st::State);
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(s.get()), sizeof(st::State));
  }
  {
    StateSource src(name);
    const auto snap = src.snapshot();
    CHECK(snap->header.daemon_pid == 4242);
    CHECK(snap->tenants[0].granted[0] == 36 * kMiB);
  }
  ::unlink(path.c_str());
}

TEST_CASE("process_alive: pid and start time", "[units]") {
  CHECK(process_alive(static_cast<std::uint32_t>(::getpid()), 0));
  CHECK_FALSE(process_alive(0, 0));
  CHECK_FALSE(process_alive(static_cast<std::uint32_t>(::getpid()), 1));  // another start time
}

TEST_CASE("quota check: good and bad files in process", "[units]") {
  char tmpl[] = "/tmp/vlake-ctltest-XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  const std::string dir = tmpl;
  const std::string good = dir + "/good.yaml";
  std::ofstream(good) << "version: 1\ndefault:\n  limit: 8GiB\nusers:\n  - uid: 1000\n    limit: 4GiB\n"
                         "  - uid: 1001\n    limit: 50%\ngroups:\n  - gid: 2000\n    limit: 16GiB\n";
  const QuotaCheckResult r = check_quota_file(good);
  CHECK(r.ok);
  CHECK(r.errors.empty());
  CHECK(r.version == "1");
  CHECK(r.default_limit == "8GiB");
  REQUIRE(r.sections.size() == 2);
  CHECK(r.sections[0] == std::make_pair(std::string("users"), std::uint64_t{2}));
  CHECK(r.sections[1] == std::make_pair(std::string("groups"), std::uint64_t{1}));
  CHECK(render_quota_text(r) == good +
                                    ": ok\n  version: 1\n  default limit: 8GiB per GPU (each unlisted uid is its "
                                    "own tenant)\n  users: 2 entries\n  groups: 1 entry\n");
  const Json j = parse_json(render_quota_json(r));
  CHECK(j.at("ok").boolean());
  CHECK(j.at("summary").at("sections").at("users").u64() == 2);

  const std::string bad = dir + "/bad.yaml";
  std::ofstream(bad) << "version: 1\ndefault:\n  limit: 8GB\n";
  const QuotaCheckResult e = check_quota_file(bad);
  CHECK_FALSE(e.ok);
  REQUIRE(e.errors.size() == 1);
  CHECK(e.errors[0].line == 3);
  CHECK(e.errors[0].column == 10);
  CHECK_THAT(e.errors[0].message, Catch::Contains("8GB"));
  CHECK(e.errors[0].message.rfind(bad, 0) != 0);  // the prefix is split off
  CHECK(render_quota_text(e) == bad + ":3:10: " + e.errors[0].message + "\n");
  const Json ej = parse_json(render_quota_json(e));
  CHECK_FALSE(ej.at("ok").boolean());
  CHECK(ej.at("errors").at(0).at("line").u64() == 3);
  CHECK(ej.at("summary").is_null());

  const QuotaCheckResult m = check_quota_file(dir + "/absent.yaml");
  CHECK_FALSE(m.ok);
  REQUIRE(m.errors.size() == 1);
  CHECK(m.errors[0].text() == dir + "/absent.yaml:0:0: cannot read the file");

  ::unlink(good.c_str());
  ::unlink(bad.c_str());
  ::rmdir(dir.c_str());
}

TEST_CASE("quota check -: the file comes from standard input", "[units]") {
  std::istringstream good("version: 1\ndefault: {limit: 4GiB}\nusers: [{uid: 7, limit: 1GiB}]\n");
  std::ostringstream out;
  std::ostringstream err;
  App app(out, err, false, good);
  CHECK(app.run(CtlOptions::parse(std::vector<std::string>{"quota", "check", "-"}, nullptr)) == 0);
  CHECK(out.str().rfind("<stdin>: ok\n", 0) == 0);
  CHECK_THAT(out.str(), Catch::Contains("default limit: 4GiB"));
  CHECK_THAT(out.str(), Catch::Contains("users: 1 entry"));
  // A JSON string (what Debian's yq prints without -r) is refused, positioned.
  std::istringstream quoted("\"version: 1\\ndefault: {limit: 4GiB}\\n\"\n");
  std::ostringstream out2;
  std::ostringstream err2;
  App app2(out2, err2, false, quoted);
  CHECK(app2.run(CtlOptions::parse(std::vector<std::string>{"quota", "check", "-", "--gpu-memory", "8GiB"}, nullptr)) ==
        1);
  CHECK_THAT(err2.str(), Catch::StartsWith("<stdin>:"));
}

TEST_CASE("events: the guard ring, oldest first, text and JSON", "[units]") {
  namespace gst = vlake::state;
  auto s = std::make_unique<gst::State>();
  std::memset(static_cast<void*>(s.get()), 0, sizeof(gst::State));
  CHECK(build_view(*s, true).events.empty());
  CHECK_THAT(render_events_text(build_view(*s, true), "st"), Catch::Contains("no guard alarms"));

  // Three events recorded, the ring then wrapped: only the last kGuardEvents remain.
  const std::uint64_t total = gst::kGuardEvents + 2;
  for (std::uint64_t seq = 1; seq <= total; ++seq) {
    gst::GuardEventRecord& e = s->guard.events[(seq - 1) % gst::kGuardEvents];
    e = gst::GuardEventRecord{};
    e.seq = seq;
    e.kind = seq == total ? 1u : 2u;  // the newest is a fault, the others canaries
    e.tenant = 3;
    std::strcpy(e.tenant_name, "team/user:4242");
    e.device = seq == total ? gst::kGuardNoDevice : 0;
    e.pid = 777;
    e.grant_id = seq;
    e.requested_bytes = (1u << 20) + 100;
    e.first_bad_offset = (1u << 20) + 104;
    std::strcpy(e.call, seq == total ? "cuStreamSynchronize" : "release");
    if (seq == total) {
      e.cuda_status = 700;
      e.suspect_count = 2;
      e.suspects[0] = vlake::proto::GuardSuspect{0x7000, 4096, 10};
      e.suspects[1] = vlake::proto::GuardSuspect{0x9000, 256, 20};
      e.flags = gst::kFaultMapsShared;
    }
    if (seq == total - 1) {  // a refused memset into a shared range
      e.kind = 4;
      e.address = 0x200000 + (4u << 20);
      e.requested_bytes = 16;
      e.first_bad_offset = 4u << 20;
      e.cuda_status = 1;
      e.suspect_count = 1;
      e.suspects[0] = vlake::proto::GuardSuspect{0x200000, 20u << 20, 10};
      std::strcpy(e.call, "cuMemsetD8");
    }
  }
  s->guard.next_seq = total + 1;
  const NodeView v = build_view(*s, true);
  REQUIRE(v.events.size() == gst::kGuardEvents);
  CHECK(v.events.front().seq == 3);
  CHECK(v.events.back().seq == total);
  CHECK(v.events.back().kind == "fault");
  CHECK_FALSE(v.events.back().gpu.has_value());
  CHECK(v.events.front().kind == "canary");
  CHECK(*v.events.front().gpu == 0);

  const Json j = parse_json(render_events_json(v, "st"));
  REQUIRE(j.at("events").size() == gst::kGuardEvents);
  const Json& last = j.at("events").at(gst::kGuardEvents - 1);
  CHECK(last.at("kind").str() == "fault");
  CHECK(last.at("gpu").is_null());
  CHECK(last.at("call").str() == "cuStreamSynchronize");
  CHECK(last.at("suspects").size() == 2);
  CHECK(last.at("suspects").at(1).at("bytes").u64() == 256);
  CHECK_FALSE(last.at("guarded").boolean());
  CHECK(last.at("maps_shared").boolean());
  const Json& write = j.at("events").at(gst::kGuardEvents - 2);
  CHECK(write.at("kind").str() == "readonly_write");
  CHECK(write.at("address").u64() == 0x200000 + (4u << 20));
  CHECK(write.at("requested_bytes").u64() == 16);
  CHECK(write.at("call").str() == "cuMemsetD8");
  CHECK_FALSE(write.has("maps_shared"));
  const Json& first = j.at("events").at(0);
  CHECK(first.at("kind").str() == "canary");
  CHECK(first.at("first_bad_offset").u64() == (1u << 20) + 104);
  CHECK(first.at("tenant").str() == "team/user:4242");

  const std::string text = render_events_text(v, "st");
  INFO(text);
  CHECK_THAT(text, Catch::Contains("canary          team/user:4242"));  // KIND as wide as readonly_write
  CHECK_THAT(text, Catch::Contains("cuStreamSynchronize guarded=no maps_shared=yes (newest allocations: 0x7000+4.0 KiB "
                                   "0x9000+256 B)"));
  CHECK_THAT(text, Catch::Contains("cuMemsetD8 to 0x600000 hits allocation 0x200000+"));
  CHECK_THAT(text, Catch::Contains("(shared from offset 4194304, grant "));
}

TEST_CASE("render: memory outside vlake per tenant, counted in USED unless enforce is account", "[unit]") {
  auto s = synthetic_state();
  auto& alice = s->tenants[0];  // refuse: counted
  alice.enforce = 1;
  alice.unhooked[0] = 64 * kMiB;
  alice.unhooked_processes = 1;
  auto& ml = s->tenants[1];  // account: shown only
  ml.enforce = 0;
  ml.unhooked[0] = 32 * kMiB;
  ml.unhooked_processes = 2;
  s->devices[0].unhooked_bytes = 96 * kMiB;
  s->devices[0].nvml_used_bytes = 700 * kMiB;
  s->devices[0].unlisted_bytes = 300 * kMiB;
  s->counters.unhooked_kills = 5;
  const NodeView v = build_view(*s, false);

  const Json tn = parse_json(render_tenants_json(v, "st1"));
  const Json& a = tn.at("tenants").at(0);
  CHECK(a.at("enforce").str() == "refuse");
  CHECK(a.at("unhooked_processes").u64() == 1);
  CHECK(a.at("gpus").at(0).at("unhooked").u64() == 64 * kMiB);
  CHECK(a.at("gpus").at(0).at("used").u64() == (36 + 512 + 64) * kMiB);
  const Json& m = tn.at("tenants").at(1);
  CHECK(m.at("enforce").str() == "account");
  CHECK(m.at("gpus").at(0).at("unhooked").u64() == 32 * kMiB);
  CHECK(m.at("gpus").at(0).at("used").u64() == 0);

  // top lists a tenant whose only memory on a GPU is outside vlake, with its OUTSIDE figure.
  const std::string top = render_top_text(v, "st1", "");
  INFO(top);
  CHECK(top.find("(borrowed 0 B)  outside vlake 96.0 MiB\n") != std::string::npos);
  CHECK(top.find("  research   group:ml           0 B       0 B  32.0 MiB  40.0 GiB") != std::string::npos);
  const std::string tt = render_tenants_text(v, "st1");
  INFO(tt);
  CHECK(tt.find(" 0  612.0 MiB*  36.0 MiB       0 B       0 B       0 B  512.0 MiB  64.0 MiB  16.0 GiB") !=
        std::string::npos);

  const Json pj = parse_json(render_pool_json(v, "st1"));
  CHECK(pj.at("gpus").at(0).at("unhooked").u64() == 96 * kMiB);
  CHECK(pj.at("gpus").at(0).at("nvml_used").u64() == 700 * kMiB);
  CHECK(pj.at("gpus").at(0).at("unlisted").u64() == 300 * kMiB);
  CHECK(pj.at("counters").at("unhooked_kills").u64() == 5);
}

TEST_CASE("format: human durations", "[units]") {
  CHECK(human_duration(std::nullopt) == "-");
  CHECK(human_duration(-1.0) == "-");
  CHECK(human_duration(std::numeric_limits<double>::infinity()) == "-");
  CHECK(human_duration(0.4) == "0s");
  CHECK(human_duration(59.9) == "59s");
  CHECK(human_duration(60.0) == "1m");
  CHECK(human_duration(3599.0) == "59m");
  CHECK(human_duration(3600.0 + 5 * 60) == "1h05m");
  CHECK(human_duration(2 * 86400.0 + 4 * 3600) == "2d04h");
}

TEST_CASE("options: processes, ps and waits, with --watch", "[units]") {
  CHECK(parse({"processes"}).command == Command::processes);
  CHECK(parse({"ps"}).command == Command::processes);
  CHECK(parse({"waits", "--json"}).command == Command::waits);
  CHECK(parse({"waits", "--watch", "1s"}).watch_seconds == 1.0);
  CHECK_THROWS_AS(parse({"pool", "--watch"}), UsageError);
}

// Layout 9: what each process does (idle, swapped, waiting), who waits for whom, refusals.
TEST_CASE("render: idle times, swap states, who waits for whom and refusals", "[units]") {
  auto s = synthetic_state();
  constexpr std::uint64_t kS = 1'000'000'000ULL;
  const std::uint64_t now = 1'700'000'000ULL * kS;
  s->header.updated_unix_ns = now;
  st::SessionRecord& alice1 = s->sessions[0];  // session 11, pid 5001: going out for session 13
  alice1.last_active_unix_ns = now - 120 * kS;
  alice1.flags = st::kSessionOvercommit;
  alice1.swap = st::kSwapCheckpointing;
  alice1.swap_device = 0;
  alice1.swap_bytes = 30 * kMiB;
  alice1.swap_for = 13;
  s->sessions[3].last_active_unix_ns = now - 5 * kS;  // session 12, pid 5002
  st::SessionRecord& ml = s->sessions[4];             // session 13, pid 6001: waits
  ml.last_active_unix_ns = now - 1 * kS;
  ml.flags = st::kSessionReclaim;
  ml.wait = st::kWaitMemory;
  ml.wait_device = 1;
  ml.wait_bytes = 2 * kGiB;
  ml.wait_since_unix_ns = now - 12 * kS;
  ml.wait_deadline_unix_ns = now + 108 * kS;
  ml.waits_for_count = 2;
  ml.waits_for[0] = 11;
  ml.waits_for[1] = 99;                      // ended meanwhile
  st::SessionRecord& nine = s->sessions[9];  // session 14, pid 7001: on the host
  nine.flags = st::kSessionOvercommit;
  nine.swap = st::kSwapHost;
  nine.swap_device = 0;
  nine.swap_bytes = kGiB;
  nine.swap_since_unix_ns = now - 180 * kS;
  nine.swap_outs = 1;
  s->devices[0].swapped_bytes = kGiB;
  s->tenants[0].denials[st::kRefusalTenantLimit - 1] = 3;
  s->tenants[0].denials[st::kRefusalOutOfMemory - 1] = 1;
  s->counters.swap_outs = 4;
  for (std::uint64_t seq = 1; seq <= 2; ++seq) {
    st::RefusalRecord& r = s->refusals.refusals[seq - 1];
    r.seq = seq;
    r.time_unix_ns = now - (10 - seq) * kS;
    r.tenant = 1;
    std::strcpy(r.tenant_name, "user:alice");
    r.pid = 5001;
    r.device = seq == 1 ? 0 : st::kGuardNoDevice;
    r.reason = seq == 1 ? st::kRefusalTenantLimit : st::kRefusalLimitReached;
    r.bytes = seq == 1 ? 20 * kGiB : 0;
    r.used = seq == 1 ? 548 * kMiB : 128;
    r.limit = seq == 1 ? 16 * kGiB : 128;
    r.waited_ms = seq == 1 ? 1500 : 0;
  }
  s->refusals.next_seq = 3;
  const NodeView v = build_view(*s, true);

  REQUIRE(v.tenants.size() == 4);
  REQUIRE(v.tenants[0].idle_seconds.has_value());
  CHECK(*v.tenants[0].idle_seconds == Approx(5.0));  // the least idle of its processes
  CHECK(v.tenants[0].gpus[0].swapped == 0);          // going out is not out yet
  CHECK(v.tenants[3].gpus[0].swapped == kGiB);       // uid:9's process is on the host
  REQUIRE(v.waits.size() == 1);
  CHECK(v.waits[0].waiter.pid == 6001);
  CHECK(*v.waits[0].waited_seconds == Approx(12.0));
  CHECK(*v.waits[0].left_seconds == Approx(108.0));
  REQUIRE(v.waits[0].waits_for.size() == 2);
  CHECK(v.waits[0].waits_for[0].why == "swapping out");
  CHECK(v.waits[0].waits_for[1].why == "gone");

  const std::string top = render_top_text(v, "st1", "");
  INFO(top);
  CHECK_THAT(top, Catch::Contains("  on host 1.0 GiB\n"));
  CHECK_THAT(top, Catch::Contains("SHARE  IDLE  ON HOST  PROCS  PIDS"));
  CHECK_THAT(top, Catch::Contains("0.7%    5s      0 B      2  5001,5002"));
  CHECK_THAT(top, Catch::Contains("\nwaiting (vlakectl waits):\n"));
  CHECK_THAT(
      top, Catch::Contains("6001  group:ml     0  memory    1  2.0 GiB     12s    1m  5001 (user:alice, swapping out), "
                           "session 99 (gone)\n"));

  const std::string ps = render_processes_text(v, "st1");
  INFO(ps);
  CHECK_THAT(ps, Catch::Contains("7001       14  uid:9"));
  CHECK_THAT(ps, Catch::Contains("host 1.0 GiB for 3m"));
  CHECK_THAT(ps, Catch::Contains("checkpointing 30.0 MiB"));
  CHECK_THAT(ps, Catch::Contains("memory 2.0 GiB on GPU 1 for 12s"));
  const Json pj = parse_json(render_processes_json(v, "st1"));
  REQUIRE(pj.at("processes").size() == 4);
  const Json& p0 = pj.at("processes").at(0);  // group:ml sorts first
  CHECK(p0.at("tenant").str() == "group:ml");
  CHECK(p0.at("reclaim").boolean());
  CHECK(p0.at("wait").at("for").str() == "memory");
  CHECK(p0.at("wait").at("waits_for").at(0).u64() == 11);
  CHECK(p0.at("idle_seconds").num() == Approx(1.0));
  const Json& p1 = pj.at("processes").at(2);  // then uid:9, then user:alice
  CHECK(p1.at("pid").u64() == 5001);
  CHECK(p1.at("swap").at("state").str() == "checkpointing");
  CHECK(p1.at("swap").at("for_session").u64() == 13);
  CHECK(p1.at("wait").is_null());

  const Json wj = parse_json(render_waits_json(v, "st1"));
  REQUIRE(wj.at("waits").size() == 1);
  CHECK(wj.at("waits").at(0).at("waits_for").at(0).at("pid").u64() == 5001);
  CHECK(wj.at("waits").at(0).at("left_seconds").num() == Approx(108.0));
  CHECK_THAT(render_waits_text(build_view(*synthetic_state(), true), "st1"),
             Catch::Contains("nobody waits for memory"));

  const Json tj = parse_json(render_tenants_json(v, "st1"));
  CHECK(tj.at("tenants").at(0).at("denials").at("tenant_limit").u64() == 3);
  CHECK(tj.at("tenants").at(0).at("denials").at("out_of_memory").u64() == 1);
  CHECK(tj.at("tenants").at(0).at("denials").at("restore_timeout").u64() == 0);
  CHECK(tj.at("tenants").at(0).at("idle_seconds").num() == Approx(5.0));
  CHECK(tj.at("tenants").at(3).at("gpus").at(0).at("swapped").u64() == kGiB);

  const std::string ev = render_events_text(v, "st1");
  INFO(ev);
  CHECK_THAT(ev, Catch::Contains("no guard alarms"));
  CHECK_THAT(ev, Catch::Contains("refusals (256 kept, per tenant):"));
  CHECK_THAT(ev, Catch::Contains("tenant_limit   user:alice    0  5001  20.0 GiB  548.0 MiB  16.0 GiB      1s"));
  CHECK_THAT(ev, Catch::Contains("limit_reached  user:alice    -  5001         -        128       128       -"));
  const Json ej = parse_json(render_events_json(v, "st1"));
  REQUIRE(ej.at("refusals").size() == 2);
  CHECK(ej.at("refusals").at(0).at("reason").str() == "tenant_limit");
  CHECK(ej.at("refusals").at(0).at("waited_ms").u64() == 1500);
  CHECK(ej.at("refusals").at(1).at("gpu").is_null());
  const Json poj = parse_json(render_pool_json(v, "st1"));
  CHECK(poj.at("counters").at("swap_outs").u64() == 4);
  CHECK(poj.at("gpus").at(0).at("swapped").u64() == kGiB);
}

TEST_CASE("events: rings kept per tenant are read in seq order, with what each tenant lost", "[units]") {
  auto s = synthetic_state();
  // A flood of tenant 2 ("group:ml") made room with its own oldest: slots are not in seq order.
  const std::uint64_t seqs[] = {907, 12, 906, 905};
  for (std::uint32_t i = 0; i < 4; ++i) {
    st::RefusalRecord& r = s->refusals.refusals[i];
    r.seq = seqs[i];
    r.tenant = seqs[i] == 12 ? 1 : 2;
    std::strcpy(r.tenant_name, seqs[i] == 12 ? "user:alice" : "group:ml");
    r.reason = st::kRefusalTenantLimit;
    r.device = 0;
  }
  s->refusals.next_seq = 908;
  s->refusals.evicted = 903;
  s->tenants[1].refusals_evicted = 903;
  s->guard.events[3].seq = 4;
  s->guard.events[3].kind = 1;
  s->guard.events[3].tenant = 1;
  std::strcpy(s->guard.events[3].tenant_name, "user:alice");
  s->guard.events[0].seq = 7;
  s->guard.events[0].kind = 2;
  s->guard.events[0].tenant = 2;
  std::strcpy(s->guard.events[0].tenant_name, "group:ml");
  s->guard.next_seq = 8;
  s->guard.evicted = 2;
  s->tenants[1].guard_events_evicted = 2;
  const NodeView v = build_view(*s, true);
  REQUIRE(v.refusals.size() == 4);
  CHECK(v.refusals[0].seq == 12);
  CHECK(v.refusals[0].tenant == "user:alice");
  CHECK(v.refusals[1].seq == 905);
  CHECK(v.refusals[3].seq == 907);
  REQUIRE(v.events.size() == 2);
  CHECK(v.events[0].seq == 4);
  CHECK(v.events[1].seq == 7);
  const std::string text = render_events_text(v, "st1");
  INFO(text);
  CHECK_THAT(text, Catch::Contains("guard alarms (256 kept, per tenant; 2 pushed out: group:ml 2):"));
  CHECK_THAT(text, Catch::Contains("refusals (256 kept, per tenant; 903 pushed out: group:ml 903):"));
  const Json j = parse_json(render_events_json(v, "st1"));
  CHECK(j.at("refusals_evicted").u64() == 903);
  CHECK(j.at("guard_events_evicted").u64() == 2);
  REQUIRE(j.at("evicted").size() == 1);
  CHECK(j.at("evicted").at(0).at("tenant").str() == "group:ml");
  CHECK(j.at("evicted").at(0).at("refusals").u64() == 903);
  CHECK(j.at("evicted").at(0).at("guard_events").u64() == 2);
  CHECK(j.at("refusals").at(0).at("seq").u64() == 12);
}
