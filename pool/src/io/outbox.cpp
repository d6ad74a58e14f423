#include "vlake/pool/outbox.hpp"

#include <fcntl.h>

#include <cerrno>
#include <system_error>

namespace vlake::pool {

Outbox::Result Outbox::send(std::span<const std::byte> bytes, std::span<const int> fds, std::uint64_t grant,
                            const SendFn& send) {
  if (queue_.empty() && send(bytes, fds)) return Result::sent;
  if (queue_.size() >= kMaxMessages || bytes_ + bytes.size() > kMaxBytes) return Result::overflow;
  Message m;
  m.bytes.assign(bytes.begin(), bytes.end());
  m.grant = grant;
  for (const int fd : fds) {
    UniqueFd dup(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
    if (!dup) throw std::system_error(errno, std::generic_category(), "fcntl(F_DUPFD_CLOEXEC)");
    m.fds.push_back(std::move(dup));
  }
  bytes_ += m.bytes.size();
  queue_.push_back(std::move(m));
  return Result::queued;
}

bool Outbox::flush(const SendFn& send) {
  std::vector<int> raw;
  while (!queue_.empty()) {
    const Message& m = queue_.front();
    raw.clear();
    for (const UniqueFd& fd : m.fds) raw.push_back(fd.get());
    if (!send(m.bytes, raw)) return false;
    bytes_ -= m.bytes.size();
    queue_.pop_front();
  }
  return true;
}

std::vector<std::uint64_t> Outbox::grants() const {
  std::vector<std::uint64_t> out;
  for (const Message& m : queue_) {
    if (m.grant != 0) out.push_back(m.grant);
  }
  return out;
}

}  // namespace vlake::pool
