// The test suite's one way to run a child process: spawn a program with its arguments and
// environment (optionally as another uid/gid), feed its stdin, capture its stdout/stderr (pipes,
// a file, /dev/null or this process's), wait for it with a timeout, signal it, and reap it.
//
// Contract: a Process owns its child and the pipes to it; its destructor SIGKILLs a child still
// running and reaps it, so no test leaves a process behind. Descriptors of this process that are
// not close-on-exec are inherited (tests pass fds to children that way). Without a uid/gid the
// child is started with posix_spawn (no fork of a threaded test process); with one, fork + exec
// drops to it (setgroups(0), setgid, setuid; exit status 126 when that fails, 127 when exec
// fails). Errors of this process (pipe, spawn) throw std::system_error. Not thread-safe per
// object: one thread drives a Process.
#pragma once

#include <sys/types.h>

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace vlake::testsupport {

// An environment under construction: starts from this process's (or empty) and is edited by key.
class Env {
 public:
  static Env inherited();  // this process's environment
  Env& set(const std::string& key, const std::string& value);
  Env& set(const std::string& key_value);  // "KEY=value"
  Env& unset(const std::string& key);
  Env& unset_prefix(const std::string& prefix);  // every key starting with `prefix`
  // Sets each {key, value} in order; the value "\x01" unsets the key instead.
  Env& apply(const std::vector<std::pair<std::string, std::string>>& overrides);
  // Appends `suffix` to the variable, after `separator` when it already has a value.
  Env& append(const std::string& key, const std::string& suffix, const std::string& separator);
  [[nodiscard]] std::optional<std::string> get(const std::string& key) const;
  [[nodiscard]] std::vector<std::string> strings() const;  // "KEY=value", sorted by key

 private:
  std::map<std::string, std::string> vars_;
};

// Where one of the child's standard streams goes.
enum class Stream {
  inherit,  // this process's
  null,     // /dev/null
  pipe,     // a pipe this Process reads (stdout/stderr) or writes (stdin)
  merged,   // stderr only: the same destination as stdout
  file,     // a file, created if missing and appended to (Spawn::out_file / err_file)
};

struct Spawn {
  std::vector<std::string> argv;                // argv[0]: the program's path
  std::optional<std::vector<std::string>> env;  // "KEY=value"; unset: this process's environment
  Stream in = Stream::inherit;
  Stream out = Stream::pipe;
  Stream err = Stream::pipe;
  std::string out_file;
  std::string err_file;
  long uid = -1;  // >= 0 (root only): the child runs as this uid
  long gid = -1;  // >= 0 (root only): the child runs as this gid, without supplementary groups
};

// The exit code of a wait status: the code of a normal exit, 128 + signal of a killed child.
int exit_code(int wait_status);

class Process {
 public:
  explicit Process(const Spawn& spec);
  ~Process();  // SIGKILLs and reaps a child still running, closes the pipes
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  [[nodiscard]] pid_t pid() const noexcept { return pid_; }

  // Writes all of `data` to the child's stdin pipe; false when it fails (the child is gone).
  bool write(const std::string& data);
  void close_stdin();

  // Waits up to `timeout_ms` for output and appends what one read of each ready pipe gives.
  // Returns false once every output pipe reached end of file.
  bool pump(int timeout_ms);
  // Pumps until `done()` holds, the pipes close or `timeout_ms` passed; returns done().
  bool read_until(const std::function<bool()>& done, int timeout_ms);
  // Removes and returns the first complete line of stdout (without '\n'), waiting up to
  // `timeout_ms`; nullopt on timeout or when the child closed stdout first.
  std::optional<std::string> read_line(int timeout_ms);
  // Reads until end of file on every pipe or `timeout_ms`.
  void drain(int timeout_ms);
  [[nodiscard]] const std::string& out() const noexcept { return out_; }
  [[nodiscard]] const std::string& err() const noexcept { return err_; }
  // Whether an output pipe is still open (false once the child closed them all).
  [[nodiscard]] bool reading() const noexcept { return out_fd_ >= 0 || err_fd_ >= 0; }

  // The wait status once the child has exited (reaping it), nullopt while it runs.
  std::optional<int> poll_exit();
  // Waits up to `timeout_ms` for the exit (reading the pipes meanwhile so the child never
  // blocks on a full one); returns the wait status, or -1 on timeout (the child still runs).
  int wait(int timeout_ms);
  // The wait status, once reaped.
  [[nodiscard]] std::optional<int> status() const noexcept { return status_; }
  void signal(int sig);
  // SIGKILL and reap (no-op once reaped); returns the wait status.
  int kill();

 private:
  pid_t pid_ = -1;
  std::optional<int> status_;
  int in_ = -1;
  int out_fd_ = -1;
  int err_fd_ = -1;
  std::string out_;
  std::string err_;
};

// A program run to completion.
struct Result {
  int status = -1;         // wait status (of the SIGKILL when it timed out)
  bool timed_out = false;  // killed after `timeout_ms`
  std::string out;
  std::string err;
  [[nodiscard]] int code() const { return exit_code(status); }
};

// Spawns, reads stdout/stderr to the end, waits; kills the child after `timeout_ms`.
Result run(const Spawn& spec, int timeout_ms);

// The directory part of a path ("/a/b/c.so" -> "/a/b").
std::string dir_of(const std::string& path);

// Key=value words of a line ("ok a=1 b=2" -> {a:1, b:2}); words without '=' are skipped.
std::map<std::string, std::string> key_values(const std::string& line);

// The first line of `text` starting with `prefix` (without '\n'), or "" when there is none.
std::string line_starting(const std::string& text, const std::string& prefix);

// A fresh directory under /tmp ("<prefix>XXXXXX"), removed with everything in it on destruction.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "vlake-test-", unsigned mode = 0700);
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  [[nodiscard]] const std::string& path() const noexcept { return path_; }

 private:
  std::string path_;
};

// Removes `path` and everything below it (no error when absent).
void remove_tree(const std::string& path);
// The whole content of a file ("" when it cannot be read).
std::string read_file(const std::string& path);

}  // namespace vlake::testsupport
