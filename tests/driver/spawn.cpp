#include <fcntl.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "support.hpp"
#include "vlake/common/unix_socket.hpp"

namespace vlake::test {

int Child::wait() {
  const int status = process->wait(5 * 60 * 1000);
  if (status < 0) throw std::runtime_error("the child helper did not exit within 5 minutes");
  pid = -1;
  return status;
}

Child spawn_child(const std::vector<std::string>& args) {
  SocketPair pair = make_socket_pair(/*inheritable=*/false);
  // Only the child's end crosses exec.
  const int flags = ::fcntl(pair.second.get(), F_GETFD);
  ::fcntl(pair.second.get(), F_SETFD, flags & ~FD_CLOEXEC);

  testsupport::Spawn spec;
  spec.argv = {VLAKE_DRIVER_CHILD_PATH, std::to_string(pair.second.get())};
  spec.argv.insert(spec.argv.end(), args.begin(), args.end());
  spec.out = testsupport::Stream::inherit;
  spec.err = testsupport::Stream::inherit;
  auto process = std::make_unique<testsupport::Process>(spec);
  const int pid = process->pid();
  return Child{pid, std::move(pair.first), std::move(process)};
}

}  // namespace vlake::test
