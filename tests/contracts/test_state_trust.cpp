// The state segment's trust checks (contracts/state.hpp, StateSegment): created exclusively
// with the configured mode (0600 by default); an existing one is resumed only when it is a
// regular file of this uid that nobody else can write, with one name; its mode is then set to
// the configured one.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <string>

#include "vlake/contracts/state.hpp"

namespace st = vlake::state;

namespace {

struct Names {
  std::string name;
  std::string path;
  std::string other;  // a second name in /dev/shm
  explicit Names(const std::string& tag)
      : name("pt" + std::to_string(::getpid()) + "-trust-" + tag),
        path(st::segment_path(name)),
        other(path + "-other") {}
  ~Names() {
    ::unlink(path.c_str());
    ::unlink(other.c_str());
  }
};

mode_t mode_of(const std::string& path) {
  struct stat sb {};
  REQUIRE(::lstat(path.c_str(), &sb) == 0);
  return sb.st_mode & 07777;
}

std::string refusal(const std::string& name) {
  try {
    st::StateSegment seg(name);
  } catch (const st::StateError& e) {
    return e.what();
  }
  return "accepted";
}

}  // namespace

TEST_CASE("state segment trust: created with mode 0600 by default, or the mode asked for", "[contracts][state]") {
  Names n("create");
  {
    st::StateSegment seg(n.name);
    CHECK(seg.origin() == st::StateSegment::Origin::created);
    CHECK(mode_of(n.path) == 0600);
    struct stat sb {};
    REQUIRE(::lstat(n.path.c_str(), &sb) == 0);
    CHECK(sb.st_uid == ::geteuid());
  }
  // Resumed with another configured mode: set to it (a 0644 segment of an older vlaked is
  // tightened the same way).
  {
    st::StateSegment seg(n.name, 0640);
    CHECK(seg.origin() == st::StateSegment::Origin::resumed);
    CHECK(mode_of(n.path) == 0640);
  }
  {
    st::StateSegment seg(n.name);
    CHECK(seg.origin() == st::StateSegment::Origin::resumed);
    CHECK(mode_of(n.path) == 0600);
  }
  CHECK_THROWS_WITH(st::StateSegment(n.name, 0664), Catch::Contains("nobody else write"));
}

