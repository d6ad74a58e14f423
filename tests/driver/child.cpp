// Child-process helper of the conformance suite. A CUDA process cannot fork after cuInit, so
// cross-process cases run this program (fresh exec) with one end of a socket pair:
//
//   vlake_driver_child <socket-fd> export-exit <bytes> <byte-pattern>
//     creates a handle, fills it with the pattern, sends its exported fd, and exits (releasing
//     everything it held) once the parent acknowledges.
//   vlake_driver_child <socket-fd> import-write <byte-pattern>
//     receives an fd and a size, imports and maps it, fills it with the pattern, reports back.
//   vlake_driver_child <socket-fd> illegal <past-end|read-only|after-unmap|no-access>
//     makes a kernel write to memory it may not write and reports every status it saw.
//   vlake_driver_child <socket-fd> hold <own|import> <bytes> <byte-pattern>
//     creates (own) or receives and imports (import) the memory, maps and fills it, reports 1,
//     then answers each command: 1 = verify (replies 1 when every byte still holds the pattern,
//     0 when not, 2 when the read failed), 0 = exit. The checkpoint cases lock, checkpoint and
//     restore it meanwhile.
//
// Exit status 0 when the protocol ran to the end; the parent checks the data and statuses.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "support.hpp"
#include "vlake/common/unix_socket.hpp"

using namespace vlake;
using vlake::test::status_of;

