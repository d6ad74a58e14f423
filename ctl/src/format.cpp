#include "vlake/ctl/format.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>

namespace vlake::ctl {

std::string human_duration(std::optional<double> seconds) {
  if (!seconds || !std::isfinite(*seconds) || *seconds < 0) return "-";
  const auto t = static_cast<std::uint64_t>(*seconds);
  char buf[32];
  if (t < 60) {
    std::snprintf(buf, sizeof buf, "%llus", static_cast<unsigned long long>(t));
  } else if (t < 3600) {
    std::snprintf(buf, sizeof buf, "%llum", static_cast<unsigned long long>(t / 60));
  } else if (t < 86400) {
    std::snprintf(buf, sizeof buf, "%lluh%02llum", static_cast<unsigned long long>(t / 3600),
                  static_cast<unsigned long long>(t % 3600 / 60));
  } else {
    std::snprintf(buf, sizeof buf, "%llud%02lluh", static_cast<unsigned long long>(t / 86400),
                  static_cast<unsigned long long>(t % 86400 / 3600));
  }
  return buf;
}

std::string human_size(Bytes b) {
  const std::uint64_t v = b.value();
  if (v < 1024) return std::to_string(v) + " B";
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  std::size_t u = 0;
  std::uint64_t div = 1024;
  // Largest unit with value >= 1.
  while (u + 1 < std::size(kUnits) && v / div >= 1024) {
    div *= 1024;
    ++u;
  }
  // Tenths, rounded half up, in integers (exact for any 64-bit value).
  std::uint64_t whole = v / div;
  std::uint64_t tenths = ((v % div) * 10 + div / 2) / div;  // (v%div) < div <= 2^60: no overflow
  if (tenths >= 10) {
    ++whole;
    tenths -= 10;
  }
  if (whole >= 1024 && u + 1 < std::size(kUnits)) {  // 1023.96 MiB rounds to 1024.0: say 1.0 GiB
    ++u;
    whole /= 1024;
    tenths = 0;
  }
  return std::to_string(whole) + "." + std::to_string(tenths) + " " + kUnits[u];
}

std::string percent(double p) {
  if (!std::isfinite(p)) return "-";
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.1f%%", p);
  return buf;
}

double share_percent(Bytes part, Bytes whole) {
  if (whole.value() == 0) return 0.0;
  return static_cast<double>(part.value()) * 100.0 / static_cast<double>(whole.value());
}

std::string uuid_short(const Uuid& u) { return u.to_string().substr(0, 12); }

void Table::add_row(std::vector<std::string> cells) {
  if (cells.size() != columns_.size()) {
    throw std::invalid_argument("table row has " + std::to_string(cells.size()) + " cells, expected " +
                                std::to_string(columns_.size()));
  }
  rows_.push_back(std::move(cells));
}

std::string Table::render(const std::string& indent) const {
  std::vector<std::size_t> width(columns_.size());
  for (std::size_t c = 0; c < columns_.size(); ++c) {
    width[c] = columns_[c].header.size();
    for (const auto& r : rows_) width[c] = std::max(width[c], r[c].size());
  }
  std::string out;
  const auto line = [&](const std::vector<std::string>& cells) {
    std::string l = indent;
    for (std::size_t c = 0; c < cells.size(); ++c) {
      if (c > 0) l += "  ";
      const std::size_t pad = width[c] - cells[c].size();
      if (columns_[c].align == Align::right) l.append(pad, ' ');
      l += cells[c];
      if (columns_[c].align == Align::left) l.append(pad, ' ');
    }
    while (!l.empty() && l.back() == ' ') l.pop_back();
    out += l;
    out += '\n';
  };
  std::vector<std::string> head;
  for (const auto& c : columns_) head.push_back(c.header);
  line(head);
  for (const auto& r : rows_) line(r);
  return out;
}

}  // namespace vlake::ctl
