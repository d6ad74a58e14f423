#include "vlake/pool/features/swap/swap_book.hpp"

#include <algorithm>

namespace vlake::pool {

const char* to_string(SwapState s) noexcept {
  switch (s) {
    case SwapState::none: return "on the GPU";
    case SwapState::notified: return "asked to get ready";
    case SwapState::checkpointing: return "being checkpointed";
    case SwapState::swapped: return "on the host";
    case SwapState::restoring: return "being restored";
    case SwapState::lost: return "lost (restore failed)";
  }
  return "?";
}

SwapRecord SwapBook::get(std::uint64_t session) const {
  auto it = records_.find(session);
  return it == records_.end() ? SwapRecord{} : it->second;
}

Bytes SwapBook::swapping_out(DeviceOrdinal d) const {
  Bytes out{0};
  for (const auto& [id, r] : records_) {
    if (r.going_out() && r.device == d) out += r.bytes;
  }
  return out;
}

Bytes SwapBook::restoring(DeviceOrdinal d) const {
  Bytes in{0};
  for (const auto& [id, r] : records_) {
    if (r.state == SwapState::restoring && r.device == d) in += r.extra;
  }
  return in;
}

Bytes SwapBook::on_host(DeviceOrdinal d) const {
  Bytes host{0};
  for (const auto& [id, r] : records_) {
    if (r.on_host() && r.device == d) host += r.bytes;
  }
  return host;
}

std::vector<std::uint64_t> SwapBook::swapping_for(std::uint64_t session) const {
  std::vector<std::uint64_t> out;
  for (const auto& [id, r] : records_) {
    if (r.for_session == session && r.going_out()) out.push_back(id);
  }
  std::sort(out.begin(), out.end());
  return out;
}

void SwapBook::note_counted(DeviceOrdinal d, Time now, Bytes bytes) {
  recent_.at(static_cast<std::size_t>(d.value())).emplace_back(now, bytes);
}

Bytes SwapBook::recent_counted(DeviceOrdinal d, Time now) {
  auto& recent = recent_.at(static_cast<std::size_t>(d.value()));
  std::erase_if(recent, [&](const auto& r) { return now - r.first > kRecentGrant; });
  Bytes taken{0};
  for (const auto& r : recent) taken += r.second;
  return taken;
}

}  // namespace vlake::pool
