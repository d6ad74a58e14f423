#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>

#include <cerrno>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include "support.hpp"
#include "vlake/common/unix_socket.hpp"

extern char** environ;

namespace vlake::test {

int Child::wait() {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) throw std::system_error(errno, std::generic_category(), "waitpid");
  }
  pid = -1;
  return status;
}

Child spawn_child(const std::vector<std::string>& args) {
  SocketPair pair = make_socket_pair(/*inheritable=*/false);
  // Only the child's end crosses exec.
  const int flags = ::fcntl(pair.second.get(), F_GETFD);
  ::fcntl(pair.second.get(), F_SETFD, flags & ~FD_CLOEXEC);

  std::vector<std::string> argv_s{VLAKE_DRIVER_CHILD_PATH, std::to_string(pair.second.get())};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& s : argv_s) argv.push_back(s.data());
  argv.push_back(nullptr);

  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, VLAKE_DRIVER_CHILD_PATH, nullptr, nullptr, argv.data(), environ);
  if (rc != 0) throw std::system_error(rc, std::generic_category(), "posix_spawn child helper");
  return Child{pid, std::move(pair.first)};
}

}  // namespace vlake::test
