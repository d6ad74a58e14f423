// The Kubernetes allocation-directory format (contracts/allocation.hpp), shared by the device
// plugin (writer) and vlaked (reader): files round-trip, bad ones are refused, tenant names.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <optional>
#include <string>

#include "vlake/contracts/allocation.hpp"

using namespace vlake;

TEST_CASE("allocation: allocation and owner files round-trip and bad ones are rejected", "[contracts][allocation]") {
  alloc::Allocation a;
  a.id = alloc::new_id();
  CHECK(alloc::valid_id(a.id));
  a.gpu_uuid = "GPU-2bd0e1d3-5c8a-4f1e-9d7b-0a1b2c3d4e5f";
  a.device_ids = {a.gpu_uuid + "::0", a.gpu_uuid + "::1"};
  a.bytes = Bytes{2ull << 30};
  a.created = 1718000000;
  const auto b = alloc::parse_allocation(alloc::format_allocation(a), "x");
  CHECK(b.id == a.id);
  CHECK(b.gpu_uuid == a.gpu_uuid);
  CHECK(b.device_ids == a.device_ids);
  CHECK(b.bytes == a.bytes);
  CHECK(b.created == a.created);
  CHECK_THROWS_WITH(alloc::parse_allocation("version=2\nid=0123456789abcdef\n", "f"), Catch::Contains("version"));
  CHECK_THROWS_WITH(alloc::parse_allocation("version=1\nid=../etc\n", "f"), Catch::Contains("bad id"));
  const alloc::Owner o{"research", "train-0", "worker"};
  CHECK(alloc::parse_owner(alloc::format_owner(o), "x") == o);
  CHECK_THROWS_AS(alloc::parse_owner("version=1\nnamespace=a/b\npod=p\ncontainer=c\n", "x"), alloc::FormatError);
  const auto u = Uuid::parse(a.gpu_uuid);
  REQUIRE(u);
  CHECK(u->to_string() == a.gpu_uuid);
  alloc::Allocation no_prefix = a;  // the file always spells the "GPU-" form
  no_prefix.gpu_uuid = a.gpu_uuid.substr(4);
  CHECK_THROWS_WITH(alloc::parse_allocation(alloc::format_allocation(no_prefix), "f"), Catch::Contains("bad gpu_uuid"));
}

TEST_CASE("allocation: tenant names of allocations", "[contracts][allocation]") {
  CHECK(alloc::tenant_name("0123456789abcdef", std::nullopt) == "alloc:0123456789abcdef");
  const alloc::Owner o{"research", "train-0", "worker"};
  CHECK(alloc::tenant_name("0123456789abcdef", o) == "pod:research/train-0/worker");
  CHECK(alloc::owner_from_tenant_name("pod:research/train-0/worker") == o);
  const alloc::Owner longer{"ns", std::string(200, 'p'), "c"};
  const std::string n = alloc::tenant_name("0123456789abcdef", longer);
  CHECK(n.size() <= alloc::kMaxTenantName);
  CHECK(n.rfind("pod:ns/ppp", 0) == 0);
  const alloc::Owner longer2{"ns", std::string(199, 'p') + "q", "c"};
  CHECK(alloc::tenant_name("0123456789abcdef", longer2) != n);
}

namespace {
struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/vlake-alloc-test-XXXXXX";
    REQUIRE(::mkdtemp(tmpl) != nullptr);
    path = tmpl;
  }
  ~TempDir() { alloc::remove_tree(path); }
};
void put(const std::string& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  REQUIRE(fd >= 0);
  REQUIRE(::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()));
  ::close(fd);
}
}  // namespace

TEST_CASE("allocation: records round-trip outside the allocation's directory", "[contracts][allocation]") {
  TempDir root;
  alloc::Allocation a;
  a.id = alloc::new_id();
  a.gpu_uuid = "GPU-2bd0e1d3-5c8a-4f1e-9d7b-0a1b2c3d4e5f";
  a.device_ids = {a.gpu_uuid + "::0"};
  a.bytes = Bytes{1ull << 30};
  CHECK_FALSE(alloc::read_allocation_record(root.path, a.id));
  alloc::write_allocation_record(root.path, a);
  const alloc::Owner o{"research", "train-0", "worker"};
  alloc::write_owner_record(root.path, a.id, o);
  const std::string rec = root.path + "/records/" + a.id;
  CHECK(alloc::read_bounded(rec + ".allocation"));
  const auto b = alloc::read_allocation_record(root.path, a.id);
  REQUIRE(b);
  CHECK(b->bytes == a.bytes);
  CHECK(alloc::read_owner_record(root.path, a.id) == o);
  // A record that names another allocation is refused.
  const std::string other = alloc::new_id();
  REQUIRE(::rename((rec + ".allocation").c_str(), (root.path + "/records/" + other + ".allocation").c_str()) == 0);
  CHECK_THROWS_WITH(alloc::read_allocation_record(root.path, other), Catch::Contains("names allocation"));
  CHECK(alloc::remove_records(root.path, a.id));
  CHECK(alloc::remove_records(root.path, other));
  CHECK_FALSE(alloc::read_owner_record(root.path, a.id));
}

TEST_CASE("allocation: read_bounded refuses FIFOs, links, directories and large files at once",
          "[contracts][allocation]") {
  TempDir dir;
  const std::string fifo = dir.path + "/fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0666) == 0);
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(alloc::read_bounded(fifo), Catch::Contains("not a regular file"));  // no writer: no block
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(2));
  put(dir.path + "/target", "version=1\n");
  REQUIRE(::symlink((dir.path + "/target").c_str(), (dir.path + "/link").c_str()) == 0);
  CHECK_THROWS_WITH(alloc::read_bounded(dir.path + "/link"), Catch::Contains("symbolic link"));
  REQUIRE(::mkdir((dir.path + "/sub").c_str(), 0755) == 0);
  CHECK_THROWS_WITH(alloc::read_bounded(dir.path + "/sub"), Catch::Contains("not a regular file"));
  put(dir.path + "/big", std::string(alloc::kMaxRecordBytes + 1, 'x'));
  CHECK_THROWS_WITH(alloc::read_bounded(dir.path + "/big"), Catch::Contains("more than the 4096"));
  put(dir.path + "/max", std::string(alloc::kMaxRecordBytes, 'x'));
  CHECK(alloc::read_bounded(dir.path + "/max")->size() == alloc::kMaxRecordBytes);
  CHECK_FALSE(alloc::read_bounded(dir.path + "/none"));
  // A long bad line is quoted as a bounded excerpt.
  try {
    (void)alloc::parse_owner("version=1\n" + std::string(4000, 'y') + "\n", "f");
    FAIL("parsed");
  } catch (const alloc::FormatError& e) {
    CHECK(std::string(e.what()).size() < 300);
  }
}