TEST_CASE("state segment trust: a segment others could write, a symlink, a FIFO or a second name is refused",
          "[contracts][state]") {
  SECTION("mode 0666") {
    Names n("0666");
    const int fd = ::open(n.path.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    REQUIRE(fd >= 0);
    REQUIRE(::fchmod(fd, 0666) == 0);
    ::close(fd);
    const std::string e = refusal(n.name);
    CHECK_THAT(e, Catch::Contains("has mode 0666: group or others may write it"));
    CHECK_THAT(e, Catch::Contains("remove " + n.path));
    CHECK(mode_of(n.path) == 0666);  // not "fixed": a writer may still hold a mapping
  }
  SECTION("another owner") {
    if (::geteuid() != 0) {
      WARN("needs root to chown; not run");
      return;
    }
    Names n("owner");
    const int fd = ::open(n.path.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    REQUIRE(fd >= 0);
    REQUIRE(::fchown(fd, 65534, 65534) == 0);
    ::close(fd);
    CHECK_THAT(refusal(n.name), Catch::Contains("is owned by uid 65534, not by vlaked's uid 0"));
  }
  SECTION("a symlink") {
    Names n("link");
    const std::string target = n.other;
    const int fd = ::open(target.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    REQUIRE(fd >= 0);
    ::close(fd);
    REQUIRE(::symlink(target.c_str(), n.path.c_str()) == 0);
    CHECK_THAT(refusal(n.name), Catch::Contains("is a symbolic link"));
    struct stat sb {};
    REQUIRE(::stat(target.c_str(), &sb) == 0);
    CHECK(sb.st_size == 0);  // nothing created through it
  }
  SECTION("a FIFO") {
    Names n("fifo");
    REQUIRE(::mkfifo(n.path.c_str(), 0600) == 0);
    const auto t0 = std::chrono::steady_clock::now();
    CHECK_THAT(refusal(n.name), Catch::Contains("is not a regular file"));
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(1));
  }
  SECTION("a second hard link") {
    Names n("hardlink");
    { st::StateSegment seg(n.name); }
    REQUIRE(::link(n.path.c_str(), n.other.c_str()) == 0);
    CHECK_THAT(refusal(n.name), Catch::Contains("has 2 hard links"));
  }
}

TEST_CASE("state directory: only root and vlaked's user may create names on the way to the segment",
          "[contracts][state]") {
  char tmpl[] = "/tmp/vlake-statedir-XXXXXX";  // /tmp: sticky, so fine above the directory
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  const std::string top = tmpl;
  const std::string dir = top + "/a/b";
  st::prepare_state_dir(dir);  // mkdir -p, 0755
  CHECK(mode_of(top + "/a") == 0755);
  CHECK(mode_of(dir) == 0755);
  CHECK_NOTHROW(st::check_state_dir(dir, static_cast<unsigned>(::geteuid())));

  // The directory itself: no group/other write, sticky or not.
  REQUIRE(::chmod(dir.c_str(), 01777) == 0);
  CHECK_THROWS_WITH(st::check_state_dir(dir, static_cast<unsigned>(::geteuid())),
                    Catch::Contains(dir + " has mode 1777 (group or others may write it)"));
  REQUIRE(::chmod(dir.c_str(), 0775) == 0);
  CHECK_THROWS_WITH(st::prepare_state_dir(dir), Catch::Contains("chmod go-w " + dir));
  REQUIRE(::chmod(dir.c_str(), 0755) == 0);
  // Above it: group/other write only with the sticky bit (nobody renames another's directory).
  REQUIRE(::chmod((top + "/a").c_str(), 0777) == 0);
  CHECK_THROWS_WITH(st::check_state_dir(dir, static_cast<unsigned>(::geteuid())),
                    Catch::Contains(top + "/a has mode 0777"));
  REQUIRE(::chmod((top + "/a").c_str(), 01777) == 0);
  CHECK_NOTHROW(st::check_state_dir(dir, static_cast<unsigned>(::geteuid())));
  REQUIRE(::chmod((top + "/a").c_str(), 0755) == 0);
  // A symbolic link is followed, and the directory it leads to is what is checked.
  const std::string link = top + "/link";
  REQUIRE(::symlink(dir.c_str(), link.c_str()) == 0);
  CHECK_NOTHROW(st::check_state_dir(link, static_cast<unsigned>(::geteuid())));
  if (::geteuid() == 0) {
    // Owned by neither root nor the daemon's uid.
    REQUIRE(::chown(dir.c_str(), 65534, 65534) == 0);
    CHECK_THROWS_WITH(st::check_state_dir(dir, 0),
                      Catch::Contains(dir + " is owned by uid 65534, neither root nor uid 0"));
    CHECK_NOTHROW(st::check_state_dir(dir, 65534));  // a reader trusting that directory's owner
    REQUIRE(::chown(dir.c_str(), 0, 0) == 0);
  }
  CHECK_THROWS_WITH(st::check_state_dir("rel/dir", 0), Catch::Contains("not an absolute path"));
  ::unlink(link.c_str());
  ::rmdir(dir.c_str());
  ::rmdir((top + "/a").c_str());
  ::rmdir(top.c_str());
}

TEST_CASE("state spec: a name in the state directory or an absolute path", "[contracts][state]") {
  CHECK(st::check_state_spec("vlake-state").empty());
  CHECK(st::check_state_spec("/srv/vlake/state").empty());
  CHECK_FALSE(st::check_state_spec("").empty());
  CHECK_FALSE(st::check_state_spec("a/b").empty());
  CHECK_FALSE(st::check_state_spec("..").empty());
  CHECK_FALSE(st::check_state_spec("/srv/").empty());
  CHECK_FALSE(st::check_state_spec(std::string(201, 'x')).empty());
  CHECK(st::segment_path("/srv/vlake/state") == "/srv/vlake/state");
  CHECK(st::segment_path("x") == st::state_dir() + "/x");
}
