// Several GPUs end to end, on a simulated node with two devices: per-GPU limits and views,
// peer access to served memory (cuCtxEnablePeerAccess), and NCCL's cuMem flow (a served handle
// exported, its descriptor sent over a Unix socket, imported and mapped by a process on the
// other GPU). docs/hook.md, "Several GPUs".
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "tenant_process.hpp"
#include "vlake/contracts/state.hpp"

using namespace vlake;
using namespace vlake::e2e;
using pooltest::DaemonProcess;
using pooltest::tenant;

namespace {

constexpr int kInvalidValue = 1;       // CUDA_ERROR_INVALID_VALUE: a copy without access
constexpr int kAlreadyEnabled = 704;   // CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED
constexpr int kNotEnabled = 705;       // CUDA_ERROR_PEER_ACCESS_NOT_ENABLED
constexpr int kPeerUnsupported = 217;  // CUDA_ERROR_PEER_ACCESS_UNSUPPORTED
constexpr unsigned kReadWrite = 3;     // CU_MEM_ACCESS_FLAGS_PROT_READWRITE

// The tenant's held bytes on GPU `dev` (granted + retained), 0 if it is not in the state.
std::uint64_t held(const DaemonProcess& d, const std::string& name, int dev) {
  const auto s = state::StateReader(d.state).snapshot();
  const auto* t = tenant(*s, name);
  return t == nullptr ? 0 : t->granted[dev] + t->retained[dev];
}

// A path for a file or socket the tenants of a case share (removed by the destructor).
struct TempPath {
  explicit TempPath(const std::string& tag)
      : path("/tmp/vlake-mgpu-" + std::to_string(::getpid()) + "-" + tag + "-" +
             std::to_string(std::chrono::steady_clock::now().time_since_epoch().count() % 1000000)) {}
  ~TempPath() { ::unlink(path.c_str()); }
  void touch() const {
    const int fd = ::open(path.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0666);
    if (fd >= 0) ::close(fd);
  }
  std::string path;
};

std::string run_ctl(const std::vector<std::string>& args) {
  std::string cmd = VLAKECTL_PATH;
  for (const auto& a : args) cmd += " '" + a + "'";
  std::string out;
  if (FILE* p = ::popen(cmd.c_str(), "r")) {
    std::array<char, 4096> buf{};
    std::size_t n = 0;
    while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
    ::pclose(p);
  }
  return out;
}

}  // namespace

TEST_CASE("two GPUs: each has its own limit and views and the state and vlakectl show both", "[e2e][gpus]") {
  DaemonProcess d("gpus", "version: 1\ndefault:\n  limit: 64MiB\n");
  d.devices = 2;
  REQUIRE(d.start());
  TempPath go("go");
  TenantProcess t(d, {"init", "alloc:a:48M", "info#gpu0", "ctx:1", "info#gpu1-before", "totalmem", "nvml:1#before",
                      "alloc:b:48M", "alloc:c:32M", "info#full1", "nvml:1#after", "ctx:0", "alloc:d:8M",
                      "info#gpu0-after", "totalmem#gpu0", "nvml:0", "waitfile:" + go.path});
  const auto last = t.wait_line("info#gpu0-after");
  REQUIRE(!last.empty());
  // While it runs: the state segment and vlakectl, per GPU.
  CHECK(held(d, "uid:0", 0) == 56 * MiB);
  CHECK(held(d, "uid:0", 1) == 48 * MiB);
  const std::string top = run_ctl({"--state", d.state, "top"});
  INFO(top);
  const auto gpu1 = top.find("\nGPU 1 ");
  REQUIRE(top.find("\nGPU 0 ") != std::string::npos);
  REQUIRE(gpu1 != std::string::npos);
  CHECK(top.find("56.0 MiB", top.find("\nGPU 0 ")) < gpu1);
  CHECK(top.find("48.0 MiB", gpu1) != std::string::npos);
  go.touch();
  REQUIRE(exited_ok(t.finish()));
  INFO(t.out() << t.err());
  CHECK(t.line("alloc:a")["rc"] == "0");
  CHECK(t.line("info#gpu0")["total"] == std::to_string(64 * MiB));
  CHECK(t.line("info#gpu0")["free"] == std::to_string(16 * MiB));
  // GPU 1 starts empty: GPU 0's allocations are not charged there.
  CHECK(t.line("info#gpu1-before")["total"] == std::to_string(64 * MiB));
  CHECK(t.line("info#gpu1-before")["free"] == std::to_string(64 * MiB));
  CHECK(t.line("totalmem")["bytes"] == std::to_string(64 * MiB));
  CHECK(t.line("nvml:1#before")["total"] == std::to_string(64 * MiB));
  CHECK(t.line("nvml:1#before")["used"] == "0");
  // Refused at GPU 1's own limit, with GPU 0 at 48 MiB of its own.
  CHECK(t.line("alloc:b")["rc"] == "0");
  CHECK(t.line("alloc:c")["rc"] == std::to_string(kOutOfMemory));
  CHECK(t.err().find("out of memory on GPU 1") != std::string::npos);
  CHECK(t.line("info#full1")["free"] == std::to_string(16 * MiB));
  CHECK(t.line("nvml:1#after")["used"] == std::to_string(48 * MiB));
  CHECK(t.line("alloc:d")["rc"] == "0");
  CHECK(t.line("info#gpu0-after")["free"] == std::to_string(8 * MiB));
  CHECK(t.line("totalmem#gpu0")["bytes"] == std::to_string(64 * MiB));
  CHECK(t.line("nvml:0")["used"] == std::to_string(56 * MiB));
}

