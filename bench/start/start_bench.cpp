#include "start_bench.hpp"

#include <cudaTypedefs.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iostream>
#include <memory>
#include <stdexcept>

#include "bench_support.hpp"

extern char** environ;  // NOLINT(readability-redundant-declaration): posix_spawn passes it on

namespace vlake::bench {

namespace {

constexpr int kReadyFd = 3;    // the child's end of the ready pipe
constexpr int kReleaseFd = 4;  // the child's end of the release pipe

// The child: CUDA up, memory held, "r" on the ready pipe (or "x" after an error), then it waits
// until the parent closes the release pipe.
int child_main(const StartOptions& o) {
  char status = 'r';
  CUdeviceptr p = 0;
  std::unique_ptr<CudaApi> api;
  try {
    api = std::make_unique<CudaApi>(o.driver);
    api->init_context(DeviceOrdinal{0});
    api->check(api->mem_alloc(&p, o.bytes.value()), "cuMemAlloc_v2");
    api->check(api->entry<PFN_cuMemsetD8_v3020>("cuMemsetD8_v2")(p, 0x5a, o.bytes.value()), "cuMemsetD8_v2");
    api->check(api->entry<PFN_cuCtxSynchronize_v2000>("cuCtxSynchronize")(), "cuCtxSynchronize");
  } catch (const std::exception& e) {
    std::cerr << "vlake_bench_start (child " << ::getpid() << "): " << e.what() << "\n";
    status = 'x';
  }
  if (::write(kReadyFd, &status, 1) != 1) return 1;
  char c = 0;
  while (::read(kReleaseFd, &c, 1) < 0 && errno == EINTR) {
  }
  if (p != 0) (void)api->mem_free(p);
  return status == 'r' ? 0 : 1;
}

}  // namespace

const char* StartBench::usage() noexcept {
  return "usage: vlake_bench_start [--processes N] [--bytes 64MiB] [--timeout-s 120] [--driver PATH]\n"
         "                         [--label TEXT]\n";
}

StartOptions StartBench::parse(const std::vector<std::string>& args) {
  StartOptions o;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") throw std::invalid_argument("help");
    if (a == "--child") {
      o.child = true;
      continue;
    }
    if (i + 1 >= args.size()) throw std::invalid_argument(a + " needs a value (see --help)");
    const std::string& v = args[++i];
    if (a == "--processes") {
      o.processes = static_cast<int>(parse_number(a, v, 1, 1024));
    } else if (a == "--bytes") {
      try {
        o.bytes = parse_size(v);
      } catch (const std::exception& e) {
        throw std::invalid_argument("--bytes: " + std::string(e.what()));
      }
    } else if (a == "--timeout-s") {
      o.timeout_s = static_cast<int>(parse_number(a, v, 1, 3600));
    } else if (a == "--driver") {
      o.driver = v;
    } else if (a == "--label") {
      o.label = v;
    } else {
      throw std::invalid_argument("unknown option '" + a + "' (see --help)");
    }
  }
  return o;
}

std::string StartBench::run() {
  if (o_.child) {
    const int rc = child_main(o_);
    std::_Exit(rc);
  }
  // Both pipes above the children's fds 3 and 4, so that every dup2 below makes a new descriptor
  // (without close-on-exec) and none overwrites an end still to be duplicated.
  int ready[2];
  int release[2];
  auto lift = [](int fds[2]) {
    for (int k = 0; k < 2; ++k) {
      const int high = ::fcntl(fds[k], F_DUPFD_CLOEXEC, 10);
      if (high < 0) throw std::runtime_error(std::string("fcntl: ") + std::strerror(errno));
      ::close(fds[k]);
      fds[k] = high;
    }
  };
  if (::pipe2(ready, O_CLOEXEC) != 0 || ::pipe2(release, O_CLOEXEC) != 0) {
    throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
  }
  lift(ready);
  lift(release);
  const std::string bytes = std::to_string(o_.bytes.value()) + "B";
  std::vector<std::string> argv_s = {"vlake_bench_start", "--child", "--bytes", bytes, "--driver", o_.driver};
  std::vector<char*> argv;
  for (auto& s : argv_s) argv.push_back(s.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, ready[1], kReadyFd);
  posix_spawn_file_actions_adddup2(&fa, release[0], kReleaseFd);

  std::vector<pid_t> kids;
  std::vector<double> at;  // seconds from the first spawn to each ready report
  int failed = 0;
  std::string error;
  const std::uint64_t t0 = now_ns();
  for (int i = 0; i < o_.processes; ++i) {
    pid_t pid = 0;
    const int rc = ::posix_spawn(&pid, "/proc/self/exe", &fa, nullptr, argv.data(), environ);
    if (rc != 0) {
      error = std::string("posix_spawn: ") + std::strerror(rc);
      break;
    }
    kids.push_back(pid);
  }
  posix_spawn_file_actions_destroy(&fa);
  ::close(ready[1]);
  ::close(release[0]);
  const std::uint64_t deadline = t0 + static_cast<std::uint64_t>(o_.timeout_s) * 1000000000ULL;
  while (error.empty() && at.size() + static_cast<std::size_t>(failed) < kids.size()) {
    const std::uint64_t now = now_ns();
    if (now >= deadline) {
      error = std::to_string(at.size()) + " of " + std::to_string(kids.size()) + " children ready after " +
              std::to_string(o_.timeout_s) + " s";
      break;
    }
    pollfd pfd{ready[0], POLLIN, 0};
    const int n = ::poll(&pfd, 1, static_cast<int>(std::min<std::uint64_t>((deadline - now) / 1000000 + 1, 1000)));
    if (n <= 0) continue;
    char buf[256];
    const ssize_t got = ::read(ready[0], buf, sizeof buf);
    if (got == 0) {
      error = "a child died before reporting";
      break;
    }
    const double t = static_cast<double>(now_ns() - t0) / 1e9;
    for (ssize_t k = 0; k < got; ++k) {
      if (buf[k] == 'r') {
        at.push_back(t);
      } else {
        ++failed;
      }
    }
  }
  const std::uint64_t t_release = now_ns();
  ::close(release[1]);  // every child frees its memory and exits
  if (!error.empty() || failed != 0) {
    for (pid_t p : kids) ::kill(p, SIGKILL);
  }
  for (pid_t p : kids) {
    int st = 0;
    while (::waitpid(p, &st, 0) < 0 && errno == EINTR) {
    }
  }
  const double teardown = static_cast<double>(now_ns() - t_release) / 1e9;
  ::close(ready[0]);
  if (failed != 0) error = std::to_string(failed) + " of " + std::to_string(kids.size()) + " children failed";
  if (!error.empty()) throw std::runtime_error(error);
  std::sort(at.begin(), at.end());
  Json j;
  j.begin_object().key("bench").value("start").key("processes").value(static_cast<std::uint64_t>(o_.processes));
  j.key("bytes").value(static_cast<std::uint64_t>(o_.bytes.value()));
  j.key("ready_s").value(at.back()).key("first_s").value(at.front()).key("median_s").value(at[at.size() / 2]);
  j.key("teardown_s").value(teardown).key("failed").value(static_cast<std::uint64_t>(failed));
  j.key("value").value(at.back()).key("unit").value("s").key("label").value(o_.label).end_object();
  return j.str();
}

int start_main(int argc, char** argv) { return bench_main<StartBench>("vlake_bench_start", argc, argv); }

}  // namespace vlake::bench
