// CUDA IPC of pool memory end to end (docs/ipc.md): a real vlaked on the simulated driver and
// tenant processes under LD_PRELOAD=libvlake-hook.so that pass a cuIpcGetMemHandle handle to
// each other through a file (what torch.multiprocessing does through a pipe).
#include <catch2/catch.hpp>

// cuda.h as vlake's own headers include it (cuda_api.hpp: the legacy names visible), which the
// other files of this target's unity batch may include first; this file uses only its types.
#ifndef __CUDA_API_VERSION_INTERNAL
#define __CUDA_API_VERSION_INTERNAL 1
#endif
#include <cuda.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "tenant_process.hpp"
#include "vlake/contracts/protocol.hpp"
#include "vlake/contracts/state.hpp"

using namespace vlake;
using namespace std::chrono_literals;
using namespace vlake::e2e;
using pooltest::DaemonProcess;

namespace {

// Polls until the tenant's granted bytes equal `want` (5 s at most); returns the last figure.
std::uint64_t granted_becomes(const DaemonProcess& d, const std::string& name, std::uint64_t want) {
  std::uint64_t now = granted(d, name);
  for (int i = 0; i < 500 && now != want; ++i) {
    std::this_thread::sleep_for(10ms);
    now = granted(d, name);
  }
  return now;
}

// A directory every test uid may write the handle files into; removed at the end.
struct HandleDir {
  HandleDir() {
    path = std::filesystem::temp_directory_path() / pooltest::unique_name("ipc");
    std::filesystem::create_directories(path);
    ::chmod(path.c_str(), 01777);
  }
  ~HandleDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  [[nodiscard]] std::string file(const std::string& name) const { return (path / name).string(); }
  std::filesystem::path path;
};

void touch(const std::string& f) { std::ofstream(f).put('\n'); }

}  // namespace

TEST_CASE("two processes of one tenant share served memory through CUDA IPC", "[e2e][ipc]") {
  DaemonProcess d("ipc", "version: 1\ndefault:\n  limit: 1GiB\n");
  REQUIRE(d.start());
  HandleDir dir;
  const std::string h = dir.file("h"), w1 = dir.file("w1"), w2 = dir.file("w2"), w3 = dir.file("w3");
  TenantProcess e(d, {"init", "alloc:a:32M", "fill:a:32M:171", "ipcget:a:" + h, "waitfile:" + w1, "check:a:32M:7",
                      "free:a", "touch:" + w2, "sleep:30000"});
  TenantProcess i(
      d, {"init", "ipcopen:b:" + h, "check:b:32M:171", "fill:b:32M:7", "ipcopen:c:" + h, "range:b:4096", "attr:b:4096",
          "touch:" + w1, "waitfile:" + w3, "ipcclose:c", "check:b:32M:7", "ipcclose:b", "sleep:30000"});
  INFO(e.out() << e.err() << i.out() << i.err() << d.log());
  REQUIRE(e.wait_line("ipcget:a")["rc"] == "0");
  auto b = i.wait_line("ipcopen:b");
  REQUIRE(b["rc"] == "0");
  CHECK(i.wait_line("check:b")["ok"] == "1");  // the exporter's pattern
  auto c = i.wait_line("ipcopen:c");
  CHECK(c["rc"] == "0");
  CHECK(c["ptr"] == b["ptr"]);  // the same handle again: the same pointer
  auto range = i.wait_line("range:b");
  CHECK(range["rc"] == "0");
  CHECK(range["base_off"] == "0");
  CHECK(range["size"] == std::to_string(32 * MiB));
  auto attr = i.wait_line("attr:b");
  CHECK(attr["start_off"] == "0");
  CHECK(attr["size"] == std::to_string(32 * MiB));
  CHECK(attr["multi_size"] == std::to_string(32 * MiB));
  CHECK(e.wait_line("check:a")["ok"] == "1");  // the importer's write
  {
    const auto s = snapshot(d);
    CHECK(s->counters.ipc_exports == 1);
    CHECK(s->counters.ipc_opens == 1);  // the second open stayed in the process
  }
  // The owner freed it while the import is open: still held, charged once, to the owner.
  REQUIRE(e.wait_line("touch:" + w2)["rc"] == "0");
  CHECK(granted(d, "uid:0") == 32 * MiB);
  touch(w3);
  CHECK(i.wait_line("ipcclose:c")["rc"] == "0");
  CHECK(i.wait_line("check:b")["ok"] == "1");  // still mapped after one of two closes
  CHECK(i.wait_line("ipcclose:b")["rc"] == "0");
  CHECK(granted_becomes(d, "uid:0", 0) == 0);
  const auto s = snapshot(d);
  CHECK(s->counters.releases_exported == 1);  // retired, not pooled
  CHECK(s->counters.ipc_refused == 0);
}

