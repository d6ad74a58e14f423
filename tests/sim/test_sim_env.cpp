// The simulator's environment and its machine-wide (cross-process) behaviour, driven through
// the vlake_sim_probe helper so that every case starts from a fresh process.
#include "sim_helpers.hpp"
#include "sim_support.hpp"

#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

using namespace simtest;

namespace {

std::string init_with(const Env& extra, std::string* output = nullptr) {
  std::string out;
  Env env{{"VLAKE_SIM_NODE", fresh_node("env")}};
  env.insert(env.end(), extra.begin(), extra.end());
  REQUIRE(run_probe({"init"}, env, out) == 0);
  if (output != nullptr) *output = out;
  return value_of(out, "rc");
}

bool shm_exists(const std::string& node) {
  struct stat st {};
  return ::stat(("/dev/shm/vlake-sim-" + node).c_str(), &st) == 0;
}

}  // namespace

TEST_CASE("VLAKE_SIM_DEVICE_MEMORY takes a size with a binary unit", "[sim][env]") {
  const std::pair<const char*, size_t> good[] = {
      {"512MiB", size_t{512} << 20}, {"4GiB", size_t{4} << 30},     {"3Gi", size_t{3} << 30},
      {"2048Ki", size_t{2} << 20},   {"2097152B", size_t{2} << 20}, {"1TiB", size_t{1} << 40},
      {" 5MiB", size_t{5} << 20},    {"4194304B", size_t{4} << 20}, {"6144 KiB ", size_t{6} << 20},
  };
  for (const auto& [text, bytes] : good) {
    INFO("VLAKE_SIM_DEVICE_MEMORY=" << text);
    std::string out;
    CHECK(init_with({{"VLAKE_SIM_DEVICE_MEMORY", text}}, &out) == "0");
    CHECK(value_of(out, "total") == std::to_string(bytes));
  }
  std::string out;
  CHECK(init_with({{"VLAKE_SIM_DEVICE_MEMORY", "\x01"}}, &out) == "0");
  CHECK(value_of(out, "total") == std::to_string(size_t{16} << 30));  // default 16 GiB
}

TEST_CASE("a bad VLAKE_SIM_DEVICE_MEMORY fails cuInit with one clear line", "[sim][env]") {
  const char* bad[] = {
      "",     "abc",      "12XB", "-5",     "0", "1.5GiB", "3G", "1GB", "1KiB", "99999999999999999999", "20000000TiB",
      "1gib", "0x100000", "5M",   "2097152"};
  for (const char* text : bad) {
    INFO("VLAKE_SIM_DEVICE_MEMORY='" << text << "'");
    std::string out;
    CHECK(init_with({{"VLAKE_SIM_DEVICE_MEMORY", text}}, &out) == std::to_string(CUDA_ERROR_INVALID_VALUE));
    CHECK(out.find("vlake-sim: VLAKE_SIM_DEVICE_MEMORY") != std::string::npos);
  }
  std::string out;
  CHECK(init_with({{"VLAKE_SIM_DEVICE_MEMORY", "1GB"}}, &out) == std::to_string(CUDA_ERROR_INVALID_VALUE));
  CHECK(out.find("vlake-sim: VLAKE_SIM_DEVICE_MEMORY=\"1GB\": decimal units are ambiguous; write 1GiB "
                 "(1073741824 bytes)") != std::string::npos);
  CHECK(init_with({{"VLAKE_SIM_DEVICE_MEMORY", "8"}}, &out) == std::to_string(CUDA_ERROR_INVALID_VALUE));
  CHECK(out.find("vlake-sim: VLAKE_SIM_DEVICE_MEMORY=\"8\": a size needs a unit; write 8B, 8KiB, 8MiB or 8GiB") !=
        std::string::npos);
}

