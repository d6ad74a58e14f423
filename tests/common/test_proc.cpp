// /proc and file-system helpers (common/proc.hpp).
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <system_error>

#include "vlake/common/proc.hpp"

TEST_CASE("proc: start time of this process, a child and a process that is gone", "[common][proc]") {
  const std::uint64_t self = vlake::process_start_time(static_cast<std::uint32_t>(::getpid()));
  CHECK(self != 0);
  CHECK(vlake::process_start_time(static_cast<std::uint32_t>(::getpid())) == self);  // stable
  const auto s = vlake::read_proc_stat(static_cast<std::uint32_t>(::getpid()));
  REQUIRE(s);
  CHECK(s->state == 'R');
  CHECK(s->start_time == self);

  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::pause();
    ::_exit(0);
  }
  CHECK(vlake::process_start_time(static_cast<std::uint32_t>(child)) >= self);
  ::kill(child, SIGKILL);
  for (int i = 0; i < 1000; ++i) {  // a zombie until reaped
    const auto z = vlake::read_proc_stat(static_cast<std::uint32_t>(child));
    if (z && z->state == 'Z') break;
    ::usleep(1000);
  }
  CHECK(vlake::read_proc_stat(static_cast<std::uint32_t>(child))->state == 'Z');
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK(vlake::process_start_time(static_cast<std::uint32_t>(child)) == 0);
  CHECK_FALSE(vlake::read_proc_stat(static_cast<std::uint32_t>(child)));
  CHECK(vlake::process_start_time(0) == 0);
}

TEST_CASE("proc: mkdir_p creates missing parents with the mode, umask or not", "[common][proc]") {
  char tmpl[] = "/tmp/vlake-mkdir-XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  const std::string root = tmpl;
  const mode_t old = ::umask(077);
  vlake::mkdir_p(root + "/a/b/c/", 0751);
  vlake::mkdir_p(root + "/a/b/c");  // exists: nothing to do
  vlake::mkdir_p("");
  ::umask(old);
  struct stat st {};
  REQUIRE(::stat((root + "/a/b/c").c_str(), &st) == 0);
  CHECK(S_ISDIR(st.st_mode));
  CHECK((st.st_mode & 07777) == 0751);
  REQUIRE(::stat((root + "/a").c_str(), &st) == 0);
  CHECK((st.st_mode & 07777) == 0751);
  REQUIRE(::stat(root.c_str(), &st) == 0);
  CHECK((st.st_mode & 07777) == 0700);  // existing: left alone

  // A file in the way: the error names the path.
  REQUIRE(::close(::open((root + "/file").c_str(), O_CREAT | O_WRONLY, 0600)) == 0);
  try {
    vlake::mkdir_p(root + "/file/sub");
    FAIL("no error");
  } catch (const std::system_error& e) {
    CHECK_THAT(e.what(), Catch::Contains("mkdir " + root + "/file/sub"));
  }
  CHECK(std::system(("rm -rf " + root).c_str()) == 0);
}
