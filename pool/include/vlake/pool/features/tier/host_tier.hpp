// vlake::pool::HostTier — the host tier (docs/swap.md, "Host tier"): pinned host memory, made
// ahead as VMM handles located on the host, that whole alloc grants of idle processes move to
// (demote) and come back from (promote) at the same addresses while their processes run on.
//
// What it does
//   Keeps the stock of host pieces made ahead (HostPiece: a handle, its one export, its size)
//   up to the configured bound, the grants now on the host with their pieces, and the moves
//   under way, one per session. It decides, without a clock or a driver of its own:
//   - pieces_for(bytes): how a grant is cut into pieces: whole `piece` sizes, then the rest as
//     distinct powers of two of the granularity (largest first), so that one grant needs at
//     most one piece of each smaller size;
//   - to_build(): the pieces to have made now (the loop's builder makes them off the loop):
//     `kSmallEach` of every smaller size, then whole pieces, never past the bound counting the
//     stock, the pieces being built and those grants hold;
//   - take(size): a piece from the stock (nullopt: none of that size: the caller makes one);
//   - make_room(size): with the bound reached, releases unused stock, largest pieces first,
//     until a piece of `size` fits (a stock of whole pieces must not keep small grants out).
//   The Node picks what to move (plan_swap's rules), runs the protocol and owns the device
//   handles; this room holds the host side and the moves' state.
// Ownership: owns the pieces in its stock, on the host and in moves (their handles are released
//   by the caller through the driver: take_released() hands over pieces to release).
// Errors: none. Thread-safety: none; the event loop's thread (through the Node).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "vlake/common/driver.hpp"
#include "vlake/common/strong_types.hpp"
#include "vlake/common/unique_fd.hpp"
#include "vlake/contracts/protocol.hpp"
#include "vlake/contracts/state.hpp"
#include "vlake/pool/device_pool.hpp"

namespace vlake::pool {

struct HostPiece {
  PhysicalHandle handle{};
  UniqueFd fd;  // its one export (sent with every TierPlan naming it)
  Bytes size{0};
};

// A grant whose memory is on the host.
struct HostGrant {
  std::uint64_t session = 0;
  TenantId tenant{};
  DeviceOrdinal device{0};
  Bytes bytes{0};
  std::vector<HostPiece> pieces;  // in VA order
  std::chrono::steady_clock::time_point since{};
};

enum class MoveState : std::uint8_t {
  notified,  // TierNotice sent; waiting for the process's first TierStep
  running,   // the process is stopped and moves grants one by one
};

// One session's move (a TierNotice and the steps that follow).
struct TierMove {
  std::uint64_t id = 0;
  std::uint64_t session = 0;
  proto::TierDirection direction = proto::TierDirection::to_host;
  DeviceOrdinal device{0};
  MoveState state = MoveState::notified;
  std::deque<std::uint64_t> grants;  // still to move, in order
  std::uint64_t current = 0;         // the grant the process is moving now (0: none)
  // The current grant's new memory until the process says moved: host pieces (to_host) or pool
  // handles (to_device).
  std::vector<HostPiece> host;
  std::vector<std::unique_ptr<PoolHandle>> device_handles;
  std::uint64_t for_session = 0;  // demote: the session it makes room for (0: none)
  Bytes bytes{0};                 // all its grants
  Bytes moved{0};                 // of them, moved so far
  std::uint32_t grants_moved = 0;
  std::chrono::steady_clock::time_point since{};
  std::chrono::steady_clock::time_point step_at{};  // its last TierStep (or the notice)
};

class HostTier {
 public:
  using Time = std::chrono::steady_clock::time_point;
  static constexpr std::uint32_t kSmallEach = 2;
  // A notified process that does not step within kReadyTimeout, or a moving one that says
  // nothing for kStepTimeout, ends its move (what was moved stays moved); a failed build pauses
  // the stock's builds for kBuildPause.
  static constexpr std::chrono::milliseconds kReadyTimeout{5000};
  static constexpr std::chrono::milliseconds kStepTimeout{10000};
  static constexpr std::chrono::milliseconds kBuildPause{5000};