TEST_CASE("VLAKE_SIM_DEVICE_COUNT is 1..16 and VLAKE_SIM_NODE a plain name", "[sim][env]") {
  std::string out;
  CHECK(init_with({{"VLAKE_SIM_DEVICE_COUNT", "\x01"}}, &out) == "0");
  CHECK(value_of(out, "count") == "1");
  CHECK(init_with({{"VLAKE_SIM_DEVICE_COUNT", "3"}}, &out) == "0");
  CHECK(value_of(out, "count") == "3");
  CHECK(init_with({{"VLAKE_SIM_DEVICE_COUNT", "16"}}, &out) == "0");
  for (const char* text : {"0", "17", "x", "2x", "", "-1"}) {
    INFO("VLAKE_SIM_DEVICE_COUNT='" << text << "'");
    CHECK(init_with({{"VLAKE_SIM_DEVICE_COUNT", text}}, &out) == std::to_string(CUDA_ERROR_INVALID_VALUE));
    CHECK(out.find("vlake-sim: VLAKE_SIM_DEVICE_COUNT") != std::string::npos);
  }
  for (const std::string& text : {std::string("a/b"), std::string(""), std::string(101, 'n'), std::string("sp ace")}) {
    INFO("VLAKE_SIM_NODE='" << text << "'");
    std::string o;
    Env env{{"VLAKE_SIM_NODE", text}};
    REQUIRE(run_probe({"init"}, env, o) == 0);
    CHECK(value_of(o, "rc") == std::to_string(CUDA_ERROR_INVALID_VALUE));
    CHECK(o.find("vlake-sim: VLAKE_SIM_NODE") != std::string::npos);
  }
}

TEST_CASE("VLAKE_SIM_NODE_MODE is read-write bits with the owner's and VLAKE_SIM_NODE_GROUP a gid", "[sim][env]") {
  std::string out;
  for (const char* text : {"0600", "660", "0666", "0644"}) {
    INFO("VLAKE_SIM_NODE_MODE='" << text << "'");
    CHECK(init_with({{"VLAKE_SIM_NODE_MODE", text}}, &out) == "0");
  }
  for (const char* text : {"", "abc", "0700", "0400", "0066", "1666", "66", "06666", "0668", "644x", "0777"}) {
    INFO("VLAKE_SIM_NODE_MODE='" << text << "'");
    CHECK(init_with({{"VLAKE_SIM_NODE_MODE", text}}, &out) == std::to_string(CUDA_ERROR_INVALID_VALUE));
    CHECK(out.find("vlake-sim: VLAKE_SIM_NODE_MODE='") != std::string::npos);
  }
  CHECK(init_with({{"VLAKE_SIM_NODE_GROUP", std::to_string(::getgid()).c_str()}}, &out) == "0");
  for (const char* text : {"", "x", "-1", "+5", "1.5", "4294967295", "12 "}) {
    INFO("VLAKE_SIM_NODE_GROUP='" << text << "'");
    CHECK(init_with({{"VLAKE_SIM_NODE_GROUP", text}}, &out) == std::to_string(CUDA_ERROR_INVALID_VALUE));
    CHECK(out.find("vlake-sim: VLAKE_SIM_NODE_GROUP='") != std::string::npos);
  }
}

namespace {
struct NodeFile {
  mode_t mode = 0;
  gid_t gid = 0;
};
NodeFile node_file(const std::string& node) {
  struct stat st {};
  REQUIRE(::stat(("/dev/shm/vlake-sim-" + node).c_str(), &st) == 0);
  return {static_cast<mode_t>(st.st_mode & 07777), st.st_gid};
}
// A process holding 2 MiB on `node`, created with `env` (it creates the node file).
Child holder_on(const std::string& node, const Env& env = {}) {
  Env e{{"VLAKE_SIM_NODE", node}};
  e.insert(e.end(), env.begin(), env.end());
  Child c = spawn_probe({"hold", std::to_string(kGran)}, e);
  REQUIRE(read_until(c, "ready=1"));
  return c;
}
void stop(Child& c, const std::string& node) {
  ::kill(c.pid, SIGKILL);
  finish(c);
  ::unlink(("/dev/shm/vlake-sim-" + node).c_str());  // a killed last user leaves the file
}
// `used` on `node` as uid/gid: its used= figure, or "rc=<code>" when cuInit failed.
std::string used_as(const std::string& node, long uid, long gid, const Env& env = {}) {
  Env e{{"VLAKE_SIM_NODE", node}};
  e.insert(e.end(), env.begin(), env.end());
  std::string out;
  const int status = run_probe({"used"}, e, out, uid, gid);
  INFO(out);
  REQUIRE(status != 126);  // could not switch uid/gid
  if (!value_of(out, "used").empty()) return value_of(out, "used");
  CHECK(out.find("cannot open the node state") != std::string::npos);
  return "rc=" + value_of(out, "rc");
}
}  // namespace

