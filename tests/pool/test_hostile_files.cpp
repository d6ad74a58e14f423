// vlaked against files a local user may plant or swap in (docs/daemon.md, "State segment
// ownership" and "Reading the quota file"): the state segment lives in a directory no other user
// can create names in, so nobody can pre-empt it, and a directory others could write is refused
// with what to do; a state segment it did not create is refused at start-up with what is wrong
// and how to fix it; a quota file that is a FIFO, a device or too
// large is rejected without being read, bad values are quoted in bounded form, and the loop
// keeps serving throughout while the configuration in force stays.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>

#include "harness.hpp"
#include "process.hpp"
#include "units.hpp"

using namespace vlake;
using namespace vlake::pooltest;
namespace st = vlake::state;

using namespace vlake::testunits;  // kMiB, kGiB, MiB (units.hpp)

namespace {

const std::string kHostileConfig = "version: 1\ndefault:\n  limit: 16MiB\n";

// A new tenant process connects (Hello) and asks for its usage; returns how long the daemon
// took to answer both, and the limit it reported.
std::chrono::milliseconds serve(DaemonProcess& d, std::uint64_t& limit) {
  Helper h(d.node);  // spawned and ready before the clock starts
  const auto t0 = std::chrono::steady_clock::now();
  h.ok("connect " + d.socket);
  limit = num(h.ok("usage"), "limit");
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
}

std::string last_error(const DaemonProcess& d) { return snapshot(d.state)->config.last_error; }

// Puts `make(tmp)`'s result in place of the config file with one rename (as tools do).
template <class F>
void swap_in(const DaemonProcess& d, F&& make) {
  const std::string tmp = d.dir + "/swap.tmp";
  make(tmp);
  REQUIRE(::rename(tmp.c_str(), d.config.c_str()) == 0);
}

std::size_t file_size(const std::string& path) {
  struct stat sb {};
  return ::stat(path.c_str(), &sb) == 0 ? static_cast<std::size_t>(sb.st_size) : 0;
}

// The longest line of the daemon's log.
std::size_t longest_log_line(const DaemonProcess& d) {
  std::ifstream in(d.log_path);
  std::string line;
  std::size_t longest = 0;
  while (std::getline(in, line)) longest = std::max(longest, line.size());
  return longest;
}

// Runs `script` with /bin/sh as `uid` (gid `uid`); returns its stdout.
std::string run_as(long uid, const std::string& script) {
  testsupport::Spawn spec;
  spec.argv = {"/bin/sh", "-c", script};
  spec.uid = uid;
  spec.gid = uid;
  spec.err = testsupport::Stream::merged;
  const testsupport::Result r = testsupport::run(spec, 20000);
  REQUIRE_FALSE(r.timed_out);
  return r.out;
}

}  // namespace

TEST_CASE("daemon state: another user cannot pre-create the segment, and a name planted in /dev/shm stops nothing",
          "[daemon][hostile]") {
  if (::geteuid() != 0) {
    WARN("needs root to run a helper as another uid; not run");
    return;
  }
  DaemonProcess d("seg-preempt", kHostileConfig);
  const std::string path = st::segment_path(d.state);
  const std::string old_path = "/dev/shm/" + d.state;  // where the segment used to live
  struct Cleanup {
    std::string p;
    ~Cleanup() { ::unlink(p.c_str()); }
  } cleanup{old_path};
  // vlaked creates its directory before anything else; a fresh node has it from the first start.
  st::prepare_state_dir(st::state_dir());
  // A local user (uid 60001) plants both names before vlaked (re)starts, as the attacker did.
  const std::string planted = run_as(60001, "umask 0; : > '" + old_path + "' && echo old-planted; : > '" + path +
                                                "' 2>/dev/null && echo new-planted; true");
  INFO(planted);
  CHECK(planted.find("old-planted") != std::string::npos);  // /dev/shm: anyone may create names
  CHECK(planted.find("new-planted") == std::string::npos);  // the state directory: nobody but root
  CHECK(::access(path.c_str(), F_OK) != 0);
  REQUIRE(d.start());
  struct stat sb {};
  REQUIRE(::lstat(path.c_str(), &sb) == 0);
  CHECK(sb.st_uid == 0);
  CHECK((sb.st_mode & 0777) == 0600);
  CHECK(snapshot(d.state)->header.daemon_pid == static_cast<std::uint32_t>(d.pid()));
  // While it runs and after it stopped, the user still cannot replace or add the name.
  d.signal(SIGTERM);
  REQUIRE(d.wait_exit() >= 0);
  const std::string again =
      run_as(60001, "rm -f '" + path + "' 2>/dev/null; : > '" + path + "' 2>/dev/null && echo new-planted; true");
  CHECK(again.find("new-planted") == std::string::npos);
  REQUIRE(d.start());  // restarts on its own segment (or a fresh one)
  REQUIRE(::lstat(path.c_str(), &sb) == 0);
  CHECK(sb.st_uid == 0);
}

