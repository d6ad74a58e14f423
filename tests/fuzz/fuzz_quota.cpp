// libFuzzer target: the quota file parser, QuotaConfig::parse (quota/quota_config.hpp), which
// the daemon runs on the quota file's text (QuotaConfig::load) at start-up and on every reload.
//
// Input: the file's text. Beyond "no crash, no undefined behaviour" (the build has ASan and
// UBSan), the target aborts unless, as documented:
// - parse() returns a config or throws quota::ConfigError, nothing else (not vlake::SizeError,
//   not yaml-cpp's exceptions, not std::out_of_range from a number conversion);
// - a ConfigError's line and column are 0 (no position) or 1-based, within the text's lines;
// - on an accepted config, check_device() on a few GPU sizes returns or throws ConfigError,
//   and resolve() of a few processes gives a tenant with a name in a namespace the config has;
// - with VLAKE_FUZZ_QUOTA_MESSAGE_LIMIT > 0 (a compile definition, CMake option of the same
//   name, tests/fuzz/CMakeLists.txt): every what() is at most that many bytes, so a huge file
//   cannot produce a huge error message (default 4096; 0 skips this check).
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <typeinfo>

#include "vlake/quota/quota_config.hpp"

#ifndef VLAKE_FUZZ_QUOTA_MESSAGE_LIMIT
#define VLAKE_FUZZ_QUOTA_MESSAGE_LIMIT 4096
#endif

namespace {

[[noreturn]] void violated(const std::string& what) {
  std::fprintf(stderr, "fuzz_quota: invariant violated: %s\n", what.c_str());
  std::abort();
}

void check_error(const vlake::quota::ConfigError& e, std::size_t lines) {
  const std::string what = e.what();
  if (what.empty()) violated("ConfigError without a message");
  if (e.line() < 0 || e.column() < 0 || (e.line() == 0) != (e.column() == 0)) {
    violated("ConfigError position " + std::to_string(e.line()) + ":" + std::to_string(e.column()));
  }
  if (static_cast<std::size_t>(e.line()) > lines) {
    violated("ConfigError line " + std::to_string(e.line()) + " beyond the text's " + std::to_string(lines));
  }
  if (VLAKE_FUZZ_QUOTA_MESSAGE_LIMIT > 0 && what.size() > std::size_t{VLAKE_FUZZ_QUOTA_MESSAGE_LIMIT}) {
    violated("ConfigError message of " + std::to_string(what.size()) + " bytes (limit " +
             std::to_string(VLAKE_FUZZ_QUOTA_MESSAGE_LIMIT) + "): " + what.substr(0, 200) + "...");
  }
}

[[noreturn]] void unexpected(const char* where) {
  try {
    throw;
  } catch (const std::exception& e) {
    violated(std::string(where) + " threw " + typeid(e).name() + ": " + std::string(e.what()).substr(0, 300));
  } catch (...) {
    violated(std::string(where) + " threw a non-std exception");
  }
}

void check_config(const vlake::quota::QuotaConfig& cfg, std::size_t lines) {
  for (const std::uint64_t total : {std::uint64_t{1} << 20, std::uint64_t{80} << 30, ~std::uint64_t{0}}) {
    try {
      cfg.check_device(vlake::Bytes{total});
    } catch (const vlake::quota::ConfigError& e) {
      check_error(e, lines);
    } catch (...) {
      unexpected("check_device()");
    }
  }
  const gid_t groups[] = {0, 2000, 4242};
  for (const uid_t uid : {uid_t{0}, uid_t{1000}, uid_t{1001}, uid_t{65534}}) {
    std::optional<vlake::quota::TenantSpec> t;
    try {
      t = cfg.resolve(uid, static_cast<gid_t>(uid), groups);
    } catch (...) {
      unexpected("resolve()");
    }
    if (t->name.empty() || cfg.find_namespace(t->ns) == nullptr) {
      violated("resolve() gave a tenant without a namespace");
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  // An upper bound of the lines YAML sees: every byte that is or starts a line break (\n, \r,
  // NEL 0x85, the lead byte 0xE2 of U+2028/U+2029).
  std::size_t lines = 1;
  for (const std::uint8_t c : std::string_view(text)) lines += c == '\n' || c == '\r' || c == 0x85 || c == 0xe2 ? 1 : 0;
  try {
    const vlake::quota::QuotaConfig cfg = vlake::quota::QuotaConfig::parse(text, "fuzz.yaml");
    check_config(cfg, lines);
  } catch (const vlake::quota::ConfigError& e) {
    check_error(e, lines);
  } catch (...) {
    unexpected("parse()");
  }
  return 0;
}