// Tenants of other uids use the node a root process created (vlaked on the simulator): the file
// gets exactly VLAKE_SIM_NODE_MODE (default 0660) and VLAKE_SIM_NODE_GROUP, whatever the umask.
TEST_CASE("the node file gets VLAKE_SIM_NODE_MODE and VLAKE_SIM_NODE_GROUP whatever the umask", "[sim][node]") {
  const mode_t old_umask = ::umask(077);  // children inherit it: the file would be 0600
  const std::string denied = "rc=" + std::to_string(CUDA_ERROR_OPERATING_SYSTEM);
  const std::string held = std::to_string(kGran);

  const std::string plain = fresh_node("mode");
  Child a = holder_on(plain);
  CHECK(node_file(plain).mode == 0660);
  CHECK(node_file(plain).gid == ::getgid());
  if (::geteuid() == 0) {
    CHECK(used_as(plain, 4301, static_cast<long>(::getgid())) == held);  // in the file's group
    CHECK(used_as(plain, 4301, 4301) == denied);                         // not in it
  }
  stop(a, plain);

  const std::string open_node = fresh_node("mode");
  Child b = holder_on(open_node, {{"VLAKE_SIM_NODE_MODE", "0666"}});
  CHECK(node_file(open_node).mode == 0666);
  if (::geteuid() == 0) CHECK(used_as(open_node, 4302, 4302) == held);
  stop(b, open_node);

  const std::string private_node = fresh_node("mode");
  Child c = holder_on(private_node, {{"VLAKE_SIM_NODE_MODE", "0600"}});
  CHECK(node_file(private_node).mode == 0600);
  if (::geteuid() == 0) CHECK(used_as(private_node, 4301, static_cast<long>(::getgid())) == denied);
  stop(c, private_node);

  if (::geteuid() == 0) {
    const std::string group_node = fresh_node("group");
    Child d = holder_on(group_node, {{"VLAKE_SIM_NODE_GROUP", "4300"}});
    CHECK(node_file(group_node).mode == 0660);
    CHECK(node_file(group_node).gid == 4300);
    CHECK(used_as(group_node, 4301, 4300) == held);
    CHECK(used_as(group_node, 4302, 4302) == denied);
    // A file that exists keeps its mode and group, whatever a later user asks for.
    CHECK(used_as(group_node, 4301, 4300, {{"VLAKE_SIM_NODE_MODE", "0600"}, {"VLAKE_SIM_NODE_GROUP", "4301"}}) == held);
    CHECK(node_file(group_node).mode == 0660);
    CHECK(node_file(group_node).gid == 4300);
    stop(d, group_node);

    // A creator that may not give the file that group fails cuInit and leaves no file behind.
    const std::string refused = fresh_node("group");
    std::string out;
    REQUIRE(run_probe({"init"}, {{"VLAKE_SIM_NODE", refused}, {"VLAKE_SIM_NODE_GROUP", "4300"}}, out, 4303, 4303) == 0);
    CHECK(value_of(out, "rc") == std::to_string(CUDA_ERROR_OPERATING_SYSTEM));
    CHECK(out.find("vlake-sim: cannot give the node state /dev/shm/vlake-sim-" + refused +
                   " mode 0660 and group 4300: Operation not permitted") != std::string::npos);
    CHECK_FALSE(shm_exists(refused));
  } else {
    WARN("not root: the cases with other uids and groups were not run");
  }
  ::umask(old_umask);
}

