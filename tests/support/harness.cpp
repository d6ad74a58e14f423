#include "harness.hpp"

#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <system_error>

#include "pool_client.hpp"

namespace vlake::pooltest {

namespace st = vlake::state;

std::string unique_name(const std::string& tag) {
  static std::atomic<int> counter{0};
  return "pt" + std::to_string(::getpid()) + "-" + std::to_string(counter++) + "-" + tag;
}

std::string mib(std::uint64_t n) { return std::to_string(n << 20); }

std::vector<std::string> child_env(const std::string& node, int devices) {
  return testsupport::Env::inherited()
      .unset_prefix("VLAKE_SIM_")
      .set("VLAKE_SIM_NODE", node)
      .set("VLAKE_SIM_DEVICE_MEMORY", "1GiB")
      .set("VLAKE_SIM_DEVICE_COUNT", std::to_string(devices))
      .strings();
}

testsupport::Env hooked_env(const DaemonProcess& daemon) {
  testsupport::Env env = testsupport::Env::inherited();
  const std::string asan_options = env.get("ASAN_OPTIONS").value_or("");
  env.unset("LD_PRELOAD").unset("LD_LIBRARY_PATH").unset_prefix("VLAKE_");
  for (const auto& kv : child_env(daemon.node, daemon.devices)) {
    if (kv.rfind("VLAKE_SIM_", 0) == 0) env.set(kv);
  }
  return env.set("LD_PRELOAD", VLAKE_HOOK_LIB)
      .set("LD_LIBRARY_PATH", testsupport::dir_of(VLAKE_SIM_LIB))
      .set("VLAKE_SOCKET", daemon.socket)
      .set("ASAN_OPTIONS", asan_options)
      .append("ASAN_OPTIONS", "verify_asan_link_order=0", ":");
}

DaemonProcess::DaemonProcess(const std::string& tag, const std::string& config_yaml) {
  node = unique_name(tag);
  // The simulator creates its node file with mode 0660 minus the umask: keep it group-
  // writable so helpers that drop to another uid (gid 0) can use the simulated GPU too.
  ::umask(0002);
  char tmpl[] = "/tmp/vlake-pooltest-XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  dir = tmpl;
  ::chmod(dir.c_str(), 0755);         // helpers running as other uids reach the socket
  socket = dir + "/run/vlaked.sock";  // run/ does not exist: the daemon creates it
  state = node + "-state";
  log_path = dir + "/vlaked.log";
  config = dir + "/vlake.yaml";
  if (!config_yaml.empty()) {
    std::ofstream out(config);
    out << config_yaml;
  }
}

DaemonProcess::~DaemonProcess() {
  proc_.reset();  // SIGKILLs and reaps a daemon still running
  testsupport::remove_tree(dir);
  ::unlink(st::segment_path(state).c_str());
  ::unlink(("/dev/shm/vlake-sim-" + node).c_str());
}

testsupport::Spawn DaemonProcess::spawn_spec(const std::vector<std::string>& extra) const {
  testsupport::Spawn spec;
  spec.argv = {VLAKED_PATH, "--driver",          VLAKE_SIM_LIB, "--socket", socket, "--state",
               state,       "--config",          config,        "--nvml",   "none", "--sample-interval-ms",
               "50",        "--metrics-address", "none"};
  // The warm stock (off by default) builds handles in the background: tests run without it
  // whatever the default, since many check the pool's exact figures; a test of the stock passes
  // --warm-stock (the last value given wins).
  spec.argv.insert(spec.argv.end(), {"--warm-stock", "0"});
  spec.argv.insert(spec.argv.end(), extra.begin(), extra.end());
  spec.env = child_env(node, devices);
  for (std::string& kv : *spec.env) {
    if (kv.rfind("VLAKE_SIM_DEVICE_MEMORY=", 0) == 0) kv = "VLAKE_SIM_DEVICE_MEMORY=" + device_memory;
  }
  spec.env->insert(spec.env->end(), env.begin(), env.end());
  spec.out = testsupport::Stream::null;
  spec.err = testsupport::Stream::file;
  spec.err_file = log_path;
  return spec;
}

bool DaemonProcess::start(const std::vector<std::string>& extra) {
  last_extra_ = extra;
  proc_ = std::make_unique<testsupport::Process>(spawn_spec(extra));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    if (proc_->poll_exit()) {
      proc_.reset();
      return false;
    }
    try {
      PoolClient probe(socket);  // connects; the daemon sees it close before Hello
      return true;
    } catch (const std::system_error&) {
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

int DaemonProcess::run_second() {
  testsupport::Process second(spawn_spec(last_extra_));
  return second.wait(10000);  // a second still running at the timeout is killed by ~Process
}

void DaemonProcess::signal(int sig) {
  if (proc_) proc_->signal(sig);
}

int DaemonProcess::wait_exit(int timeout_ms) {
  if (!proc_) return -1;
  const int status = proc_->wait(timeout_ms);
  if (status >= 0) proc_.reset();
  return status;
}

std::string DaemonProcess::log() const { return testsupport::read_file(log_path); }

Helper::Helper(const std::string& node, long uid, long gid) {
  testsupport::Spawn spec;
  spec.argv = {VLAKE_POOL_CLIENT_PATH, "--driver", VLAKE_SIM_LIB};
  if (uid >= 0) spec.argv.insert(spec.argv.end(), {"--uid", std::to_string(uid)});
  if (gid >= 0) spec.argv.insert(spec.argv.end(), {"--gid", std::to_string(gid)});
  spec.env = child_env(node);
  spec.in = testsupport::Stream::pipe;
  spec.err = testsupport::Stream::inherit;
  proc_ = std::make_unique<testsupport::Process>(spec);
  const std::string ready = cmd("");  // the banner line: "ok ready pid=N"
  REQUIRE(ready.rfind("ok ready", 0) == 0);
}

Helper::~Helper() {
  proc_->close_stdin();  // the helper exits; SIGKILLed by ~Process if it lingers
  proc_->wait(5000);
}

std::string Helper::cmd(const std::string& line, std::chrono::seconds timeout) {
  if (!line.empty() && !proc_->write(line + "\n")) throw std::runtime_error("helper: write failed");
  const auto reply = proc_->read_line(static_cast<int>(std::chrono::milliseconds(timeout).count()));
  if (reply) return *reply;
  if (!proc_->reading()) throw std::runtime_error("helper: exited during '" + line + "'");
  throw std::runtime_error("helper: no answer to '" + line + "'");
}

std::map<std::string, std::string> reply_fields(const std::string& reply) {
  return testsupport::key_values(reply.rfind("ok", 0) == 0 ? reply.substr(2) : reply);
}

std::map<std::string, std::string> Helper::ok(const std::string& line, std::chrono::seconds timeout) {
  const std::string r = cmd(line, timeout);
  INFO("command: " << line << " -> " << r);
  REQUIRE(r.rfind("ok", 0) == 0);
  return reply_fields(r);
}

void Helper::kill9() { proc_->kill(); }

TwoTenants::TwoTenants(const DaemonProcess& d) : a(d.node, 4242, 0), b(d.node, 4243, 0), filler(d.node) {
  a.ok("connect " + d.socket);
  b.ok("connect " + d.socket);
}

std::uint64_t num(const std::map<std::string, std::string>& kv, const std::string& key) {
  const auto it = kv.find(key);
  if (it == kv.end()) throw std::runtime_error("no '" + key + "' in the reply");
  return std::stoull(it->second);
}

st::SessionRecord session_record(std::uint64_t id, std::uint64_t start, std::uint32_t pid, std::uint32_t uid,
                                 std::uint32_t tenant, std::uint32_t state, std::uint32_t grants) {
  st::SessionRecord r{};
  r.id = id;
  r.start_time = start;
  r.pid = pid;
  r.uid = uid;
  r.gid = uid;
  r.tenant = tenant;
  r.state = state;
  r.grant_count = grants;
  return r;
}

std::unique_ptr<st::State> snapshot(const std::string& state_name) {
  st::StateReader r(state_name);
  return r.snapshot();
}

const st::TenantRecord* tenant(const st::State& s, const std::string& name) {
  for (const auto& t : s.tenants) {
    if (t.in_use != 0 && name == std::string(t.name, strnlen(t.name, sizeof t.name))) return &t;
  }
  return nullptr;
}

std::string tenant_name(const st::State& s, std::uint32_t id) {
  for (const auto& t : s.tenants) {
    if (t.in_use != 0 && t.id == id) return std::string(t.name, strnlen(t.name, sizeof t.name));
  }
  return "?";
}

std::size_t live_sessions(const st::State& s) {
  std::size_t n = 0;
  for (const auto& x : s.sessions) n += x.state != st::kSessionFree ? 1 : 0;
  return n;
}

std::size_t live_grants(const st::State& s) {
  std::size_t n = 0;
  for (const auto& x : s.grants) n += x.state != st::kGrantFree ? 1 : 0;
  return n;
}

std::uint64_t sim_used(const std::string& node) {
  Helper h(node);
  return num(h.ok("meminfo"), "used");
}

}  // namespace vlake::pooltest
