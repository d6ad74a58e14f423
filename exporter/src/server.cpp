#include "vlake/exporter/server.hpp"

#include <arpa/inet.h>
#include <civetweb.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <chrono>
#include <cstring>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <thread>

#include <prometheus/text_serializer.h>

namespace vlake::exporter {

namespace {

bool all_digits(const std::string& s) {
  if (s.empty()) return false;
  for (char ch : s) {
    if (std::isdigit(static_cast<unsigned char>(ch)) == 0) return false;
  }
  return true;
}

void reply(mg_connection* conn, int status, const char* status_text, const char* content_type,
           const std::string& body) {
  mg_printf(conn,
            "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\nCache-Control: no-store\r\n"
            "Connection: close\r\n\r\n",
            status, status_text, content_type, body.size());
  const mg_request_info* ri = mg_get_request_info(conn);
  if (ri != nullptr && ri->request_method != nullptr && std::strcmp(ri->request_method, "HEAD") == 0) return;
  mg_write(conn, body.data(), body.size());
}

// Common checks: exact path and GET/HEAD. Returns false when it already answered.
bool accept(mg_connection* conn, const char* path) {
  const mg_request_info* ri = mg_get_request_info(conn);
  if (ri == nullptr || ri->local_uri == nullptr || std::strcmp(ri->local_uri, path) != 0) {
    reply(conn, 404, "Not Found", "text/plain; charset=utf-8", "not found (try /metrics or /healthz)\n");
    return false;
  }
  if (ri->request_method == nullptr ||
      (std::strcmp(ri->request_method, "GET") != 0 && std::strcmp(ri->request_method, "HEAD") != 0)) {
    reply(conn, 405, "Method Not Allowed", "text/plain; charset=utf-8", "only GET\n");
    return false;
  }
  return true;
}

int on_metrics(mg_connection* conn, void* data) noexcept {
  try {
    if (!accept(conn, "/metrics")) return 1;
    const auto* collector = static_cast<const StateCollector*>(data);
    std::ostringstream out;
    prometheus::TextSerializer().Serialize(out, collector->Collect());
    reply(conn, 200, "OK", "text/plain; version=0.0.4; charset=utf-8", out.str());
  } catch (const std::exception& e) {
    reply(conn, 500, "Internal Server Error", "text/plain; charset=utf-8", std::string(e.what()) + "\n");
  } catch (...) {
    return 0;
  }
  return 1;
}

int on_healthz(mg_connection* conn, void* data) noexcept {
  try {
    if (!accept(conn, "/healthz")) return 1;
    const Health h = static_cast<const StateCollector*>(data)->health();
    if (h.up) reply(conn, 200, "OK", "text/plain; charset=utf-8", "ok\n");
    else reply(conn, 503, "Service Unavailable", "text/plain; charset=utf-8", h.reason + "\n");
  } catch (...) {
    return 0;
  }
  return 1;
}

int on_other(mg_connection* conn, void*) noexcept {
  try {
    reply(conn, 404, "Not Found", "text/plain; charset=utf-8", "not found (try /metrics or /healthz)\n");
  } catch (...) {
    return 0;
  }
  return 1;
}

// civetweb logs through this callback; keep its messages off stderr (start-up errors come back
// through mg_start2's error buffer).
int quiet_log(const mg_connection*, const char*) { return 1; }

std::once_flag g_init;

// One TCP connect to host:port, closed at once (non-blocking; errors ignored).
void poke(const std::string& host, int port) noexcept {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  if (::inet_pton(AF_INET, host.c_str(), &a.sin_addr) == 1) {
    (void)::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a);
  }
  ::close(fd);
}

}  // namespace

std::string parse_listen_address(const std::string& address) {
  const auto colon = address.rfind(':');
  if (colon == std::string::npos) {
    throw std::invalid_argument("metrics address '" + address + "' must be [HOST]:PORT (e.g. :19400, 127.0.0.1:19400)");
  }
  const std::string host = address.substr(0, colon);
  const std::string port = address.substr(colon + 1);
  if (!all_digits(port) || port.size() > 5 || std::stoul(port) == 0 || std::stoul(port) > 65535) {
    throw std::invalid_argument("metrics address '" + address + "': port must be 1..65535");
  }
  if (host.empty()) return port;
  if (host.front() == '[') {
    if (host.size() < 3 || host.back() != ']')
      throw std::invalid_argument("metrics address '" + address + "': bad IPv6 host");
    return "+" + host + ":" + port;  // civetweb: "+[::]:PORT" style; IPv6 support depends on its build
  }
  for (char ch : host) {
    if (std::isdigit(static_cast<unsigned char>(ch)) == 0 && ch != '.') {
      throw std::invalid_argument("metrics address '" + address + "': HOST must be an IPv4 address or [IPv6]");
    }
  }
  return host + ":" + port;
}

MetricsServer::MetricsServer(const std::string& address, const std::string& state_name, Exposure exposure)
    : MetricsServer(address, StateCollector::for_segment(state_name, exposure)) {}

MetricsServer::MetricsServer(const std::string& address, std::shared_ptr<StateCollector> collector)
    : address_(address), collector_(std::move(collector)) {
  const std::string ports = parse_listen_address(address);
  std::call_once(g_init, [] { mg_init_library(0); });
  const char* options[] = {"listening_ports",    ports.c_str(), "num_threads", "2", "enable_keep_alive", "no",
                           "request_timeout_ms", "10000",       nullptr};
  mg_callbacks callbacks{};
  callbacks.log_message = quiet_log;
  mg_init_data init{};
  init.callbacks = &callbacks;
  init.user_data = nullptr;
  init.configuration_options = options;
  unsigned code = 0;
  char text[256] = {};
  mg_error_data err{};
  err.code = &code;
  err.text = text;
  err.text_buffer_size = sizeof text;
  ctx_ = mg_start2(&init, &err);
  if (ctx_ == nullptr) {
    throw std::runtime_error("cannot listen on " + address + ": " + (text[0] != 0 ? text : "civetweb failed to start") +
                             " (port in use? see --metrics-address)");
  }
  mg_server_port p{};
  if (mg_get_server_ports(ctx_, 1, &p) == 1 && (p.protocol & 1) != 0) {
    poke_port_ = p.port;
    const auto colon = ports.rfind(':');
    poke_host_ = colon == std::string::npos ? "127.0.0.1" : ports.substr(0, colon);
    if (poke_host_ == "0.0.0.0") poke_host_ = "127.0.0.1";
  }
  mg_set_request_handler(ctx_, "/metrics", on_metrics, collector_.get());
  mg_set_request_handler(ctx_, "/healthz", on_healthz, collector_.get());
  mg_set_request_handler(ctx_, "/", on_other, nullptr);
}

MetricsServer::~MetricsServer() {
  if (ctx_ == nullptr) return;
  // civetweb's listener polls with a 2 s quantum before it notices mg_stop(): wake it with
  // connections so a daemon's shutdown does not wait for it.
  if (poke_port_ > 0) {
    try {
      std::atomic<bool> done{false};
      std::thread stopper([this, &done] {
        mg_stop(ctx_);
        done = true;
      });
      while (!done) {
        poke(poke_host_, poke_port_);
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      stopper.join();
      return;
    } catch (...) {
      // no thread: stop the slow way
    }
  }
  mg_stop(ctx_);
}

}  // namespace vlake::exporter