namespace {

std::unique_ptr<Driver> open_from_env() {
  const char* lib = std::getenv(vlake::test::kDriverEnv);
  return open_driver(lib != nullptr && *lib != '\0' ? lib : "libcuda.so.1");
}

void send_bytes(int sock, const void* p, std::size_t n, std::span<const int> fds = {}) {
  send_with_fds(sock, std::span(static_cast<const std::byte*>(p), n), fds);
}

int export_exit(int sock, Bytes size, std::uint8_t pattern) {
  auto d = open_from_env();
  const DeviceOrdinal dev{0};
  const PhysicalHandle h = d->create(dev, size);
  const DevicePtr va = d->reserve(size, Bytes{0});
  d->map(va, size, h);
  d->set_access(va, size, dev, Access::read_write);
  d->fill_u8(va, pattern, size);
  UniqueFd fd = d->export_fd(h);
  const int fds[] = {fd.get()};
  const std::uint64_t n = size.value();
  send_bytes(sock, &n, sizeof n, fds);
  std::byte ack[8];
  if (recv_with_fds(sock, ack).bytes == 0) return 3;
  d->unmap(va, size);
  d->free_reservation(va, size);
  d->release(h);
  return 0;
}

int import_write(int sock, std::uint8_t pattern) {
  auto d = open_from_env();
  const DeviceOrdinal dev{0};
  std::uint64_t n = 0;
  Received r = recv_with_fds(sock, std::as_writable_bytes(std::span(&n, 1)));
  if (r.bytes != sizeof n || r.fds.size() != 1) return 4;
  const Bytes size{n};
  const PhysicalHandle h = d->import_fd(r.fds[0].get());
  const DevicePtr va = d->reserve(size, Bytes{0});
  d->map(va, size, h);
  d->set_access(va, size, dev, Access::read_write);
  d->fill_u8(va, pattern, size);
  d->synchronize();
  const std::uint64_t done = 1;
  send_bytes(sock, &done, sizeof done);
  d->unmap(va, size);
  d->free_reservation(va, size);
  d->release(h);
  return 0;
}

int illegal(int sock, const std::string& kind) {
  auto d = open_from_env();
  const DeviceOrdinal dev{0};
  const Bytes g = d->granularity(dev);
  const PhysicalHandle h = d->create(dev, g);
  const DevicePtr va = d->reserve(g * 2, Bytes{0});
  d->map(va, g, h);
  // A second, valid buffer to read from after the fault.
  const PhysicalHandle ok = d->create(dev, g);
  const DevicePtr ok_va = d->reserve(g, Bytes{0});
  d->map(ok_va, g, ok);
  d->set_access(ok_va, g, dev, Access::read_write);

  DevicePtr target = va;
  std::uint64_t words = 16;
  if (kind == "past-end") {
    d->set_access(va, g, dev, Access::read_write);
    words = g.value() / 4 + 1;  // one word past the mapping, into reserved-but-unmapped VA
  } else if (kind == "read-only") {
    d->set_access(va, g, dev, Access::read);
  } else if (kind == "after-unmap") {
    d->set_access(va, g, dev, Access::read_write);
    d->unmap(va, g);
  } else if (kind == "no-access") {
    // mapped, never given access
  } else {
    return 5;
  }
  test::IllegalAccessReport rep{};
  rep.launch = status_of([&] { d->fill_u32_kernel(target, 0xdeadbeef, words); });
  rep.first_sync = status_of([&] { d->synchronize(); });
  rep.second_sync = status_of([&] { d->synchronize(); });
  std::uint32_t word = 0;
  rep.copy_after = status_of([&] { d->copy_to_host(&word, ok_va, Bytes{4}); });
  rep.create_after = status_of([&] { d->release(d->create(dev, g)); });
  send_bytes(sock, &rep, sizeof rep);
  return 0;
}

int hold(int sock, const std::string& how, Bytes size, std::uint8_t pattern) {
  auto d = open_from_env();
  const DeviceOrdinal dev{0};
  PhysicalHandle h{};
  if (how == "own") {
    h = d->create(dev, size);
  } else {
    std::uint64_t n = 0;
    Received r = recv_with_fds(sock, std::as_writable_bytes(std::span(&n, 1)));
    if (r.bytes != sizeof n || r.fds.size() != 1 || n != size.value()) return 4;
    h = d->import_fd(r.fds[0].get());
  }
  const DevicePtr va = d->reserve(size, Bytes{0});
  d->map(va, size, h);
  d->release(h);  // the mapping keeps it
  d->set_access(va, size, dev, Access::read_write);
  d->fill_u8(va, pattern, size);
  d->synchronize();
  const std::uint64_t ready = 1;
  send_bytes(sock, &ready, sizeof ready);
  std::vector<std::uint8_t> buf(size.value());
  for (;;) {
    std::uint64_t cmd = 0;
    if (recv_with_fds(sock, std::as_writable_bytes(std::span(&cmd, 1))).bytes != sizeof cmd) return 3;
    if (cmd == 0) break;
    std::uint64_t verdict = 2;
    if (status_of([&] { d->copy_to_host(buf.data(), va, size); }) == 0) {
      verdict = std::all_of(buf.begin(), buf.end(), [&](std::uint8_t b) { return b == pattern; }) ? 1 : 0;
    }
    send_bytes(sock, &verdict, sizeof verdict);
  }
  d->unmap(va, size);
  d->free_reservation(va, size);
  return 0;
}

}  // namespace

int main(int argc, char* argv[]) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s <socket-fd> <mode> [args]\n", argv[0]);
    return 2;
  }
  const int sock = std::atoi(argv[1]);
  const std::string mode = argv[2];
  try {
    if (mode == "export-exit" && argc == 5) {
      return export_exit(sock, Bytes{std::strtoull(argv[3], nullptr, 10)},
                         static_cast<std::uint8_t>(std::strtoul(argv[4], nullptr, 0)));
    }
    if (mode == "import-write" && argc == 4) {
      return import_write(sock, static_cast<std::uint8_t>(std::strtoul(argv[3], nullptr, 0)));
    }
    if (mode == "illegal" && argc == 4) return illegal(sock, argv[3]);
    if (mode == "hold" && argc == 6 && (std::strcmp(argv[3], "own") == 0 || std::strcmp(argv[3], "import") == 0)) {
      return hold(sock, argv[3], Bytes{std::strtoull(argv[4], nullptr, 10)},
                  static_cast<std::uint8_t>(std::strtoul(argv[5], nullptr, 0)));
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "driver child (%s): %s\n", mode.c_str(), e.what());
    return 1;
  }
  std::fprintf(stderr, "driver child: bad arguments for mode %s\n", mode.c_str());
  return 2;
}
