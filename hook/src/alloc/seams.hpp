// ProcessSeams: the allocation policy's seams (policy.hpp) over the hook's process state: the
// daemon connection, the driver and the process's books, and the logged reports.
//
// Contract: one per process, created with the state and never destroyed; thread-safe as the
// state is (hook.hpp).
#pragma once

#include <chrono>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "alloc/internal.hpp"
#include "alloc/policy.hpp"
#include "gate.hpp"
#include "log.hpp"
#include "profile.hpp"

namespace vlake::hook::alloc {

using proto::GrantPurpose;
using proto::Status;

class ProcessSeams final : public Daemon, public Driver, public Reports {
 public:
  explicit ProcessSeams(State& s) noexcept : s_(s) {}

  Answer grant(const Uuid& gpu, Bytes bytes, GrantPurpose purpose, std::uint32_t flags) override {
    std::optional<GrantResult> g;
    {
      PhaseTimer t(Phase::grant);
      // vlaked may park the request for minutes; meanwhile this thread is outside the host
      // tier's gate (it holds nothing a move touches), so a move of this process can run, and
      // it stops at the gate when the answer comes, before it maps anything.
      const tier::WaitOutside outside;
      g = s_.client.grant(gpu, bytes.value(), purpose, flags);
    }
    // The worker reports activity (vlakectl's IDLE column) and, under overcommit (docs/swap.md),
    // reads vlaked's SwapNotices.
    if (s_.client.answered()) ensure_worker(s_);
    Answer a;
    if (!g) {
      a.kind = s_.client.refused() ? Answer::Kind::refused : Answer::Kind::unreachable;
      a.why = s_.client.last_error();
      return a;
    }
    a.kind = Answer::Kind::reply;
    a.result = std::move(*g);
    if (a.result.status == Status::ok) {
      a.granularity = s_.client.granularity();
      a.guard = s_.client.guard_mode();
    }
    return a;
  }
  void release(std::uint64_t grant_id, std::uint32_t flags) override { give_back(s_, grant_id, flags); }
  void drop_kept(DeviceOrdinal device) override { hook::drop_kept(s_, device.value()); }
  bool overcommit() override { return s_.client.overcommit(); }

  CUresult device_uuid(DeviceOrdinal device, Uuid& out) override { return hook::device_uuid(s_, device.value(), out); }
  CUresult map(GrantResult& g, DeviceOrdinal device, CUcontext ctx, Bytes requested, CUdeviceptr* dptr) override {
    return map_grant(s_, g, device.value(), ctx, requested.value(), dptr);
  }
  void place(LogicalAlloc a, bool guard, CUcontext ctx, Bytes requested, CUdeviceptr* dptr) override {
    hook::place(s_, std::move(a), guard, ctx, requested.value(), dptr);
  }
  void retire(std::vector<ReserveBlock>& blocks) override { retire_blocks(s_, blocks); }
  void record_counted(CUdeviceptr ptr, std::uint64_t grant_id) override { s_.managed.insert(addr(ptr), grant_id); }
  std::uint64_t frees_queued() override { return s_.frees_queued.load(std::memory_order_acquire); }
  std::uint64_t frees_completed() override { return s_.frees_completed.load(std::memory_order_acquire); }
  void settle_frees(bool outstanding) override { hook::settle_frees(s_, outstanding); }
  void prefetch_hit(DeviceOrdinal device, Bytes size, CUcontext ctx) override {
    if (s_.prefetch.hit(device.value(), size.value(), ctx, std::chrono::steady_clock::now())) kick_prefetch(s_);
  }
  void prefetch_miss(DeviceOrdinal device, Bytes size, CUcontext ctx) override {
    if (s_.prefetch.miss(device.value(), size.value(), ctx, std::chrono::steady_clock::now())) kick_prefetch(s_);
  }

  void refusal(const GrantResult& g, DeviceOrdinal device, Bytes requested) override {
    report_refusal(s_, g, device.value(), requested.value());
  }
  void limit_refusal(const std::string& why, DeviceOrdinal device, Bytes requested) override {
    std::uint64_t suppressed = 0;
    if (s_.refusals.allow(suppressed)) {
      log(LogLevel::error, "%s; request of %s on GPU %d refused%s", why.c_str(),
          format_bytes(requested.value()).c_str(), device.value(), suppressed_note(suppressed).c_str());
    }
  }
  void unreachable(const std::string& why, DeviceOrdinal device, Bytes requested) override {
    std::uint64_t suppressed = 0;
    if (s_.unreachable.allow(suppressed)) {
      log(LogLevel::error,
          "cannot reach vlaked at %s (%s); request of %s on GPU %d refused. Start the daemon "
          "(e.g. systemctl start vlaked) or point VLAKE_SOCKET at its socket; "
          "VLAKE_ON_UNREACHABLE=passthrough runs without accounting%s",
          s_.client.socket_path().c_str(), why.c_str(), format_bytes(requested.value()).c_str(), device.value(),
          suppressed_note(suppressed).c_str());
    }
  }
  void passthrough(const std::string& why) override {
    if (!s_.passthrough_warned.exchange(true)) {
      log(LogLevel::warn,
          "cannot reach vlaked at %s (%s); VLAKE_ON_UNREACHABLE=passthrough: allocating "
          "directly from the driver, without accounting",
          s_.client.socket_path().c_str(), why.c_str());
    }
  }
  void map_failed(DeviceOrdinal device, Bytes granted, CUresult rc) override {
    std::uint64_t suppressed = 0;
    if (s_.refusals.allow(suppressed)) {
      log(LogLevel::warn, "GPU %d: mapping a grant of %llu bytes failed (CUresult %d)%s", device.value(),
          static_cast<unsigned long long>(granted.value()), static_cast<int>(rc),
          suppressed > 0 ? " (similar messages suppressed)" : "");
    }
  }

 private:
  State& s_;
};

}  // namespace vlake::hook::alloc
