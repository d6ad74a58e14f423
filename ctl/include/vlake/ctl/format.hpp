// vlake::ctl formatting helpers for the text output: human sizes, percentages, UUIDs and a
// column-aligned table.
//
// Contract: pure functions / value types; thread-safe. No errors except Table::add_row with
// the wrong number of cells (std::invalid_argument).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "vlake/common/strong_types.hpp"
#include "vlake/common/uuid.hpp"

namespace vlake::ctl {

// "0 B", "512 B", "1.5 KiB", "300.0 MiB", "1.0 GiB", "2.3 TiB": below 1 KiB in bytes, else in
// the largest binary unit whose value is at least 1, with one decimal (rounded half up; a value
// that rounds to 1024.0 moves to the next unit).
std::string human_size(Bytes b);

// A duration for people: "0s", "42s", "12m", "3h05m", "2d04h" (whole units, rounded down);
// "-" for none or a non-finite or negative value.
std::string human_duration(std::optional<double> seconds);

// "12.5%" (one decimal); "-" for a non-finite value.
std::string percent(double p);

// part / whole * 100; 0 when whole is 0.
double share_percent(Bytes part, Bytes whole);

// The first 8 hex digits of Uuid::to_string(), with the prefix: "GPU-1a2b3c4d".
std::string uuid_short(const Uuid& uuid);

class Table {
 public:
  enum class Align { left, right };
  struct Column {
    std::string header;
    Align align = Align::left;
  };
  explicit Table(std::vector<Column> columns) : columns_(std::move(columns)) {}
  void add_row(std::vector<std::string> cells);
  [[nodiscard]] std::size_t rows() const noexcept { return rows_.size(); }
  // Header + rows, columns separated by two spaces, each line prefixed by `indent` and ended
  // by '\n'; trailing spaces trimmed.
  [[nodiscard]] std::string render(const std::string& indent = "") const;

 private:
  std::vector<Column> columns_;
  std::vector<std::vector<std::string>> rows_;
};

}  // namespace vlake::ctl