TEST_CASE("daemon state: a state directory another user could write in is refused with what to do",
          "[daemon][hostile]") {
  if (::geteuid() != 0) {
    WARN("needs root to give a directory to another uid; not run");
    return;
  }
  DaemonProcess d("seg-dir", kHostileConfig);
  const std::string open_dir = d.dir + "/open";
  REQUIRE(::mkdir(open_dir.c_str(), 0755) == 0);
  REQUIRE(::chmod(open_dir.c_str(), 01777) == 0);  // like /tmp or /dev/shm: anyone creates names
  CHECK_FALSE(d.start({"--state", open_dir + "/state"}));
  CHECK_THAT(d.log(), Catch::Contains("state directory " + open_dir + " is unsafe: " + open_dir +
                                      " has mode 1777 (group or others may write it)"));
  CHECK_THAT(d.log(), Catch::Contains("chmod go-w " + open_dir));
  CHECK(::access((open_dir + "/state").c_str(), F_OK) != 0);  // nothing created there

  const std::string theirs = d.dir + "/theirs";
  REQUIRE(::mkdir(theirs.c_str(), 0755) == 0);
  REQUIRE(::chown(theirs.c_str(), 60001, 60001) == 0);  // another user's directory
  CHECK_FALSE(d.start({"--state", theirs + "/state"}));
  CHECK_THAT(d.log(), Catch::Contains("state directory " + theirs + " is unsafe: " + theirs +
                                      " is owned by uid 60001, neither root nor uid 0"));

  // Once the directory is root's and nobody else's to write, the same path is served.
  REQUIRE(::chmod(theirs.c_str(), 0755) == 0);
  REQUIRE(::chown(theirs.c_str(), 0, 0) == 0);
  REQUIRE(d.start({"--state", theirs + "/state"}));  // a safe directory: served
}

TEST_CASE("daemon state: a segment created by another uid is refused at start-up", "[daemon][hostile]") {
  if (::geteuid() != 0) {
    WARN("needs root to create a file owned by another uid; not run");
    return;
  }
  DaemonProcess d("seg-owner", kHostileConfig);
  const std::string path = st::segment_path(d.state);
  {
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    REQUIRE(fd >= 0);
    REQUIRE(::fchown(fd, 65534, 65534) == 0);
    ::close(fd);
  }
  CHECK_FALSE(d.start());
  CHECK_THAT(d.log(), Catch::Contains("state segment " + path + " is owned by uid 65534, not by vlaked's uid 0"));
  CHECK_THAT(d.log(), Catch::Contains("remove " + path));
  struct stat sb {};
  REQUIRE(::lstat(path.c_str(), &sb) == 0);
  CHECK(sb.st_uid == 65534);  // left as found
  CHECK(sb.st_size == 0);
}

