#include "vlake/ctl/app.hpp"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "vlake/ctl/quota_check.hpp"
#include "vlake/ctl/render.hpp"
#include "vlake/ctl/state_source.hpp"
#include "vlake/ctl/view.hpp"

namespace vlake::ctl {

namespace {

constexpr const char* kClearScreen = "\x1b[H\x1b[2J";

NodeView read_view(const std::string& state) {
  const StateSource src(state);
  const auto s = src.snapshot();
  timespec now{};
  ::clock_gettime(CLOCK_REALTIME, &now);
  const std::uint64_t now_ns =
      static_cast<std::uint64_t>(now.tv_sec) * 1'000'000'000ull + static_cast<std::uint64_t>(now.tv_nsec);
  return build_view(*s, process_alive(s->header.daemon_pid, s->header.daemon_start_time), now_ns);
}

// read_view() into `v`; a state that cannot be read is reported on `err` (false).
bool read_view_or_report(const std::string& state, NodeView& v, std::ostream& err) {
  try {
    v = read_view(state);
    return true;
  } catch (const StateAccessError& e) {
    err << "vlakectl: " << e.what() << "\n";
    return false;
  }
}

std::string render(const CtlOptions& o, const NodeView& v, const std::string& stamp) {
  switch (o.command) {
    case Command::top: return o.json ? render_top_json(v, o.state) : render_top_text(v, o.state, stamp);
    case Command::tenants: return o.json ? render_tenants_json(v, o.state) : render_tenants_text(v, o.state);
    case Command::processes: return o.json ? render_processes_json(v, o.state) : render_processes_text(v, o.state);
    case Command::waits: return o.json ? render_waits_json(v, o.state) : render_waits_text(v, o.state);
    case Command::pool: return o.json ? render_pool_json(v, o.state) : render_pool_text(v, o.state);
    case Command::events: return o.json ? render_events_json(v, o.state) : render_events_text(v, o.state);
    default: return "";
  }
}

std::string wall_clock() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  ::localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

}  // namespace

int App::run(const CtlOptions& o) {
  try {
    if (o.command == Command::quota_check) return quota_check(o);
    if (o.command == Command::quota_grammar) {
      out_ << (o.json ? render_grammar_json() : render_grammar_text());
      out_.flush();
      return 0;
    }
    if (o.command == Command::none) {
      err_ << "vlakectl: no command given (top, tenants, processes, waits, pool, events or quota check FILE)\n";
      return 2;
    }
    if (o.watch_seconds) return watch(o);
    return run_state_command(o);
  } catch (const std::exception& e) {
    err_ << "vlakectl: internal error: " << e.what() << "\n";
    return 2;
  }
}

int App::run_state_command(const CtlOptions& o) {
  NodeView v;
  if (!read_view_or_report(o.state, v, err_)) return 2;
  out_ << render(o, v, "");
  out_.flush();
  return 0;
}

int App::watch(const CtlOptions& o) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  if (::pthread_sigmask(SIG_BLOCK, &set, nullptr) != 0) {
    err_ << "vlakectl: cannot block SIGINT\n";
    return 2;
  }
  // The first snapshot must work: a watch on a state that does not exist is an error.
  NodeView v;
  if (!read_view_or_report(o.state, v, err_)) return 2;
  const double secs = *o.watch_seconds;
  timespec period{};
  period.tv_sec = static_cast<time_t>(secs);
  period.tv_nsec = static_cast<long>(std::lround((secs - std::floor(secs)) * 1e9));
  if (period.tv_nsec >= 1000000000L) {
    ++period.tv_sec;
    period.tv_nsec -= 1000000000L;
  }
  for (bool first = true;; first = false) {
    std::string frame;
    if (!first) {
      try {
        v = read_view(o.state);
        frame = render(o, v, wall_clock());
      } catch (const StateAccessError& e) {
        // The daemon may be restarting: show why and keep watching.
        frame = wall_clock() + "\nvlakectl: " + std::string(e.what()) + "\n";
      }
    } else {
      frame = render(o, v, wall_clock());
    }
    if (tty_) {
      out_ << kClearScreen;
    } else if (!first) {
      out_ << "\n";
    }
    out_ << frame;
    out_.flush();
    if (!out_) return 2;  // stdout gone
    // Sleep one period, or return at SIGINT/SIGTERM.
    timespec left = period;
    for (;;) {
      const int sig = ::sigtimedwait(&set, nullptr, &left);
      if (sig == SIGINT || sig == SIGTERM) return 0;
      if (sig < 0 && errno == EAGAIN) break;    // the period passed
      if (sig < 0 && errno == EINTR) continue;  // another signal (e.g. SIGWINCH handler)
      break;
    }
  }
}

int App::quota_check(const CtlOptions& o) {
  QuotaCheckResult r;
  if (o.quota_file == "-") {
    std::ostringstream text;
    text << in_.rdbuf();
    r = check_quota_text(text.str(), "<stdin>", o.gpu_memory);
  } else {
    r = check_quota_file(o.quota_file, o.gpu_memory);
  }
  if (o.json) {
    out_ << render_quota_json(r);
  } else if (r.ok) {
    out_ << render_quota_text(r);
  } else {
    err_ << render_quota_text(r);
  }
  out_.flush();
  return r.ok ? 0 : 1;
}

int main_entry(int argc, const char* const* argv) {
  try {
    std::vector<std::string> args;
    for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
    CtlOptions o;
    try {
      o = CtlOptions::parse(args, std::getenv("VLAKE_STATE"));
    } catch (const UsageError& e) {
      std::cerr << "vlakectl: " << e.what() << "\n"
                << "try 'vlakectl --help'\n";
      return 2;
    }
    if (o.help) {
      std::cout << CtlOptions::usage();
      std::cout.flush();
      return 0;
    }
    App app(std::cout, std::cerr, ::isatty(STDOUT_FILENO) == 1);
    return app.run(o);
  } catch (...) {
    return 2;
  }
}

}  // namespace vlake::ctl
