// Reading "--name value" / "--name=value" command-line options (vlaked, vlake-device-plugin).
//
// Contract
// - read_option<Error>(argc, argv, i, known) reads the argument at argv[i]: "-h"/"--help" gives
//   {help = true}; otherwise it must be "--name" or "--name=value" with `name` in `known`, and
//   the value is the text after '=' or the next argument (then `i` is advanced past it).
// - Errors throw Error(message): an argument that is not an option, an unknown option (both
//   pointing at --help), an option without a value. The value itself is the caller's to check.
// - Header-only; no state.
#pragma once

#include <span>
#include <string>
#include <string_view>

namespace vlake::cli {

struct Option {
  bool help = false;
  std::string name;   // "--config"
  std::string value;  // may be empty ("--nvml=")
};

template <class Error>
Option read_option(int argc, const char* const* argv, int& i, std::span<const std::string_view> known) {
  Option o;
  std::string arg = argv[i];
  if (arg == "--help" || arg == "-h") {
    o.help = true;
    return o;
  }
  if (arg.rfind("--", 0) != 0) throw Error("unexpected argument '" + arg + "' (see --help)");
  bool have_value = false;
  if (const auto eq = arg.find('='); eq != std::string::npos) {
    o.value = arg.substr(eq + 1);
    arg.resize(eq);
    have_value = true;
  }
  bool is_known = false;
  for (std::string_view k : known) is_known = is_known || arg == k;
  if (!is_known) throw Error("unknown option '" + arg + "' (see --help)");
  if (!have_value) {
    if (i + 1 >= argc) throw Error("option " + arg + " needs a value");
    o.value = argv[++i];
  }
  o.name = std::move(arg);
  return o;
}

}  // namespace vlake::cli