  // bound 0: off. piece: the whole-piece size (a multiple of granularity, at least one).
  HostTier(Bytes bound, Bytes piece, Bytes granularity);

  [[nodiscard]] bool enabled() const noexcept { return bound_.value() > 0; }
  [[nodiscard]] Bytes bound() const noexcept { return bound_; }
  [[nodiscard]] Bytes piece() const noexcept { return piece_; }
  [[nodiscard]] std::vector<Bytes> pieces_for(Bytes bytes) const;

  // ---- stock
  [[nodiscard]] std::vector<Bytes> to_build(Time now);
  void built(HostPiece p);                           // a piece to_build() asked for is made
  void build_failed(Bytes size, Time now) noexcept;  // ... could not be made: builds pause
  std::optional<HostPiece> take(Bytes size);
  // A piece made on the spot (none in stock) now in use: counted against the bound.
  void note_made(Bytes size) noexcept { used_ += size; }
  [[nodiscard]] bool fits(Bytes size) const noexcept { return stock_bytes_ + building_bytes_ + used_ + size <= bound_; }
  // Releases stock pieces (largest first, to take_released()) until `size` fits; false if it
  // still does not (the bound is held by grants, moves and builds).
  bool make_room(Bytes size);
  // Pieces no longer used (a promoted or released grant, a move called off): released by the
  // caller (off the loop: unpinning takes time).
  void release(std::vector<HostPiece> pieces);
  [[nodiscard]] std::vector<HostPiece> take_released() { return std::exchange(released_, {}); }
  [[nodiscard]] Bytes stock_bytes() const noexcept { return stock_bytes_; }
  [[nodiscard]] Bytes used_bytes() const noexcept { return used_; }
  [[nodiscard]] Bytes building_bytes() const noexcept { return building_bytes_; }

  // ---- grants on the host
  void put(std::uint64_t grant, HostGrant g);
  [[nodiscard]] const HostGrant* find(std::uint64_t grant) const;
  // The grant leaves the host tier (promoted: `keep` its pieces for the caller; released: they go
  // to release()).
  std::optional<HostGrant> take_grant(std::uint64_t grant);
  [[nodiscard]] const std::unordered_map<std::uint64_t, HostGrant>& grants() const noexcept { return grants_; }
  [[nodiscard]] Bytes host_bytes(DeviceOrdinal d) const;
  [[nodiscard]] Bytes session_bytes(std::uint64_t session) const;

  // ---- moves
  [[nodiscard]] TierMove* move_of(std::uint64_t session);
  [[nodiscard]] const TierMove* move_of(std::uint64_t session) const;
  TierMove& start(std::uint64_t session, proto::TierDirection dir, DeviceOrdinal d, Time now);
  // The move is over: returns it (its unmoved new memory for the caller to put back).
  std::optional<TierMove> finish(std::uint64_t session);
  // Where grant `grant` is (state::GrantLocation: on the GPU, on the host, moving).
  [[nodiscard]] std::uint32_t location(std::uint64_t grant) const;
  [[nodiscard]] const std::unordered_map<std::uint64_t, TierMove>& moves() const noexcept { return moves_; }
  // Bytes of `d`'s demotes under way (room that is coming).
  [[nodiscard]] Bytes demoting(DeviceOrdinal d) const;
  [[nodiscard]] bool moving(std::uint64_t grant) const;

 private:
  Bytes bound_;
  Bytes piece_;
  Bytes gran_;
  std::map<std::uint64_t, std::vector<HostPiece>> stock_;  // by size
  std::map<std::uint64_t, std::uint32_t> building_;        // by size: pieces being made
  Bytes stock_bytes_{0};
  Bytes building_bytes_{0};
  Bytes used_{0};  // pieces held by grants on the host and by moves
  std::vector<HostPiece> released_;
  std::unordered_map<std::uint64_t, HostGrant> grants_;  // by grant id
  std::unordered_map<std::uint64_t, TierMove> moves_;    // by session id
  std::uint64_t next_move_ = 1;
  Time paused_until_{};
};

}  // namespace vlake::pool
