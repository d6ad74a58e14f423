// vlake::ctl::StateSource — opens vlaked's state segment read-only for vlakectl and turns every
// way that can fail into an operator-facing message.
//
// Contract: the constructor checks /dev/shm/<name> itself (exists, readable, magic, layout
// version, size) before mapping it with state::StateReader, so each failure has its own
// StateAccessError::Kind and a message that says what to do (no "vlakectl: " prefix: the caller
// adds it). snapshot() returns a consistent copy; it is const and may be called from several
// threads. The object owns its read-only mapping until destroyed. process_alive() checks that the recorded daemon pid
// exists and (where /proc is readable) has the recorded start time.
#pragma once

#include <memory>
#include <stdexcept>
#include <string>

#include "vlake/contracts/state.hpp"

namespace vlake::ctl {

class StateAccessError : public std::runtime_error {
 public:
  enum class Kind { missing, permission, layout, other };
  StateAccessError(Kind k, const std::string& what) : std::runtime_error(what), kind_(k) {}
  [[nodiscard]] Kind kind() const noexcept { return kind_; }

 private:
  Kind kind_;
};

class StateSource {
 public:
  explicit StateSource(const std::string& name);  // throws StateAccessError
  ~StateSource();
  StateSource(const StateSource&) = delete;
  StateSource& operator=(const StateSource&) = delete;

  // Throws StateAccessError(other) if no consistent copy could be taken.
  [[nodiscard]] std::unique_ptr<state::State> snapshot() const;

  [[nodiscard]] const std::string& name() const noexcept { return name_; }

 private:
  std::string name_;
  std::unique_ptr<state::StateReader> reader_;
};

// True if `pid` is a running process whose /proc start time is `start_time` (start time not
// checked when /proc/<pid>/stat cannot be read or `start_time` is 0).
bool process_alive(std::uint32_t pid, std::uint64_t start_time);

}  // namespace vlake::ctl
