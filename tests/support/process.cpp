#include "process.hpp"

#include <fcntl.h>
#include <ftw.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <system_error>
#include <thread>

extern char** environ;

namespace vlake::testsupport {

namespace {

using Clock = std::chrono::steady_clock;

int ms_left(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left > 0 ? static_cast<int>(left) : 0;
}

[[noreturn]] void fail(const std::string& what, int err = errno) {
  throw std::system_error(err, std::generic_category(), what);
}

// A descriptor closed on scope exit unless released.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  int release() {
    const int f = fd;
    fd = -1;
    return f;
  }
};

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

// Opens the parent's side of one stream: for a pipe, `ours` gets the parent's end and `theirs`
// the child's; for /dev/null or a file, `theirs` the opened file. All close-on-exec.
void open_stream(Stream s, const std::string& file, bool input, Fd& ours, Fd& theirs) {
  switch (s) {
    case Stream::pipe: {
      int p[2];
      if (::pipe2(p, O_CLOEXEC) != 0) fail("pipe2");
      ours.fd = input ? p[1] : p[0];
      theirs.fd = input ? p[0] : p[1];
      return;
    }
    case Stream::null:
      theirs.fd = ::open("/dev/null", (input ? O_RDONLY : O_WRONLY) | O_CLOEXEC);
      if (theirs.fd < 0) fail("open /dev/null");
      return;
    case Stream::file:
      theirs.fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
      if (theirs.fd < 0) fail("open " + file);
      return;
    case Stream::inherit:
    case Stream::merged: return;
  }
}

}  // namespace

Env Env::inherited() {
  Env e;
  for (char** p = environ; *p != nullptr; ++p) e.set(*p);
  return e;
}

Env& Env::set(const std::string& key, const std::string& value) {
  vars_[key] = value;
  return *this;
}

Env& Env::set(const std::string& key_value) {
  const auto eq = key_value.find('=');
  if (eq != std::string::npos) vars_[key_value.substr(0, eq)] = key_value.substr(eq + 1);
  return *this;
}

Env& Env::unset(const std::string& key) {
  vars_.erase(key);
  return *this;
}

Env& Env::unset_prefix(const std::string& prefix) {
  for (auto it = vars_.lower_bound(prefix); it != vars_.end() && it->first.rfind(prefix, 0) == 0;) {
    it = vars_.erase(it);
  }
  return *this;
}

Env& Env::apply(const std::vector<std::pair<std::string, std::string>>& overrides) {
  for (const auto& [k, v] : overrides) {
    if (v == "\x01") {
      vars_.erase(k);
    } else {
      vars_[k] = v;
    }
  }
  return *this;
}

Env& Env::append(const std::string& key, const std::string& suffix, const std::string& separator) {
  std::string& v = vars_[key];
  v += v.empty() ? suffix : separator + suffix;
  return *this;
}

std::optional<std::string> Env::get(const std::string& key) const {
  const auto it = vars_.find(key);
  if (it == vars_.end()) return std::nullopt;
  return it->second;
}

std::vector<std::string> Env::strings() const {
  std::vector<std::string> out;
  out.reserve(vars_.size());
  for (const auto& [k, v] : vars_) out.push_back(k + "=" + v);
  return out;
}

int exit_code(int wait_status) {
  return WIFSIGNALED(wait_status) ? 128 + WTERMSIG(wait_status) : WEXITSTATUS(wait_status);
}

