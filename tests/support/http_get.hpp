// Test helpers: a plain-socket HTTP/1.0 GET against 127.0.0.1, a free TCP port, and a parser
// of the Prometheus text format (enough for vlake's output: no escapes beyond \" \\ \n).
//
// Contract: http_get() throws std::runtime_error on connect/IO failure or a 5 s timeout;
// parse_prometheus() throws std::runtime_error on a line it cannot read. Not thread-safe.
#pragma once

#include <cstdint>
#include <istream>
#include <map>
#include <string>
#include <vector>

namespace vlake::exptest {

struct HttpResponse {
  int status = 0;
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;
};
HttpResponse http_get(int port, const std::string& path, const std::string& method = "GET");

// Binds 127.0.0.1:0, reads the port, closes the socket.
int free_port();
// A TCP socket listening on 127.0.0.1 at a free port (close-on-exec); returns the descriptor
// (the caller closes it) and sets `port`. Throws std::runtime_error.
int listen_loopback(int backlog, int& port);
// The "Name: value" lines of an HTTP header (after the status or request line) up to the end of
// `lines`: lower-case names, values without leading spaces or a trailing '\r'.
std::map<std::string, std::string> header_fields(std::istream& lines);

struct Sample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};
struct Exposition {
  std::map<std::string, std::string> types;  // family -> "gauge" | "counter" | "histogram" ...
  std::vector<Sample> samples;
  // Samples of `name` whose labels include all of `match`.
  [[nodiscard]] std::vector<Sample> find(const std::string& name,
                                         const std::map<std::string, std::string>& match = {}) const;
  // The one sample of `name` matching `match` (throws if none or several).
  [[nodiscard]] double value(const std::string& name, const std::map<std::string, std::string>& match = {}) const;
};
Exposition parse_prometheus(const std::string& text);

}  // namespace vlake::exptest
