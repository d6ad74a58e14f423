// vlake::exporter::MetricsServer — the HTTP endpoint of the exporter (civetweb):
//   GET /metrics  the collector's families in the Prometheus text format
//                 (Content-Type: text/plain; version=0.0.4)
//   GET /healthz  200 "ok" when vlake_daemon_up would be 1, else 503 and the reason
//   anything else 404 (other methods on those paths: 405)
//
// Addresses: "[HOST]:PORT" — ":19400" (all interfaces), "127.0.0.1:19400", "[::1]:19400".
// Port 0 is not supported. parse_listen_address() validates and returns civetweb's
// listening_ports form; throws std::invalid_argument with a one-line message.
//
// Lifecycle: the constructor starts civetweb's own threads (2 workers) and throws
// std::runtime_error when it cannot listen (e.g. the port is in use); the destructor stops
// them (waits for requests in flight). Thread-safety: the object itself is not shared.
#pragma once

#include <memory>
#include <string>

#include "vlake/exporter/collector.hpp"

struct mg_context;

namespace vlake::exporter {

std::string parse_listen_address(const std::string& address);

class MetricsServer {
 public:
  MetricsServer(const std::string& address, std::shared_ptr<StateCollector> collector);
  // Convenience: a collector over the state segment `state_name`, showing what `exposure` allows.
  MetricsServer(const std::string& address, const std::string& state_name, Exposure exposure = {});
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // The address as given (for logs).
  [[nodiscard]] const std::string& address() const noexcept { return address_; }
  [[nodiscard]] const StateCollector& collector() const noexcept { return *collector_; }

 private:
  std::string address_;
  std::shared_ptr<StateCollector> collector_;
  mg_context* ctx_ = nullptr;
  std::string poke_host_;  // IPv4 address that reaches the listener (to wake it on stop)
  int poke_port_ = 0;
};

}  // namespace vlake::exporter
