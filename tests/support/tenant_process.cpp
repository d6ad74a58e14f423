#include "tenant_process.hpp"

#include <sys/wait.h>

#include <chrono>
#include <thread>

namespace vlake::e2e {

namespace {
// The step (first word) and key=value pairs of a tenant's output line.
std::map<std::string, std::string> parse_pairs(const std::string& line) {
  auto kv = testsupport::key_values(line);
  kv["step"] = line.substr(0, line.find(' '));
  return kv;
}
}  // namespace

bool exited_ok(int status) { return status >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0; }

std::unique_ptr<state::State> snapshot(const pooltest::DaemonProcess& d) {
  return state::StateReader(d.state).snapshot();
}

std::uint64_t granted(const pooltest::DaemonProcess& d, const std::string& name) {
  const auto s = snapshot(d);
  const state::TenantRecord* t = pooltest::tenant(*s, name);
  return t == nullptr ? 0 : t->granted[0];
}

std::unique_ptr<state::State> wait_state(const pooltest::DaemonProcess& d,
                                         const std::function<bool(const state::State&)>& done) {
  auto s = snapshot(d);
  for (int i = 0; i < 100 && !done(*s); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    s = snapshot(d);
  }
  return s;
}

TenantProcess::TenantProcess(const pooltest::DaemonProcess& daemon, const std::vector<std::string>& steps, long uid,
                             std::string reserve, const std::vector<std::string>& extra_env) {
  testsupport::Env env = pooltest::hooked_env(daemon);
  env.set("VLAKE_RECONNECT_TIMEOUT", "10s");
  // These tests follow every alloc/free at the daemon; the reserve is tested on its own.
  env.set("VLAKE_RESERVE", reserve);
  for (const std::string& kv : extra_env) env.set(kv);
  testsupport::Spawn spec;
  spec.argv = {VLAKE_TENANT_PATH};
  spec.argv.insert(spec.argv.end(), steps.begin(), steps.end());
  spec.env = env.strings();
  spec.uid = uid;
  spec.gid = uid >= 0 ? 0 : -1;
  proc_ = std::make_unique<testsupport::Process>(spec);
}

TenantProcess::~TenantProcess() = default;  // ~Process SIGKILLs and reaps a tenant still running

std::map<std::string, std::string> TenantProcess::wait_line(const std::string& prefix, int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < deadline) {
    const std::string l = testsupport::line_starting(proc_->out(), prefix);
    if (!l.empty() && proc_->out().find(l + "\n") != std::string::npos) return parse_pairs(l);
    if (proc_->status()) break;
    if (proc_->poll_exit()) {
      proc_->pump(0);
      proc_->pump(0);
      continue;
    }
    proc_->pump(20);
  }
  return {};
}

int TenantProcess::finish(int timeout_ms) {
  const int status = proc_->wait(timeout_ms);
  for (int i = 0; i < 50; ++i) proc_->pump(0);  // drain what is left in the pipes
  return status;
}

void TenantProcess::kill9() { proc_->kill(); }

std::map<std::string, std::string> TenantProcess::line(const std::string& prefix) const {
  const std::string l = testsupport::line_starting(proc_->out(), prefix);
  return l.empty() ? std::map<std::string, std::string>{} : parse_pairs(l);
}

}  // namespace vlake::e2e