TEST_CASE("before cuInit only versions and error strings and proc addresses work", "[sim][env]") {
  std::string out;
  REQUIRE(run_probe({"preinit"}, {{"VLAKE_SIM_NODE", fresh_node("pre")}}, out) == 0);
  CHECK(value_of(out, "ok") == "1");
  INFO(out);
}

TEST_CASE("device UUIDs are stable per node and ordinal across processes", "[sim][env]") {
  init_ctx();
  CUuuid mine{};
  REQUIRE(cuDeviceGetUuid(&mine, 0) == CUDA_SUCCESS);
  char hex[33];
  for (int i = 0; i < 16; ++i) {
    std::snprintf(hex + 2 * i, 3, "%02x", static_cast<unsigned>(static_cast<unsigned char>(mine.bytes[i])));
  }
  std::string out;
  REQUIRE(run_probe({"init"}, {}, out) == 0);  // same node (inherited environment)
  CHECK(value_of(out, "uuid") == hex);
  REQUIRE(run_probe({"init"}, {{"VLAKE_SIM_NODE", fresh_node("uuid")}}, out) == 0);
  CHECK(value_of(out, "uuid") != hex);
}

TEST_CASE("processes of one node share its capacity and a killed holder's memory comes back", "[sim][node]") {
  init_ctx();
  const size_t base = used_bytes();
  Child holder = spawn_probe({"hold", std::to_string(size_t{256} << 20)});
  REQUIRE(read_until(holder, "ready=1"));
  CHECK(used_bytes() == base + (size_t{256} << 20));
  std::string out;
  REQUIRE(run_probe({"used"}, {}, out) == 0);  // a third process sees it too
  CHECK(value_of(out, "used") == std::to_string(base + (size_t{256} << 20)));

  REQUIRE(::kill(holder.pid, SIGKILL) == 0);
  // Not reaped yet: a zombie holds nothing.
  for (int i = 0; i < 200 && used_bytes() != base; ++i) ::usleep(5000);
  CHECK(used_bytes() == base);
  CHECK(finish(holder) == 128 + SIGKILL);
  CHECK(used_bytes() == base);
}

TEST_CASE("an exported allocation stays charged while any process holds it", "[sim][node]") {
  init_ctx();
  const size_t base = used_bytes();
  CUmemAllocationProp prop = device_prop();
  CUmemGenericAllocationHandle h = 0;
  const CUdeviceptr va = map_read_write(prop, kGran, h);
  REQUIRE(cuMemsetD32_v2(va, 0xC0FFEEu, kGran / 4) == CUDA_SUCCESS);
  int fd = -1;
  REQUIRE(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) == CUDA_SUCCESS);
  Child importer = spawn_probe({"import", std::to_string(fd)});  // the fd is inherited
  ::close(fd);
  REQUIRE(read_until(importer, "ready=1"));
  CHECK(value_of(importer.output, "value") == std::to_string(0xC0FFEEu));
  CHECK(used_bytes() == base + kGran);  // counted once, not per process

  REQUIRE(cuMemUnmap(va, kGran) == CUDA_SUCCESS);
  REQUIRE(cuMemRelease(h) == CUDA_SUCCESS);
  REQUIRE(cuMemAddressFree(va, kGran) == CUDA_SUCCESS);
  CHECK(used_bytes() == base + kGran);  // the importer still maps it

  REQUIRE(::kill(importer.pid, SIGKILL) == 0);
  CHECK(finish(importer) == 128 + SIGKILL);
  CHECK(used_bytes() == base);
}