TEST_CASE("daemon state: a symlink at the segment path is refused at start-up", "[daemon][hostile]") {
  DaemonProcess d("seg-link", kHostileConfig);
  const std::string path = st::segment_path(d.state);
  const std::string target = d.dir + "/target";
  { std::ofstream(target) << "precious"; }
  struct stat before {};
  REQUIRE(::stat(target.c_str(), &before) == 0);
  REQUIRE(::symlink(target.c_str(), path.c_str()) == 0);
  CHECK_FALSE(d.start());
  CHECK_THAT(d.log(), Catch::Contains("state segment " + path + " is a symbolic link"));
  struct stat after {};
  REQUIRE(::stat(target.c_str(), &after) == 0);
  CHECK(after.st_size == 8);  // not truncated, not written
  CHECK(after.st_mode == before.st_mode);
  CHECK(after.st_gid == before.st_gid);
}

TEST_CASE("daemon state: a segment group/others may write (mode 0666) is refused, not fixed", "[daemon][hostile]") {
  DaemonProcess d("seg-0666", kHostileConfig);
  const std::string path = st::segment_path(d.state);
  {
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    REQUIRE(fd >= 0);
    REQUIRE(::fchmod(fd, 0666) == 0);
    ::close(fd);
  }
  CHECK_FALSE(d.start());
  CHECK_THAT(d.log(), Catch::Contains("state segment " + path + " has mode 0666: group or others may write it"));
  struct stat sb {};
  REQUIRE(::stat(path.c_str(), &sb) == 0);
  CHECK((sb.st_mode & 0777) == 0666);
}

TEST_CASE("daemon state: the segment is created with mode 0600 by default", "[daemon][hostile]") {
  DaemonProcess d("seg-default", kHostileConfig);
  REQUIRE(d.start());
  struct stat sb {};
  REQUIRE(::lstat(st::segment_path(d.state).c_str(), &sb) == 0);
  CHECK(S_ISREG(sb.st_mode));
  CHECK((sb.st_mode & 0777) == 0600);
  CHECK(sb.st_uid == ::geteuid());
  CHECK(sb.st_nlink == 1);
}

TEST_CASE("daemon quota file: a FIFO swapped in is rejected and the daemon keeps serving", "[daemon][hostile]") {
  DaemonProcess d("cfg-fifo", kHostileConfig);
  REQUIRE(d.start());
  std::uint64_t limit = 0;
  serve(d, limit);
  REQUIRE(limit == 16 * kMiB);
  swap_in(d, [](const std::string& tmp) { REQUIRE(::mkfifo(tmp.c_str(), 0644) == 0); });
  const std::string want = d.config + ":0:0: not a regular file (a FIFO)";
  REQUIRE(eventually([&] { return last_error(d).rfind(want, 0) == 0; }, 2000));
  CHECK(serve(d, limit) < std::chrono::seconds(1));
  CHECK(limit == 16 * kMiB);  // the configuration in force stays
  auto s = snapshot(d.state);
  CHECK(s->config.rejected == 1);
  CHECK(s->config.generation == 1);
  CHECK_THAT(d.log(), Catch::Contains("quota file rejected (file changed): " + want));
  // SIGHUP reads it again: rejected again, still serving.
  const std::uint64_t errors = s->counters.config_reload_errors;
  d.signal(SIGHUP);
  REQUIRE(eventually([&] { return snapshot(d.state)->counters.config_reload_errors == errors + 1; }, 2000));
  CHECK(serve(d, limit) < std::chrono::seconds(1));
  CHECK(snapshot(d.state)->config.generation == 1);
}

