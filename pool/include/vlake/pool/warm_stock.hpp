// vlake::pool::WarmStock — what the clean handles kept ready on one GPU should be (docs/pool.md,
// "Warm reserve and warm stock").
//
// Two budgets of clean handles (created, exported, mapped and zeroed before any grant asks):
//   - the warm reserve (`--warm-reserve`, static): small handles (the granularity G) up to
//     min(reserve / 8, 32 MiB), then bulk handles, then G handles for the rest;
//   - the warm stock (`--warm-stock`, demand-driven): the exact sizes that recent grants needed
//     a new handle for, or took from the stock, in proportion to how often each was asked for.
//     A grant of such a size then finds a clean handle of exactly its size: no cuMemCreate, no
//     export, no scrub on its path.
//
// Contract
// - Plain decision class: no driver, no clock of its own, no threads. The Node records demand
//   (note()) and asks plan() what to build and what to release; the building happens elsewhere
//   (handle_builder.hpp: on a worker thread in vlaked, inline in tests).
// - Demand: note(size, now) adds 1 to the size's score; scores halve every half_life. A size
//   whose score fell under 0.5 is forgotten; at most kMaxSizes sizes are tracked (a new size
//   replaces the lowest score).
// - want(now): the stock's wish per size: for each tracked size of at most stock / 4 whose score
//   is at least kMinScore (asked for twice recently: a size seen once, as with random sizes, is
//   not worth a build), by score (highest first, then smaller sizes first), ceil(score / 2)
//   handles clamped to [1, kMaxPerSize], as many as the stock budget holds; plus the warm
//   reserve's composition.
// - plan(view, now, max_make): `make`: sizes whose on-hand + in-flight count is under want,
//   round-robin over sizes in the order above (every wanted size gets one before any gets two),
//   at most max_make; `release`: handles on hand beyond want, largest unwanted first, only as
//   many as it takes to bring on hand + in flight + make within the two budgets (nothing churns
//   while the budgets have room). wanted_bytes(): what want() adds up to (the idle release
//   keeps that much clean memory).
// - Thread-safety: none (the Node's thread).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <vector>

#include "vlake/common/strong_types.hpp"

namespace vlake::pool {

class WarmStock {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr std::size_t kMaxSizes = 32;
  static constexpr std::uint32_t kMaxPerSize = 16;
  static constexpr double kMinScore = 1.5;

  // reserve: --warm-reserve; stock: --warm-stock (both per GPU, bytes); granularity and bulk:
  // the pool's size classes.
  WarmStock(Bytes reserve, Bytes stock, Bytes granularity, Bytes bulk,
            std::chrono::milliseconds half_life = std::chrono::seconds(10)) noexcept;

  void note(Bytes size, Clock::time_point now);

  // Clean, unbound, free handles by size (bytes -> count).
  using Counts = std::map<std::uint64_t, std::uint32_t>;
  struct View {
    Counts on_hand;
    Counts in_flight;
  };
  struct Plan {
    std::vector<Bytes> make;
    std::vector<Bytes> release;
  };
  [[nodiscard]] Plan plan(const View& view, Clock::time_point now, std::size_t max_make) const;
  [[nodiscard]] Counts want(Clock::time_point now) const;
  [[nodiscard]] Bytes wanted_bytes(Clock::time_point now) const { return bytes(want(now)); }
  // What `c` adds up to.
  [[nodiscard]] static Bytes bytes(const Counts& c) noexcept;

  [[nodiscard]] Bytes reserve() const noexcept { return reserve_; }
  [[nodiscard]] Bytes stock() const noexcept { return stock_; }
  [[nodiscard]] Bytes budget() const noexcept { return reserve_ + stock_; }
  // The decayed score of `size` at `now` (0: not tracked).
  [[nodiscard]] double score(Bytes size, Clock::time_point now) const;

 private:
  struct Demand {
    double score = 0;
    Clock::time_point at{};
  };
  [[nodiscard]] double decayed(const Demand& d, Clock::time_point now) const;
  // Sizes in plan order with their wanted counts (the round-robin order of make).
  [[nodiscard]] std::vector<std::pair<std::uint64_t, std::uint32_t>> ordered_want(Clock::time_point now) const;

  Bytes reserve_;
  Bytes stock_;
  Bytes granularity_;
  Bytes bulk_;
  std::chrono::milliseconds half_life_;
  std::map<std::uint64_t, Demand> demand_;
};

}  // namespace vlake::pool
