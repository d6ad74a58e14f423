#include "ctl_process.hpp"

#include <sys/wait.h>

namespace vlake::ctltest {

namespace {

testsupport::Spawn ctl_spec(const std::vector<std::string>& args, const std::vector<std::string>& env) {
  testsupport::Env e = testsupport::Env::inherited();
  e.unset("VLAKE_STATE");
  for (const auto& kv : env) e.set(kv);
  testsupport::Spawn spec;
  spec.argv = {VLAKECTL_PATH};
  spec.argv.insert(spec.argv.end(), args.begin(), args.end());
  spec.env = e.strings();
  spec.in = testsupport::Stream::null;
  return spec;
}

int exit_code_of(int status) { return status >= 0 && WIFEXITED(status) ? WEXITSTATUS(status) : -1; }

}  // namespace

std::size_t count_of(const std::string& hay, const std::string& needle) {
  std::size_t n = 0;
  for (auto p = hay.find(needle); p != std::string::npos; p = hay.find(needle, p + needle.size())) ++n;
  return n;
}

CtlResult run_ctl(const std::vector<std::string>& args, long uid, long gid, const std::vector<std::string>& env,
                  int timeout_ms) {
  testsupport::Spawn spec = ctl_spec(args, env);
  spec.uid = uid;
  spec.gid = gid;
  testsupport::Result r = testsupport::run(spec, timeout_ms);
  return CtlResult{r.timed_out ? -1 : exit_code_of(r.status), std::move(r.out), std::move(r.err)};
}

CtlBackground::CtlBackground(const std::vector<std::string>& args) {
  testsupport::Spawn spec = ctl_spec(args, {});
  spec.err = testsupport::Stream::merged;  // errors show up in out()
  proc_ = std::make_unique<testsupport::Process>(spec);
}

CtlBackground::~CtlBackground() = default;  // ~Process SIGKILLs and reaps a child still running

bool CtlBackground::wait_for(const std::string& needle, std::size_t count, int timeout_ms) {
  return proc_->read_until([&] { return count_of(proc_->out(), needle) >= count; }, timeout_ms);
}

void CtlBackground::signal(int sig) { proc_->signal(sig); }

int CtlBackground::wait(int timeout_ms) {
  proc_->drain(timeout_ms);
  return exit_code_of(proc_->wait(2000));
}

}  // namespace vlake::ctltest
