#include "http_get.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <limits>
#include <sstream>
#include <stdexcept>

namespace vlake::exptest {

namespace {

sockaddr_in loopback(int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return a;
}

struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

int free_port() {
  Fd s{::socket(AF_INET, SOCK_STREAM, 0)};
  if (s.fd < 0) throw std::runtime_error("socket failed");
  sockaddr_in a = loopback(0);
  if (::bind(s.fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) throw std::runtime_error("bind failed");
  socklen_t len = sizeof a;
  if (::getsockname(s.fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) throw std::runtime_error("getsockname");
  return ntohs(a.sin_port);
}

int listen_loopback(int backlog, int& port) {
  Fd s{::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)};
  if (s.fd < 0) throw std::runtime_error("socket failed");
  sockaddr_in a = loopback(0);
  if (::bind(s.fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(s.fd, backlog) != 0) {
    throw std::runtime_error("bind/listen failed");
  }
  socklen_t len = sizeof a;
  if (::getsockname(s.fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) throw std::runtime_error("getsockname");
  port = ntohs(a.sin_port);
  const int fd = s.fd;
  s.fd = -1;
  return fd;
}

std::map<std::string, std::string> header_fields(std::istream& lines) {
  std::map<std::string, std::string> fields;
  std::string line;
  while (std::getline(lines, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string k = line.substr(0, colon);
    for (char& ch : k) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    std::string v = line.substr(colon + 1);
    while (!v.empty() && v.front() == ' ') v.erase(0, 1);
    fields[k] = v;
  }
  return fields;
}

HttpResponse http_get(int port, const std::string& path, const std::string& method) {
  Fd s{::socket(AF_INET, SOCK_STREAM, 0)};
  if (s.fd < 0) throw std::runtime_error("socket failed");
  sockaddr_in a = loopback(port);
  if (::connect(s.fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    throw std::runtime_error("connect to port " + std::to_string(port) + ": " + std::strerror(errno));
  }
  const std::string req = method + " " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  if (::send(s.fd, req.data(), req.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(req.size())) {
    throw std::runtime_error("send failed");
  }
  std::string raw;
  char buf[8192];
  for (;;) {
    pollfd p{s.fd, POLLIN, 0};
    if (::poll(&p, 1, 5000) <= 0) throw std::runtime_error("timeout reading the HTTP response");
    const ssize_t n = ::recv(s.fd, buf, sizeof buf, 0);
    if (n < 0) throw std::runtime_error(std::string("recv: ") + std::strerror(errno));
    if (n == 0) break;
    raw.append(buf, static_cast<std::size_t>(n));
  }
  const auto end = raw.find("\r\n\r\n");
  if (end == std::string::npos) throw std::runtime_error("no HTTP header in: " + raw);
  HttpResponse r;
  std::istringstream head(raw.substr(0, end));
  std::string line;
  std::getline(head, line);
  if (line.rfind("HTTP/1.", 0) != 0 || line.size() < 12) throw std::runtime_error("bad status line: " + line);
  r.status = std::stoi(line.substr(9, 3));
  r.headers = header_fields(head);
  r.body = raw.substr(end + 4);
  return r;
}

std::vector<Sample> Exposition::find(const std::string& name, const std::map<std::string, std::string>& match) const {
  std::vector<Sample> out;
  for (const Sample& s : samples) {
    if (s.name != name) continue;
    bool ok = true;
    for (const auto& [k, v] : match) {
      const auto it = s.labels.find(k);
      ok = ok && it != s.labels.end() && it->second == v;
    }
    if (ok) out.push_back(s);
  }
  return out;
}

double Exposition::value(const std::string& name, const std::map<std::string, std::string>& match) const {
  const auto f = find(name, match);
  if (f.size() != 1) {
    throw std::runtime_error(std::to_string(f.size()) + " samples of " + name + " match (want exactly 1)");
  }
  return f.front().value;
}

Exposition parse_prometheus(const std::string& text) {
  Exposition e;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    if (line.rfind("# TYPE ", 0) == 0) {
      std::istringstream t(line.substr(7));
      std::string name, type;
      t >> name >> type;
      e.types[name] = type;
      continue;
    }
    if (line[0] == '#') continue;
    Sample s;
    std::size_t i = 0;
    while (i < line.size() && line[i] != '{' && line[i] != ' ') ++i;
    s.name = line.substr(0, i);
    if (i < line.size() && line[i] == '{') {
      ++i;
      while (i < line.size() && line[i] != '}') {
        const auto eq = line.find('=', i);
        if (eq == std::string::npos || eq + 1 >= line.size() || line[eq + 1] != '"') {
          throw std::runtime_error("bad labels: " + line);
        }
        const std::string key = line.substr(i, eq - i);
        std::string value;
        std::size_t j = eq + 2;
        for (; j < line.size() && line[j] != '"'; ++j) {
          if (line[j] == '\\' && j + 1 < line.size()) {
            ++j;
            value += line[j] == 'n' ? '\n' : line[j];
          } else {
            value += line[j];
          }
        }
        if (j >= line.size()) throw std::runtime_error("unterminated label value: " + line);
        s.labels[key] = value;
        i = j + 1;
        if (i < line.size() && line[i] == ',') ++i;
      }
      if (i >= line.size()) throw std::runtime_error("unterminated labels: " + line);
      ++i;
    }
    while (i < line.size() && line[i] == ' ') ++i;
    const std::string rest = line.substr(i);
    const std::string num = rest.substr(0, rest.find(' '));
    if (num == "+Inf") s.value = std::numeric_limits<double>::infinity();
    else if (num == "-Inf") s.value = -std::numeric_limits<double>::infinity();
    else s.value = std::stod(num);
    e.samples.push_back(std::move(s));
  }
  return e;
}

}  // namespace vlake::exptest
