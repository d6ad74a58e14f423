// libvlake-hook.so exports exactly the interposed symbols and depends only on the C/C++
// runtime: nm -D --defined-only and readelf -d on the built library.
#include <catch2/catch.hpp>
#include <cstdio>
#include <set>
#include <sstream>
#include <string>

namespace {

std::string run(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[4096];
  std::size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  REQUIRE(::pclose(p) == 0);
  return out;
}

std::set<std::string> expected_exports() {
  std::set<std::string> names = {"dlsym", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetMemoryInfo_v2"};
#define VLAKE_HOOK(base, symbol, version) names.insert(#symbol);
#define VLAKE_HOOK_PTSZ(base, symbol, ptsz_symbol, version) names.insert(#ptsz_symbol);
#include "hooked.def"
  return names;
}

}  // namespace

TEST_CASE("exported dynamic symbols are exactly the interposed ones") {
  const std::string out = run("nm -D --defined-only '" VLAKE_HOOK_LIB "'");
  std::set<std::string> exported;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string addr, type, name;
    fields >> addr >> type >> name;
    if (name.empty()) continue;
    INFO("symbol " << name << " type " << type);
    CHECK((type == "T" || type == "i"));  // code, or an indirect function (the cu* trampolines)
    exported.insert(name.substr(0, name.find('@')));
  }
  const std::set<std::string> expected = expected_exports();
  for (const std::string& name : exported) {
    INFO("unexpected export " << name);
    CHECK((expected.count(name) == 1 || name.rfind("vlake_hook_", 0) == 0 || name.rfind("vlake_share_", 0) == 0 ||
           name.rfind("vlake_reclaim_", 0) == 0));
  }
  for (const std::string& name : expected) {
    INFO("missing export " << name);
    CHECK(exported.count(name) == 1);
  }
}

TEST_CASE("NEEDED libraries are the C and C++ runtime only") {
  const std::string out = run("readelf -d '" VLAKE_HOOK_LIB "'");
  const std::set<std::string> allowed = {"libc.so.6",
                                         "libstdc++.so.6",
                                         "libm.so.6",
                                         "libgcc_s.so.1",
                                         "libdl.so.2",
                                         "ld-linux-x86-64.so.2",
                                         "ld-linux-aarch64.so.1"};
  std::istringstream in(out);
  std::string line;
  int needed = 0;
  while (std::getline(in, line)) {
    if (line.find("(NEEDED)") == std::string::npos) continue;
    const auto l = line.find('[');
    const auto r = line.find(']');
    REQUIRE(l != std::string::npos);
    const std::string lib = line.substr(l + 1, r - l - 1);
    INFO("NEEDED " << lib);
#ifdef VLAKE_HOOK_SANITIZED
    if (lib.rfind("libasan.so", 0) == 0 || lib.rfind("libubsan.so", 0) == 0 || lib.rfind("libtsan.so", 0) == 0) {
      continue;  // the sanitizer runtime of a sanitizer build
    }
#endif
    CHECK(allowed.count(lib) == 1);
    ++needed;
  }
  CHECK(needed >= 2);  // libc and libstdc++ at least: the parse worked
}
