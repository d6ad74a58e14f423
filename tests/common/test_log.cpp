// vlake's one logger (common/log.hpp): level names, filtering, the line format, one write per
// line.
#include <sys/stat.h>
#include <unistd.h>
#include <catch2/catch.hpp>

#include <cerrno>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "vlake/common/log.hpp"

using vlake::Logger;
using vlake::LogLevel;

namespace {

// Everything written to the read end of `fds` so far (the write end closed first).
std::string drain(int fds[2]) {
  ::close(fds[1]);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) out.append(buf, static_cast<std::size_t>(n));
  ::close(fds[0]);
  return out;
}

}  // namespace

TEST_CASE("log: level names", "[common][log]") {
  CHECK(vlake::parse_log_level("debug") == LogLevel::debug);
  CHECK(vlake::parse_log_level("info") == LogLevel::info);
  CHECK(vlake::parse_log_level("warn") == LogLevel::warn);
  CHECK(vlake::parse_log_level("WARNING") == LogLevel::warn);
  CHECK(vlake::parse_log_level("Error") == LogLevel::error);
  CHECK_THROWS_WITH(vlake::parse_log_level("loud"), "unknown log level 'loud' (debug, info, warn, error)");
  CHECK_THROWS_AS(vlake::parse_log_level(""), std::invalid_argument);
  for (LogLevel l : {LogLevel::debug, LogLevel::info, LogLevel::warn, LogLevel::error}) {
    CHECK(vlake::parse_log_level(vlake::to_string(l)) == l);
  }
}

TEST_CASE("log: lines below the level are dropped, the rest written whole", "[common][log]") {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  Logger log("vlaked[7]", LogLevel::info, fds[1]);
  CHECK_FALSE(log.enabled(LogLevel::debug));
  CHECK(log.enabled(LogLevel::warn));
  log.debug("not shown");
  log.info("started");
  log.set_level(LogLevel::error);
  log.warn("not shown either");
  log.error("failed: x");
  log.set_level(LogLevel::debug);
  log.debug(std::string(10000, 'z'));  // longer than the stack buffer
  errno = EAGAIN;
  log.info("errno is kept");
  CHECK(errno == EAGAIN);
  CHECK(drain(fds) == "vlaked[7]: info: started\nvlaked[7]: error: failed: x\nvlaked[7]: debug: " +
                          std::string(10000, 'z') + "\nvlaked[7]: info: errno is kept\n");
}

TEST_CASE("log: the default tag is the program's name and pid", "[common][log]") {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const Logger log(LogLevel::info, fds[1]);
  log.warn("hello");
  CHECK(drain(fds) ==
        std::string(program_invocation_short_name) + "[" + std::to_string(::getpid()) + "]: warn: hello\n");
}

TEST_CASE("log: on the journal's stream every line starts with its syslog priority", "[common][log]") {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  struct stat st {};
  REQUIRE(::fstat(fds[1], &st) == 0);
  const char* before = std::getenv("JOURNAL_STREAM");
  const std::string saved = before != nullptr ? before : "";
  ::setenv("JOURNAL_STREAM", (std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino)).c_str(), 1);
  Logger log("vlaked[7]", LogLevel::debug, fds[1]);
  ::setenv("JOURNAL_STREAM", "1:2", 1);  // another stream: plain lines
  Logger other("vlaked[7]", LogLevel::debug, fds[1]);
  if (before != nullptr) ::setenv("JOURNAL_STREAM", saved.c_str(), 1);
  else ::unsetenv("JOURNAL_STREAM");
  CHECK(log.journal());
  CHECK_FALSE(other.journal());
  log.error("failed");
  log.warn("careful");
  log.info("started");
  log.debug("detail");
  log.info(std::string(5000, 'z'));  // longer than the stack buffer
  other.error("plain");
  CHECK(drain(fds) ==
        "<3>vlaked[7]: error: failed\n<4>vlaked[7]: warn: careful\n<6>vlaked[7]: info: started\n"
        "<7>vlaked[7]: debug: detail\n<6>vlaked[7]: info: " +
            std::string(5000, 'z') + "\nvlaked[7]: error: plain\n");
}

TEST_CASE("log: format_log_line truncates the message, never the newline", "[common][log]") {
  char buf[16];
  std::size_t n = vlake::format_log_line(buf, sizeof buf, "vlake", LogLevel::warn, false, "out of memory on GPU 0");
  CHECK(std::string(buf, n) == "vlake: out of m\n");
  n = vlake::format_log_line(buf, sizeof buf, "t", LogLevel::error, true, "x");
  CHECK(std::string(buf, n) == "t: error: x\n");
  CHECK(vlake::format_log_line(buf, 1, "t", LogLevel::error, true, "x") == 0);
}

TEST_CASE("log: lines from many threads never interleave", "[common][log]") {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  Logger log("t", LogLevel::info, fds[1]);
  std::string out;
  std::thread reader([&] {
    char buf[4096];
    for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) out.append(buf, static_cast<std::size_t>(n));
  });
  std::vector<std::thread> writers;
  for (int w = 0; w < 4; ++w) {
    writers.emplace_back([&log, w] {
      for (int i = 0; i < 200; ++i) log.info(std::string(100, static_cast<char>('a' + w)));
    });
  }
  for (auto& t : writers) t.join();
  ::close(fds[1]);
  reader.join();
  ::close(fds[0]);
  std::size_t lines = 0;
  for (std::size_t pos = 0; pos < out.size(); ++lines) {
    const std::size_t nl = out.find('\n', pos);
    REQUIRE(nl != std::string::npos);
    const std::string line = out.substr(pos, nl - pos);
    REQUIRE(line.size() == 109);
    CHECK(line.substr(0, 9) == "t: info: ");
    CHECK(line.find_first_not_of(line[9], 9) == std::string::npos);
    pos = nl + 1;
  }
  CHECK(lines == 800);
}