TEST_CASE("a node in use refuses other parameters and an unused node is reset and removed", "[sim][node]") {
  init_ctx();
  std::string out;
  REQUIRE(run_probe({"init"}, {{"VLAKE_SIM_DEVICE_MEMORY", "2GiB"}}, out) == 0);
  CHECK(value_of(out, "rc") == std::to_string(CUDA_ERROR_INVALID_VALUE));
  CHECK(out.find("is in use with") != std::string::npos);
  REQUIRE(run_probe({"init"}, {{"VLAKE_SIM_DEVICE_COUNT", "3"}}, out) == 0);
  CHECK(value_of(out, "rc") == std::to_string(CUDA_ERROR_INVALID_VALUE));
  REQUIRE(run_probe({"init"}, {}, out) == 0);
  CHECK(value_of(out, "rc") == "0");

  // A node whose last user exited normally: its file is gone; the next user sets it up anew.
  const std::string node = fresh_node("reset");
  REQUIRE(run_probe({"init"}, {{"VLAKE_SIM_NODE", node}}, out) == 0);
  CHECK(value_of(out, "rc") == "0");
  CHECK_FALSE(shm_exists(node));
  REQUIRE(run_probe({"init"}, {{"VLAKE_SIM_NODE", node}, {"VLAKE_SIM_DEVICE_MEMORY", "2GiB"}}, out) == 0);
  CHECK(value_of(out, "total") == std::to_string(size_t{2} << 30));

  // A node whose only user was killed while holding memory: the file stays, harmlessly.
  Child holder = spawn_probe({"hold", std::to_string(kGran)}, {{"VLAKE_SIM_NODE", node}});
  REQUIRE(read_until(holder, "ready=1"));
  ::kill(holder.pid, SIGKILL);
  finish(holder);
  CHECK(shm_exists(node));
  REQUIRE(run_probe({"init"}, {{"VLAKE_SIM_NODE", node}, {"VLAKE_SIM_DEVICE_MEMORY", "4GiB"}}, out) == 0);
  CHECK(value_of(out, "rc") == "0");
  CHECK(value_of(out, "total") == std::to_string(size_t{4} << 30));
  CHECK_FALSE(shm_exists(node));
}

TEST_CASE("a fork()ed child of an initialized process cannot use CUDA", "[sim][node]") {
  init_ctx();
  CUmemAllocationProp prop = device_prop();
  CUmemGenericAllocationHandle h = 0;
  REQUIRE(cuMemCreate(&h, kGran, &prop, 0) == CUDA_SUCCESS);
  const size_t base = used_bytes();
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    int bad = 0;
    int count = 0;
    size_t f = 0;
    size_t t = 0;
    int version = 0;
    const char* str = nullptr;
    void* fn = nullptr;
    bad += cuInit(0) != CUDA_ERROR_NOT_INITIALIZED;
    bad += cuDeviceGetCount(&count) != CUDA_ERROR_NOT_INITIALIZED;
    bad += cuMemGetInfo_v2(&f, &t) != CUDA_ERROR_NOT_INITIALIZED;
    bad += cuMemRelease(h) != CUDA_ERROR_NOT_INITIALIZED;
    bad += cuCtxSynchronize() != CUDA_ERROR_NOT_INITIALIZED;
    bad += cuMemCreate(&h, kGran, &prop, 0) != CUDA_ERROR_NOT_INITIALIZED;
    bad += cuDriverGetVersion(&version) != CUDA_SUCCESS;
    bad += cuGetErrorString(CUDA_ERROR_INVALID_VALUE, &str) != CUDA_SUCCESS;
    bad += cuGetProcAddress_v2("cuMemCreate", &fn, 12000, 0, nullptr) != CUDA_SUCCESS;
    std::exit(bad);  // runs the sim's exit hook: it must not detach the parent's holds
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(used_bytes() == base);  // nothing released or counted twice by the child
  std::string out;
  REQUIRE(run_probe({"used"}, {}, out) == 0);
  CHECK(value_of(out, "used") == std::to_string(base));
  CHECK(cuMemRelease(h) == CUDA_SUCCESS);
  CHECK(used_bytes() == base - kGran);
}
