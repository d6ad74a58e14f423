// libvlake-hook.so exports exactly the interposed symbols, depends only on the C/C++ runtime,
// and (in its portable build) needs nothing above its glibc floor: nm -D --defined-only and
// readelf on the built library.
#include <catch2/catch.hpp>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

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
                                         "libpthread.so.0",
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
  CHECK(needed >= 2);  // libc and one more at least: the parse worked
}

#ifdef VLAKE_HOOK_GLIBC_FLOOR
// The portable build (hook/CMakeLists.txt, docs/hook.md "Old images"): every symbol version the
// library requires is glibc's and at most the floor, every NEEDED library is part of glibc, and
// the libraries that held a symbol before glibc 2.34 (libdl, libpthread, librt) are NEEDED when it
// is used. The full list is printed.
namespace {

// "GLIBC_2.3.3" -> {2, 3, 3}; any other version name (GLIBCXX_3.4, CXXABI_1.3, GCC_3.0,
// GLIBC_PRIVATE) -> empty.
std::vector<int> glibc_version(const std::string& name) {
  const std::string prefix = "GLIBC_";
  if (name.rfind(prefix, 0) != 0) return {};
  std::vector<int> parts;
  std::istringstream in(name.substr(prefix.size()));
  std::string part;
  while (std::getline(in, part, '.')) {
    if (part.empty() || part.find_first_not_of("0123456789") != std::string::npos) return {};
    parts.push_back(std::stoi(part));
  }
  return parts;
}

// The library that held `symbol` in glibc before 2.34 when it was not libc.so.6; empty for libc.
std::string old_home(const std::string& symbol) {
  static const std::set<std::string> dl = {"dlopen", "dlclose", "dlsym",  "dlvsym", "dlerror",
                                           "dladdr", "dladdr1", "dlinfo", "dlmopen"};
  static const std::set<std::string> rt = {"shm_open", "shm_unlink"};
  const auto starts = [&symbol](const char* prefix) { return symbol.rfind(prefix, 0) == 0; };
  if (dl.count(symbol) == 1) return "libdl.so.2";
  if (starts("pthread_") || starts("__pthread_") || starts("sem_")) return "libpthread.so.0";
  if (rt.count(symbol) == 1 || starts("mq_") || starts("timer_") || starts("aio_") || starts("lio_")) {
    return "librt.so.1";
  }
  return {};
}

struct Needed {  // one Version needs entry: a version of a file
  std::string file;
  std::string version;
  bool weak = false;
  std::vector<std::string> symbols;
};

}  // namespace

TEST_CASE("required symbol versions stay at or below the glibc floor") {
  const std::vector<int> floor = glibc_version("GLIBC_" VLAKE_HOOK_GLIBC_FLOOR);
  REQUIRE(floor.size() >= 2);
  const std::set<std::string> glibc_files = {"libc.so.6",
                                             "libm.so.6",
                                             "libdl.so.2",
                                             "libpthread.so.0",
                                             "librt.so.1",
                                             "ld-linux-x86-64.so.2",
                                             "ld-linux-aarch64.so.1"};

  // NEEDED entries (readelf -d): "... (NEEDED)  Shared library: [libc.so.6]".
  std::set<std::string> needed;
  {
    std::istringstream in(run("readelf -W -d '" VLAKE_HOOK_LIB "'"));
    std::string line;
    while (std::getline(in, line)) {
      if (line.find("(NEEDED)") == std::string::npos) continue;
      const auto l = line.find('[');
      const auto r = line.find(']', l);
      REQUIRE(r != std::string::npos);
      needed.insert(line.substr(l + 1, r - l - 1));
    }
  }

  // Version needs (readelf -V): "  000000: Version: 1  File: libc.so.6  Cnt: 5" then, per version,
  // "  0x0010:   Name: GLIBC_2.2.5  Flags: none  Version: 3". Keyed by the version index.
  std::map<int, Needed> versions;
  {
    std::istringstream in(run("readelf -W -V '" VLAKE_HOOK_LIB "'"));
    std::string line;
    bool in_needs = false;
    std::string file;
    while (std::getline(in, line)) {
      if (line.rfind("Version ", 0) == 0) in_needs = line.rfind("Version needs section", 0) == 0;  // a section
      if (!in_needs) continue;
      const auto f = line.find("File: ");
      if (f != std::string::npos) {
        std::istringstream fields(line.substr(f + 6));
        fields >> file;
        continue;
      }
      const auto n = line.find("Name: ");
      const auto v = line.find("Version: ");
      if (n == std::string::npos || v == std::string::npos) continue;
      Needed entry;
      entry.file = file;
      std::istringstream(line.substr(n + 6)) >> entry.version;
      entry.weak = line.find("WEAK") != std::string::npos;
      versions[std::stoi(line.substr(v + 9))] = entry;
    }
  }

  // Undefined dynamic symbols (readelf --dyn-syms): "... FUNC GLOBAL DEFAULT UND name@GLIBC_2.2.5 (3)".
  std::vector<std::string> unversioned_strong;
  std::set<std::string> undefined;
  {
    std::istringstream in(run("readelf -W --dyn-syms '" VLAKE_HOOK_LIB "'"));
    std::string line;
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string num, value, size, type, bind, vis, ndx, name, index;
      fields >> num >> value >> size >> type >> bind >> vis >> ndx >> name >> index;
      if (ndx != "UND" || name.empty()) continue;
      const auto at = name.find('@');
      const std::string base = name.substr(0, at);
      undefined.insert(base);
      if (at == std::string::npos) {
        if (bind != "WEAK") unversioned_strong.push_back(base);
        continue;
      }
      REQUIRE(index.size() > 2);
      const int idx = std::stoi(index.substr(1, index.size() - 2));
      INFO("symbol " << name << " has version index " << idx << ", which the Version needs section lacks");
      REQUIRE(versions.count(idx) == 1);
      versions[idx].symbols.push_back(base);
    }
  }

  std::ostringstream listing;
  listing << VLAKE_HOOK_LIB << " (floor GLIBC_" VLAKE_HOOK_GLIBC_FLOOR ")\nNEEDED:";
  for (const std::string& lib : needed) listing << ' ' << lib;
  listing << "\nrequired versions:";
  for (const auto& [idx, entry] : versions) {
    listing << "\n  " << entry.file << ' ' << entry.version << (entry.weak ? " (weak)" : "") << ':';
    for (const std::string& name : entry.symbols) listing << ' ' << name;
  }
  WARN(listing.str());

  REQUIRE(needed.count("libc.so.6") == 1);  // the parse worked
  REQUIRE(!versions.empty());
  for (const std::string& lib : needed) {
    INFO("NEEDED " << lib << " is not part of glibc");
    CHECK(glibc_files.count(lib) == 1);
  }
  for (const auto& [idx, entry] : versions) {
    INFO(entry.file << " " << entry.version << " (" << entry.symbols.size() << " symbols)");
    const std::vector<int> v = glibc_version(entry.version);
    CHECK(!v.empty());  // GLIBCXX_*, CXXABI_*, GCC_*, GLIBC_PRIVATE: not allowed at all
    CHECK(v <= floor);
    CHECK(glibc_files.count(entry.file) == 1);
  }
  for (const std::string& name : unversioned_strong) {
    FAIL_CHECK("undefined symbol " << name << " carries no version and is not weak");
  }
  for (const std::string& name : undefined) {
    const std::string home = old_home(name);
    if (home.empty()) continue;
    INFO(name << " lives in " << home << " before glibc 2.34, which is not NEEDED");
    CHECK(needed.count(home) == 1);
  }
}
#endif