Process::Process(const Spawn& spec) {
  if (spec.argv.empty()) throw std::invalid_argument("Process: empty argv");
  std::vector<std::string> args = spec.argv;
  std::vector<std::string> env;
  if (spec.env) {
    env = *spec.env;
  } else {
    for (char** p = environ; *p != nullptr; ++p) env.emplace_back(*p);
  }
  std::vector<char*> argv;
  for (auto& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (auto& s : env) envp.push_back(s.data());
  envp.push_back(nullptr);

  Fd in_ours, in_theirs, out_ours, out_theirs, err_ours, err_theirs;
  open_stream(spec.in, {}, true, in_ours, in_theirs);
  open_stream(spec.out, spec.out_file, false, out_ours, out_theirs);
  if (spec.err != Stream::merged) open_stream(spec.err, spec.err_file, false, err_ours, err_theirs);
  // The child's standard descriptors: {source, target}; -1 leaves the target as inherited.
  const int err_source = spec.err == Stream::merged ? out_theirs.fd : err_theirs.fd;
  const int dups[3][2] = {{in_theirs.fd, 0}, {out_theirs.fd, 1}, {err_source, 2}};

  if (spec.uid < 0 && spec.gid < 0) {
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    for (const auto& d : dups) {
      if (d[0] >= 0) posix_spawn_file_actions_adddup2(&fa, d[0], d[1]);
    }
    const int rc = ::posix_spawn(&pid_, argv[0], &fa, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) fail("posix_spawn " + args[0], rc);
  } else {
    pid_ = ::fork();
    if (pid_ < 0) fail("fork");
    if (pid_ == 0) {  // async-signal-safe calls only from here on
      for (const auto& d : dups) {
        if (d[0] >= 0 && ::dup2(d[0], d[1]) < 0) ::_exit(126);
      }
      if (::setgroups(0, nullptr) != 0) ::_exit(126);
      if (spec.gid >= 0 && ::setgid(static_cast<gid_t>(spec.gid)) != 0) ::_exit(126);
      if (spec.uid >= 0 && ::setuid(static_cast<uid_t>(spec.uid)) != 0) ::_exit(126);
      ::execve(argv[0], argv.data(), envp.data());
      ::_exit(127);
    }
  }
  in_ = in_ours.release();
  out_fd_ = out_ours.release();
  err_fd_ = err_ours.release();
}

Process::~Process() {
  kill();
  close_fd(in_);
  close_fd(out_fd_);
  close_fd(err_fd_);
}

bool Process::write(const std::string& data) {
  std::size_t done = 0;
  while (in_ >= 0 && done < data.size()) {
    const ssize_t n = ::write(in_, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<std::size_t>(n);
  }
  return in_ >= 0;
}

void Process::close_stdin() { close_fd(in_); }

bool Process::pump(int timeout_ms) {
  pollfd fds[2] = {{out_fd_, POLLIN, 0}, {err_fd_, POLLIN, 0}};
  if (out_fd_ < 0 && err_fd_ < 0) return false;
  if (::poll(fds, 2, timeout_ms) <= 0) return true;
  char buf[4096];
  for (int i = 0; i < 2; ++i) {
    if (fds[i].fd < 0 || fds[i].revents == 0) continue;
    const ssize_t n = ::read(fds[i].fd, buf, sizeof buf);
    if (n > 0) {
      (i == 0 ? out_ : err_).append(buf, static_cast<std::size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      close_fd(i == 0 ? out_fd_ : err_fd_);
    }
  }
  return out_fd_ >= 0 || err_fd_ >= 0;
}

bool Process::read_until(const std::function<bool()>& done, int timeout_ms) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  while (!done()) {
    const int left = ms_left(deadline);
    if (left <= 0 || !pump(left)) return done();
  }
  return true;
}

std::optional<std::string> Process::read_line(int timeout_ms) {
  if (!read_until([this] { return out_.find('\n') != std::string::npos; }, timeout_ms)) return std::nullopt;
  const auto nl = out_.find('\n');
  std::string line = out_.substr(0, nl);
  out_.erase(0, nl + 1);
  return line;
}

void Process::drain(int timeout_ms) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  while (pump(ms_left(deadline)) && ms_left(deadline) > 0) {
  }
}

std::optional<int> Process::poll_exit() {
  if (status_ || pid_ <= 0) return status_;
  int st = 0;
  pid_t r;
  while ((r = ::waitpid(pid_, &st, WNOHANG)) < 0 && errno == EINTR) {
  }
  if (r == pid_) status_ = st;
  return status_;
}

int Process::wait(int timeout_ms) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  while (!poll_exit()) {
    const int left = ms_left(deadline);
    if (left <= 0) return -1;
    // Keep the pipes flowing; sleep when there are none to wait on.
    if (!pump(std::min(left, 5))) std::this_thread::sleep_for(std::chrono::milliseconds(std::min(left, 5)));
  }
  return *status_;
}

void Process::signal(int sig) {
  if (pid_ > 0 && !poll_exit()) ::kill(pid_, sig);
}

int Process::kill() {
  if (pid_ <= 0) return -1;
  if (!poll_exit()) {
    ::kill(pid_, SIGKILL);
    int st = 0;
    while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
    }
    status_ = st;
  }
  return *status_;
}

Result run(const Spawn& spec, int timeout_ms) {
  Process p(spec);
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  Result r;
  while (ms_left(deadline) > 0 && p.pump(ms_left(deadline))) {
  }
  r.status = p.wait(ms_left(deadline));
  if (r.status < 0) {
    r.timed_out = true;
    r.status = p.kill();
  }
  r.out = p.out();
  r.err = p.err();
  return r;
}

std::string dir_of(const std::string& path) { return path.substr(0, path.rfind('/')); }

std::map<std::string, std::string> key_values(const std::string& line) {
  std::map<std::string, std::string> kv;
  std::istringstream in(line);
  std::string word;
  while (in >> word) {
    const auto eq = word.find('=');
    if (eq != std::string::npos) kv[word.substr(0, eq)] = word.substr(eq + 1);
  }
  return kv;
}

std::string line_starting(const std::string& text, const std::string& prefix) {
  std::istringstream in(text);
  std::string l;
  while (std::getline(in, l)) {
    if (l.rfind(prefix, 0) == 0) return l;
  }
  return {};
}

namespace {
int rm_entry(const char* path, const struct stat*, int, FTW*) { return ::remove(path); }
}  // namespace

void remove_tree(const std::string& path) {
  if (!path.empty()) ::nftw(path.c_str(), rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

TempDir::TempDir(const std::string& prefix, unsigned mode) {
  std::string tmpl = "/tmp/" + prefix + "XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) fail("mkdtemp " + tmpl);
  path_ = tmpl;
  ::chmod(path_.c_str(), static_cast<mode_t>(mode));
}

TempDir::~TempDir() { remove_tree(path_); }

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace vlake::testsupport
