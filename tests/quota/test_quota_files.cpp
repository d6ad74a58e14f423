// Quota files a local user may plant or swap in: read_file() reads only regular files (a
// symlink to one is followed) up to the 1 MiB cap, never blocking on a FIFO; duplicate keys are
// errors with both positions; values quoted in errors are bounded.
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>

#include "vlake/quota/quota_config.hpp"

using vlake::quota::ConfigError;
using vlake::quota::FileRead;
using vlake::quota::QuotaConfig;

namespace {

std::string error_of(const std::string& text) {
  try {
    (void)QuotaConfig::parse(text, "q.yaml");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "accepted";
}

// A temporary directory, removed with what the test put in it.
struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/vlake-quota-files-XXXXXX";
    REQUIRE(::mkdtemp(tmpl) != nullptr);
    path = tmpl;
  }
  ~TempDir() {
    for (const char* f : {"/ok.yaml", "/link.yaml", "/fifo", "/big.yaml", "/zero", "/dangling"}) {
      ::unlink((path + f).c_str());
    }
    ::rmdir(path.c_str());
  }
};

}  // namespace

TEST_CASE("quota file: duplicate keys are errors with the positions of both", "[quota]") {
  CHECK(error_of("version: 1\ndefault:\n  limit: 8GiB\n  limit: 16GiB\n") ==
        "q.yaml:4:3: duplicate key 'limit' (first at line 3, column 3)");
  CHECK(error_of("version: 1\nusers:\n  - uid: 1000\n    limit: 1GiB\nversion: 1\n") ==
        "q.yaml:5:1: duplicate key 'version' (first at line 1, column 1)");
  CHECK(error_of("version: 1\nnamespaces:\n  - name: a\n    priority: 1\n    name: b\n") ==
        "q.yaml:5:5: duplicate key 'name' (first at line 3, column 5)");
  CHECK(error_of("version: 1\ngroups: [{gid: 7, limit: 1GiB, gid: 8}]\n") ==
        "q.yaml:2:32: duplicate key 'gid' (first at line 2, column 11)");
  // The same key in two different mappings is fine.
  CHECK(error_of("version: 1\nusers:\n  - {uid: 1, limit: 1GiB}\n  - {uid: 2, limit: 2GiB}\n") == "accepted");
}

TEST_CASE("quota file: values quoted in errors are cut to 120 bytes with the full size", "[quota]") {
  const std::string big(2u << 20, 'x');
  const std::string cut = std::string(120, 'x') + "\xE2\x80\xA6(2097152 bytes)";
  const std::string limit = error_of("version: 1\ndefault:\n  limit: " + big + "\n");
  CHECK(limit.rfind("q.yaml:3:10: bad limit \"" + cut + "\": ", 0) == 0);
  CHECK(limit.size() < 400);
  // A plain key may be at most 1024 characters in YAML: a 2 MiB one is a syntax error, also short.
  CHECK(error_of("version: 1\n" + big + ": 1\n").size() < 200);
  const std::string long_key(1000, 'k');
  const std::string key_cut = std::string(120, 'k') + "\xE2\x80\xA6(1000 bytes)";
  const std::string key = error_of("version: 1\n" + long_key + ": 1\n");
  CHECK(key.rfind("q.yaml:2:1: unknown key '" + key_cut + "' in the top level", 0) == 0);
  CHECK(key.size() < 400);
  const std::string guard = error_of("version: 1\ndefault:\n  guard: " + big + "\n");
  CHECK(guard.rfind("q.yaml:3:10: bad guard mode '" + cut + "'", 0) == 0);
  CHECK(guard.size() < 400);
  const std::string dup = error_of("version: 1\n" + long_key + ": 1\n" + long_key + ": 2\n");
  CHECK(dup == "q.yaml:3:1: duplicate key '" + key_cut + "' (first at line 2, column 1)");
  // A newline inside a quoted value stays on one line.
  CHECK(error_of("version: 1\ndefault:\n  guard: \"a\\nb\"\n") ==
        "q.yaml:3:10: bad guard mode 'a?b' in 'default' (use off, canary or fault)");
}

TEST_CASE("quota file: read_file reads only regular files up to the 1 MiB cap", "[quota]") {
  TempDir t;
  const std::string ok = t.path + "/ok.yaml";
  std::ofstream(ok) << "version: 1\n";
  FileRead r = vlake::quota::read_file(ok);
  CHECK(r.status == FileRead::Status::ok);
  CHECK(r.text == "version: 1\n");

  // A symlink to a regular file is followed (ConfigMap mounts are symlinks).
  const std::string link = t.path + "/link.yaml";
  REQUIRE(::symlink(ok.c_str(), link.c_str()) == 0);
  r = vlake::quota::read_file(link);
  CHECK(r.status == FileRead::Status::ok);
  CHECK(r.text == "version: 1\n");

  const std::string fifo = t.path + "/fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  const auto t0 = std::chrono::steady_clock::now();
  r = vlake::quota::read_file(fifo);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(1));
  CHECK(r.status == FileRead::Status::rejected);
  CHECK(r.error == "not a regular file (a FIFO); the quota file must be a regular file (a symlink to one is fine)");
  CHECK(r.text.empty());

  const std::string zero = t.path + "/zero";
  REQUIRE(::symlink("/dev/zero", zero.c_str()) == 0);
  r = vlake::quota::read_file(zero);
  CHECK(r.status == FileRead::Status::rejected);
  CHECK(r.error.rfind("not a regular file (a character device)", 0) == 0);

  const std::string big = t.path + "/big.yaml";
  std::ofstream(big) << std::string(vlake::quota::kMaxFileBytes, '#');
  r = vlake::quota::read_file(big);
  CHECK(r.status == FileRead::Status::ok);  // exactly the cap is fine
  CHECK(r.text.size() == vlake::quota::kMaxFileBytes);
  std::ofstream(big, std::ios::app) << "#";
  r = vlake::quota::read_file(big);
  CHECK(r.status == FileRead::Status::rejected);
  CHECK(r.error == "the file is 1048577 bytes, over the 1048576-byte (1MiB) limit for a quota file");
  CHECK(r.text.empty());
  CHECK_THROWS_WITH(QuotaConfig::load(big), big + ":0:0: " + r.error);

  const std::string dangling = t.path + "/dangling";
  REQUIRE(::symlink((t.path + "/nowhere").c_str(), dangling.c_str()) == 0);
  CHECK(vlake::quota::read_file(dangling).status == FileRead::Status::missing);
  CHECK(vlake::quota::read_file(t.path + "/absent.yaml").status == FileRead::Status::missing);
}