TEST_CASE("served memory of GPU 1 is reachable from GPU 0 only after cuCtxEnablePeerAccess", "[e2e][gpus][peer]") {
  DaemonProcess d("peer", "version: 1\ndefault:\n  limit: 256MiB\n");
  d.devices = 2;
  REQUIRE(d.start());
  // pre: allocated before enabling; r: freed into the local reserve before enabling and taken
  // back after (reused); post: a fresh grant after enabling.
  TenantProcess t(d,
                  {"init",
                   "ctx:1",
                   "alloc:pre:4M",
                   "alloc:r:6M",
                   "free:r",
                   "ctx:0",
                   "memset:pre:0:4096:7#before",
                   "access:pre:0#before",
                   "peer:1",
                   "peer:1#again",
                   "memset:pre:0:4096:7#after",
                   "access:pre:0#after",
                   "access:pre:1#after",
                   "ctx:1",
                   "alloc:post:8M",
                   "alloc:reused:6M",
                   "fill:post:8M:3",
                   "ctx:0",
                   "memset:post:0:8M:9",
                   "memset:reused:0:6M:9",
                   "kfill:post:0:1024:0x09090909",
                   "sync#peer",
                   "ctx:1",
                   "check:post:4096:9",
                   "ctx:0",
                   "unpeer:1",
                   "unpeer:1#again",
                   "memset:pre:0:4096:7#revoked",
                   "memset:reused:0:4096:7#revoked",
                   "access:pre:0#revoked",
                   "access:pre:1#revoked",
                   "ctx:1",
                   "fill:pre:4M:5",
                   "ctx:0",
                   "kfill:pre:0:1024#fault",
                   "sync#fault"},
                  -1, "64MiB");
  REQUIRE(exited_ok(t.finish()));
  INFO(t.out() << t.err());
  CHECK(t.line("alloc:pre")["rc"] == "0");
  CHECK(t.line("alloc:reused")["ptr"] == t.line("alloc:r")["ptr"]);  // the reserve gave the block back
  CHECK(t.line("memset:pre:0:4096:7#before")["rc"] == std::to_string(kInvalidValue));
  CHECK(t.line("access:pre:0#before")["flags"] == "0");
  CHECK(t.line("peer:1")["rc"] == "0");
  CHECK(t.line("peer:1#again")["rc"] == std::to_string(kAlreadyEnabled));  // the driver's error, untouched
  CHECK(t.line("memset:pre:0:4096:7#after")["rc"] == "0");
  CHECK(t.line("access:pre:0#after")["flags"] == std::to_string(kReadWrite));
  CHECK(t.line("access:pre:1#after")["flags"] == std::to_string(kReadWrite));
  CHECK(t.line("fill:post")["ok"] == "1");
  CHECK(t.line("memset:post:0:8M:9")["rc"] == "0");
  CHECK(t.line("memset:reused:0:6M:9")["rc"] == "0");
  CHECK(t.line("kfill:post")["rc"] == "0");
  CHECK(t.line("sync#peer")["rc"] == "0");
  CHECK(t.line("check:post")["ok"] == "1");  // GPU 0's writes are GPU 1's data
  CHECK(t.line("unpeer:1")["rc"] == "0");
  CHECK(t.line("unpeer:1#again")["rc"] == std::to_string(kNotEnabled));
  CHECK(t.line("memset:pre:0:4096:7#revoked")["rc"] == std::to_string(kInvalidValue));
  CHECK(t.line("memset:reused:0:4096:7#revoked")["rc"] == std::to_string(kInvalidValue));
  CHECK(t.line("access:pre:0#revoked")["flags"] == "0");
  CHECK(t.line("access:pre:1#revoked")["flags"] == std::to_string(kReadWrite));  // its own GPU keeps it
  CHECK(t.line("fill:pre")["ok"] == "1");
  CHECK(t.line("kfill:pre:0:1024#fault")["rc"] == "0");
  CHECK(t.line("sync#fault")["rc"] == std::to_string(kIllegalAddress));
}