TEST_CASE("daemon quota file: a symlink to /dev/zero and a 6.7 MB file are rejected quickly", "[daemon][hostile]") {
  DaemonProcess d("cfg-big", kHostileConfig);
  REQUIRE(d.start());
  std::uint64_t limit = 0;

  auto t0 = std::chrono::steady_clock::now();
  swap_in(d, [](const std::string& tmp) { REQUIRE(::symlink("/dev/zero", tmp.c_str()) == 0); });
  const std::string zero = d.config + ":0:0: not a regular file (a character device)";
  REQUIRE(eventually([&] { return last_error(d).rfind(zero, 0) == 0; }, 2000));
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(2));
  CHECK(serve(d, limit) < std::chrono::seconds(1));
  CHECK(limit == 16 * kMiB);
  // The periodic look (every 50 ms here) sees the same rejected version and does not log it again.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const std::string log = d.log();
  std::size_t count = 0;
  for (std::size_t at = log.find(zero); at != std::string::npos; at = log.find(zero, at + 1)) ++count;
  CHECK(count == 1);

  // 6.7 MB of valid YAML (comments): over the 1 MiB cap, rejected with its size and the cap.
  const std::size_t big = 6'700'000;
  t0 = std::chrono::steady_clock::now();
  swap_in(d, [&](const std::string& tmp) {
    std::string text = kHostileConfig;
    const std::string line = "# " + std::string(97, 'c') + "\n";
    while (text.size() + line.size() <= big) text += line;
    text.resize(big, '\n');
    std::ofstream(tmp) << text;
  });
  const std::string too_big =
      d.config + ":0:0: the file is 6700000 bytes, over the 1048576-byte (1MiB) limit for a quota file";
  REQUIRE(eventually([&] { return last_error(d) == too_big; }, 2000));
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(2));
  CHECK(serve(d, limit) < std::chrono::seconds(1));
  CHECK(limit == 16 * kMiB);
  CHECK_THAT(d.log(), Catch::Contains("quota file rejected (file changed): " + too_big));

  // A valid file again is applied.
  swap_in(d, [](const std::string& tmp) { std::ofstream(tmp) << "version: 1\ndefault:\n  limit: 24MiB\n"; });
  REQUIRE(eventually([&] { return snapshot(d.state)->config.generation == 2; }, 2000));
  CHECK(serve(d, limit) < std::chrono::seconds(1));
  CHECK(limit == 24 * kMiB);
  CHECK(snapshot(d.state)->config.rejected == 0);
}

TEST_CASE("daemon quota file: a huge bad string leaves the log line and last_error bounded", "[daemon][hostile]") {
  DaemonProcess d("cfg-string", kHostileConfig);
  REQUIRE(d.start());
  std::uint64_t limit = 0;

  // 10 MB: over the cap, so never read or quoted.
  const std::size_t ten = 10u << 20;
  swap_in(d, [&](const std::string& tmp) {
    std::ofstream(tmp) << "version: 1\ndefault:\n  limit: " << std::string(ten, 'x') << "\n";
  });
  REQUIRE(eventually([&] { return last_error(d).find("over the 1048576-byte") != std::string::npos; }, 5000));
  CHECK(last_error(d).size() < 200);

  // 1000000 bytes, under the cap: parsed, and the bad value is quoted cut to 120 bytes.
  const std::size_t under = 1'000'000;
  swap_in(d, [&](const std::string& tmp) {
    std::ofstream(tmp) << "version: 1\ndefault:\n  limit: " << std::string(under, 'y') << "\n";
  });
  const std::string quoted =
      d.config + ":3:10: bad limit \"" + std::string(120, 'y') + "\xE2\x80\xA6(" + std::to_string(under) + " bytes)\"";
  REQUIRE(eventually([&] { return last_error(d).rfind(quoted, 0) == 0; }, 10000));
  CHECK(last_error(d).size() < st::kConfigErrorBytes);
  CHECK_THAT(d.log(), Catch::Contains("quota file rejected (file changed): " + quoted));
  CHECK(longest_log_line(d) < 1200);
  CHECK(file_size(d.log_path) < 16384);
  CHECK(serve(d, limit) < std::chrono::seconds(1));
  CHECK(limit == 16 * kMiB);
  CHECK(snapshot(d.state)->config.generation == 1);
}
