// FdHolder: a child process that holds one open file description of this process (inherited
// across fork(), so it is the same description) and nothing else of it, until end() kills and
// reaps it. For tests of the holder scan and of retired handles kept alive by another process.
// Not thread-safe; end() and the destructor never throw.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <stdexcept>

namespace vlake::pooltest {

class FdHolder {
 public:
  explicit FdHolder(int fd) {
    int p[2];
    if (::pipe(p) != 0) throw std::runtime_error("pipe failed");
    pid_ = ::fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      // Only `fd` (and the ready pipe) stay open in the child.
      for (int i = 3; i < 65536; ++i) {
        if (i != fd && i != p[1]) ::close(i);
      }
      const char c = 'r';
      if (::write(p[1], &c, 1) != 1) ::_exit(1);
      ::close(p[1]);
      for (;;) ::pause();
    }
    ::close(p[1]);
    char c = 0;
    const bool ready = ::read(p[0], &c, 1) == 1;
    ::close(p[0]);
    if (!ready) {
      end();
      throw std::runtime_error("holder child did not start");
    }
  }
  FdHolder(const FdHolder&) = delete;
  FdHolder& operator=(const FdHolder&) = delete;
  ~FdHolder() { end(); }
  [[nodiscard]] pid_t pid() const noexcept { return pid_; }
  void end() noexcept {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
};

}  // namespace vlake::pooltest