TEST_CASE("allocations racing cuCtxEnable/DisablePeerAccess end with the current peer set", "[e2e][gpus][peer]") {
  DaemonProcess d("peerrace", "version: 1\ndefault:\n  limit: 512MiB\n");
  d.devices = 2;
  REQUIRE(d.start());
  TenantProcess t(d, {"init", "peerrace:400"}, -1, "32MiB");
  REQUIRE(exited_ok(t.finish()));
  INFO(t.out() << t.err());
  const auto r = t.line("peerrace");
  CHECK(r.at("rc") == "0");
  CHECK(r.at("errors") == "0");
  CHECK(r.at("live") == "8");
  CHECK(r.at("bad_after_race") == "0");
  CHECK(r.at("bad_enabled") == "0");
  CHECK(r.at("bad_disabled") == "0");
}

TEST_CASE("cuCtxEnablePeerAccess the driver refuses is passed back and grants nothing", "[e2e][gpus][peer]") {
  DaemonProcess d("nopeer", "version: 1\ndefault:\n  limit: 256MiB\n");
  d.devices = 2;
  REQUIRE(d.start());
  TenantProcess t(d, {"init", "ctx:1", "alloc:a:4M", "ctx:0", "peer:1", "memset:a:0:4096:1", "access:a:0"}, -1, "0",
                  {"VLAKE_SIM_PEER_ACCESS=0"});
  REQUIRE(exited_ok(t.finish()));
  INFO(t.out() << t.err());
  CHECK(t.line("peer:1")["rc"] == std::to_string(kPeerUnsupported));
  CHECK(t.line("memset:a")["rc"] == std::to_string(kInvalidValue));
  CHECK(t.line("access:a:0")["flags"] == "0");
}

TEST_CASE("NCCL's cuMem flow: a served handle exported to a process on the other GPU", "[e2e][gpus][nccl]") {
  DaemonProcess d("nccl", "version: 1\ndefault:\n  limit: 256MiB\n");
  d.devices = 2;
  REQUIRE(d.start());
  TempPath sock("sock");
  TempPath b_mapped("bmapped");
  TempPath a_done("adone");
  TempPath go("go");
  // A (GPU 0, uid 0) creates and fills the buffer, exports it and sends the descriptor; B (GPU 1,
  // uid 4251) imports, maps for its own GPU, checks A's data and writes its own; A reads it.
  TenantProcess a(d, {"init", "create:h:4M", "reserve:v:4M", "map:v:0:h", "upload:v:11:4M", "sendfd:h:" + sock.path,
                      "waitfile:" + b_mapped.path, "verify:v:22:4M", "unmap:v:0:4M", "addrfree:v", "release:h",
                      "touch:" + a_done.path});
  TenantProcess b(d,
                  {"init", "ctx:1", "recvfd:h:" + sock.path + ":4M", "reserve:v:4M", "map:v:0:h", "verify:v:11:4M",
                   "upload:v:22:4M", "touch:" + b_mapped.path, "waitfile:" + a_done.path, "waitfile:" + go.path,
                   "unmap:v:0:4M", "addrfree:v", "release:h"},
                  4251);
  REQUIRE(!a.wait_line("touch:").empty());
  REQUIRE(!b.wait_line("waitfile:" + a_done.path).empty());
  // A released its handle; B still maps the memory: it stays charged once, to A's tenant and
  // GPU 0, and never to B's tenant or GPU 1.
  CHECK(held(d, "uid:0", 0) == 4 * MiB);
  CHECK(held(d, "uid:0", 1) == 0);
  CHECK(held(d, "uid:4251", 0) == 0);
  CHECK(held(d, "uid:4251", 1) == 0);
  go.touch();
  REQUIRE(exited_ok(b.finish()));
  REQUIRE(exited_ok(a.finish()));
  INFO(a.out() << a.err() << b.out() << b.err());
  CHECK(a.line("create:h")["rc"] == "0");
  CHECK(a.line("sendfd:h")["rc"] == "0");
  CHECK(a.line("sendfd:h")["sent"] == "1");
  CHECK(b.line("recvfd:h")["rc"] == "0");
  CHECK(b.line("map:v")["rc"] == "0");
  CHECK(b.line("verify:v:11")["ok"] == "1");
  CHECK(a.line("verify:v:22")["ok"] == "1");
  CHECK(a.line("release:h")["rc"] == "0");
  CHECK(b.line("release:h")["rc"] == "0");
  // Both released: the daemon's holder scan finds no descriptor left and the charge goes.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (held(d, "uid:0", 0) != 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  CHECK(held(d, "uid:0", 0) == 0);
}