TEST_CASE("an importer killed with SIGKILL closes its imports and the owner's charge goes", "[e2e][ipc]") {
  DaemonProcess d("ipckill", "version: 1\ndefault:\n  limit: 1GiB\n");
  REQUIRE(d.start());
  HandleDir dir;
  const std::string h = dir.file("h"), w1 = dir.file("w1"), w2 = dir.file("w2");
  // The exporter keeps a local reserve: an exported allocation must not stay in it.
  TenantProcess e(d,
                  {"init", "alloc:a:32M", "fill:a:32M:5", "ipcget:a:" + h, "waitfile:" + w1, "free:a", "touch:" + w2,
                   "alloc:z:32M", "check:z:32M:0", "sleep:30000"},
                  -1, "256M");
  TenantProcess i(d, {"init", "ipcopen:b:" + h, "check:b:32M:5", "touch:" + w1, "sleep:30000"});
  INFO(e.out() << e.err() << i.out() << i.err() << d.log());
  REQUIRE(i.wait_line("check:b")["ok"] == "1");
  REQUIRE(e.wait_line("touch:" + w2)["rc"] == "0");
  // A new allocation is not served from the exported memory (the importer still maps it).
  CHECK(e.wait_line("check:z")["ok"] == "1");
  CHECK(granted(d, "uid:0") == 64 * MiB);
  i.kill9();
  (void)i.finish();
  CHECK(granted_becomes(d, "uid:0", 32 * MiB) == 32 * MiB);
}

TEST_CASE("another tenant opens an IPC handle only inside the owner's ipc_domain", "[e2e][ipc]") {
  DaemonProcess d("ipcdom", R"(version: 1
default:
  limit: 1GiB
namespaces:
  - name: train
    users: [4242]
    ipc_domain: shared
  - name: serve
    users: [4243]
    ipc_domain: shared
  - name: other
    users: [4244]
)");
  REQUIRE(d.start());
  HandleDir dir;
  const std::string h = dir.file("h");
  TenantProcess e(d, {"init", "alloc:a:16M", "fill:a:16M:9", "ipcget:a:" + h, "sleep:30000"}, 4242);
  REQUIRE(e.wait_line("ipcget:a")["rc"] == "0");
  TenantProcess in(d, {"init", "ipcopen:b:" + h, "check:b:16M:9", "ipcclose:b"}, 4243);
  REQUIRE(exited_ok(in.finish()));
  INFO(in.out() << in.err() << d.log());
  CHECK(in.line("ipcopen:b")["rc"] == "0");
  CHECK(in.line("check:b")["ok"] == "1");
  TenantProcess out(d, {"init", "ipcopen:b:" + h}, 4244);
  REQUIRE(exited_ok(out.finish()));
  INFO(out.out() << out.err());
  CHECK(out.line("ipcopen:b")["rc"] == std::to_string(CUDA_ERROR_NOT_PERMITTED));
  const auto s = snapshot(d);
  CHECK(s->counters.ipc_opens == 1);
  CHECK(s->counters.ipc_refused == 1);
  CHECK(granted(d, "train/user:4242") == 16 * MiB);  // charged to the owner only
  CHECK(granted(d, "serve/user:4243") == 0);
}

TEST_CASE("a forged IPC secret is refused and foreign handles go to the driver", "[e2e][ipc]") {
  DaemonProcess d("ipcforge", "version: 1\ndefault:\n  limit: 1GiB\n");
  REQUIRE(d.start());
  HandleDir dir;
  const std::string h = dir.file("h"), forged = dir.file("forged"), zero = dir.file("zero");
  TenantProcess e(d, {"init", "alloc:a:8M", "ipcget:a:" + h + ":4096", "ipcopen:self:" + h, "managed:m:2M",
                      "ipcget:m:" + dir.file("m"), "ipcclose:a", "sleep:30000"});
  INFO(e.out() << e.err() << d.log());
  REQUIRE(e.wait_line("ipcget:a")["rc"] == "0");
  // The exporting process opening its own handle (docs/ipc.md).
  CHECK(e.wait_line("ipcopen:self")["rc"] == std::to_string(CUDA_ERROR_INVALID_CONTEXT));
  // Memory the pool did not serve, and a pointer no open returned: the (simulated) driver's
  // answers (it refuses managed memory's export and knows no such import).
  CHECK(e.wait_line("ipcget:m")["rc"] == std::to_string(CUDA_ERROR_INVALID_VALUE));
  CHECK(e.wait_line("ipcclose:a")["rc"] == std::to_string(CUDA_ERROR_INVALID_VALUE));
  proto::IpcHandleBlob blob{};
  {
    std::ifstream in(h, std::ios::binary);
    in.read(reinterpret_cast<char*>(&blob), sizeof blob);
    REQUIRE(in.gcount() == sizeof blob);
  }
  CHECK(blob.offset == 4096);
  CHECK(blob.bytes == 8 * MiB);
  blob.secret ^= 1;
  std::ofstream(forged, std::ios::binary).write(reinterpret_cast<const char*>(&blob), sizeof blob);
  const proto::IpcHandleBlob none{};
  std::ofstream(zero, std::ios::binary).write(reinterpret_cast<const char*>(&none), sizeof none);
  TenantProcess i(d, {"init", "ipcopen:b:" + forged, "ipcopen:z:" + zero});
  REQUIRE(exited_ok(i.finish()));
  INFO(i.out() << i.err());
  CHECK(i.line("ipcopen:b")["rc"] == std::to_string(CUDA_ERROR_INVALID_VALUE));
  // Not a vlake handle: the (simulated) driver's answer.
  CHECK(i.line("ipcopen:z")["rc"] == std::to_string(CUDA_ERROR_INVALID_VALUE));
  const auto s = snapshot(d);
  CHECK(s->counters.ipc_refused == 1);
  CHECK(s->counters.ipc_opens == 0);
}
