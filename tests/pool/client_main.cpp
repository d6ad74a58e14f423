// vlake_pool_test_client: a tenant process for the daemon tests. It may drop to another
// uid/gid (to be another tenant), then reads one command per line on stdin and answers one line
// on stdout: "ok key=value ..." or "err <message>". It maps what it is granted through the
// driver (--driver: the simulator), like the hook will.
//
// Commands:
//   connect SOCKET [OLD_SESSION]   Hello; prints session, tenant, name, gran, total, limit, used
//   grant BYTES [alloc|create|counted] [keep]   prints status, id, bytes, used, limit, handles;
//                                  keep: a copy of its descriptors stays open past release
//   kept ID BYTE                   imports the kept descriptors again and fills what they reach
//   unkeep ID                      closes the kept descriptors
//   fill ID BYTE                   fills the grant's mapping (copy engine)
//   poke ID OFFSET LEN BYTE        fills LEN bytes at OFFSET of the grant's mapping (may hit the slack)
//   check ID BYTE                  match=1 if every byte equals BYTE, else match=0 offset= value=
//   release ID [FLAGS]             unmaps, releases the imported handles, sends Release
//   usage                          UsageQuery for device 0
//   drop                           closes the connection, keeps grants and mappings
//   own BYTES                      creates device memory outside the pool (kept until exit)
//   meminfo                        used=<total - free> of device 0 (the simulator's physical view)
//   sessions SOCKET N              N more connections with a Hello each, kept open; prints opened,
//                                  refused and why= (the last refusal, spaces as _)
//   silent SOCKET N                N connections that never say Hello, kept open
//   counted N BYTES                N counted grants; prints granted, refused
//   ipcflood N BYTES               an alloc grant of BYTES exported (CUDA IPC), then opened N times
//                                  by this session, descriptors closed at once, the imports kept;
//                                  prints opened, refused
//   stress SOCKET THREADS ITERS MAX_UNITS SEED   threads × iterations of random grant/release,
//                                  each thread on its own connection; prints grants, denied, errors
//   connectp SOCKET                Hello with kHelloPressure (reads unsolicited Pressure)
//   reserve BYTES BLOCKS [reclaim] ReserveReport for device 0 (reclaim: kReportReclaim, a
//                                  framework would give its cache back; a liar never does)
//   pressure TIMEOUT_MS            got=1 bytes= reason= if a Pressure came, else got=0
//   sizes ID                       the grant's handle sizes, comma-separated (sizes=)
// What a hostile tenant does (docs/security.md):
//   grant BYTES alloc keep         as grant, and keeps a duplicate of every descriptor received
//   reimport ID                    imports the kept descriptors of grant ID again and maps them
//                                  read-write; prints id= (a new id for fill/check/poke)
//   closekept ID                   closes the kept descriptors of grant ID (as unkeep)
//   forget ID                      unmaps and releases this process's handles of ID (a reimport
//                                  or share mapping, or a grant) without telling the daemon
//   share ID                       explicit ShareRequest of the whole grant, then ShareCommit;
//                                  maps the new layout read-write whatever the pieces' flags say
//                                  (prints status, shared, merged, pieces, id= of that mapping)
//   replytimeout MS                how long later requests wait for their reply (default 10000)
//   exit
#include <fcntl.h>
#include <grp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "pool_client.hpp"
#include "vlake/common/driver.hpp"

using namespace vlake;
using pooltest::PoolClient;

namespace {

struct Held {
  std::uint64_t bytes = 0;
  std::vector<PhysicalHandle> handles;
  std::vector<std::uint64_t> sizes;  // per handle
  DevicePtr va{};
  bool mapped = false;
};

class Tool {
 public:
  explicit Tool(std::string driver_path) : driver_path_(std::move(driver_path)) {}

  Driver& driver() {
    if (!driver_) driver_ = open_driver(driver_path_);
    return *driver_;
  }

  std::string run(const std::string& line) {
    std::istringstream in(line);
    std::string cmd;
    in >> cmd;
    if (cmd == "connect" || cmd == "connectp") {
      std::string path;
      std::uint64_t old = 0;
      in >> path;
      if (cmd == "connect") in >> old;
      client_ = std::make_unique<PoolClient>(path);
      ack_ = client_->hello(old, cmd == "connectp" ? proto::kHelloPressure : 0u);
      std::memcpy(uuid_.data(), ack_.devices[0].uuid, 16);
      std::ostringstream o;
      o << "ok session=" << ack_.session_id << " tenant=" << ack_.tenant_id << " name=" << ack_.tenant_name
        << " gran=" << ack_.granularity << " total=" << ack_.devices[0].total << " limit=" << ack_.devices[0].limit
        << " used=" << ack_.devices[0].used << " count=" << ack_.device_count
        << " guard=" << static_cast<unsigned>(ack_.guard_mode);
      return o.str();
    }
    if (cmd == "replytimeout") {
      long ms = 0;
      in >> ms;
      if (ms <= 0) return "err replytimeout takes a positive number of milliseconds";
      need_client().set_reply_timeout(std::chrono::milliseconds(ms));
      return "ok";
    }
    if (cmd == "grant") {
      std::uint64_t bytes = 0;
      std::string purpose = "alloc";
      std::string keep;  // "keep": a copy of the descriptors stays open after release (see `kept`)
      in >> bytes >> purpose >> keep;
      const auto p = purpose == "counted"  ? proto::GrantPurpose::counted
                     : purpose == "create" ? proto::GrantPurpose::create
                                           : proto::GrantPurpose::alloc;
      auto g = need_client().grant(uuid_, bytes, p);
      std::ostringstream o;
      o << "ok status=" << static_cast<int>(g.reply.status) << " id=" << g.reply.grant_id << " bytes=" << g.reply.bytes
        << " used=" << g.reply.used << " limit=" << g.reply.limit << " handles=" << g.reply.handle_count;
      if (g.reply.status == proto::Status::ok) {
        Held h;
        h.bytes = g.reply.bytes;
        for (std::uint32_t i = 0; i < g.reply.handle_count; ++i) {
          h.handles.push_back(driver().import_fd(g.fds[i].get()));
          h.sizes.push_back(g.reply.handles[i].size);
        }
        if (!h.handles.empty()) {
          h.va = driver().reserve(Bytes{h.bytes}, Bytes{ack_.granularity});
          for (std::size_t i = 0; i < h.handles.size(); ++i) {
            driver().map(h.va + Bytes{g.reply.handles[i].offset}, Bytes{h.sizes[i]}, h.handles[i]);
          }
          driver().set_access(h.va, Bytes{h.bytes}, DeviceOrdinal{0}, Access::read_write);
          h.mapped = true;
        }
        if (keep == "keep") kept_[g.reply.grant_id] = Kept{std::move(g.fds), h.sizes};
        held_[g.reply.grant_id] = std::move(h);
      }
      return o.str();
    }
    if (cmd == "poke") {
      std::uint64_t id = 0, offset = 0, len = 0;
      unsigned value = 0;
      in >> id >> offset >> len >> value;
      Held& h = held_.at(id);
      if (!h.mapped) return "err not mapped";
      if (offset + len > h.bytes) return "err out of the grant";
      driver().fill_u8(h.va + Bytes{offset}, static_cast<std::uint8_t>(value), Bytes{len});
      driver().synchronize();
      return "ok";
    }
    if (cmd == "fill" || cmd == "check") {
      std::uint64_t id = 0;
      unsigned value = 0;
      in >> id >> value;
      Held& h = held_.at(id);
      if (!h.mapped) return "err not mapped";
      if (cmd == "fill") {
        driver().fill_u8(h.va, static_cast<std::uint8_t>(value), Bytes{h.bytes});
        driver().synchronize();
        return "ok";
      }
      std::vector<unsigned char> buf(h.bytes);
      driver().copy_to_host(buf.data(), h.va, Bytes{h.bytes});
      // memcmp per block, then the first differing byte of a block that differs (this tool is
      // built without optimization and under the sanitizers: no loop per byte over a grant).
      const std::vector<unsigned char> want(std::min<std::size_t>(buf.size(), 64 * 1024),
                                            static_cast<unsigned char>(value));
      for (std::size_t at = 0; at < buf.size(); at += want.size()) {
        const std::size_t n = std::min(want.size(), buf.size() - at);
        if (std::memcmp(buf.data() + at, want.data(), n) == 0) continue;
        for (std::size_t i = at; i < at + n; ++i) {
          if (buf[i] != value) return "ok match=0 offset=" + std::to_string(i) + " value=" + std::to_string(buf[i]);
        }
      }
      return "ok match=1";
    }
    if (cmd == "kept" || cmd == "unkeep") {
      // kept ID VALUE: import the kept descriptors again (after release) and fill the memory
      // they reach with VALUE; unkeep ID: close them.
      std::uint64_t id = 0;
      unsigned value = 0;
      in >> id >> value;
      auto it = kept_.find(id);
      if (it == kept_.end()) return "err nothing kept";
      if (cmd == "unkeep") {
        kept_.erase(it);
        return "ok";
      }
      for (std::size_t i = 0; i < it->second.fds.size(); ++i) {
        const PhysicalHandle ph = driver().import_fd(it->second.fds[i].get());
        const Bytes size{it->second.sizes.at(i)};
        const DevicePtr va = driver().reserve(size, Bytes{ack_.granularity});
        driver().map(va, size, ph);
        driver().set_access(va, size, DeviceOrdinal{0}, Access::read_write);
        driver().fill_u8(va, static_cast<std::uint8_t>(value), size);
        driver().synchronize();
        driver().unmap(va, size);
        driver().free_reservation(va, size);
        driver().release(ph);
      }
      return "ok";
    }
    if (cmd == "release") {
      std::uint64_t id = 0;
      std::uint32_t flags = 0;
      in >> id >> flags;
      auto it = held_.find(id);
      if (it != held_.end()) {
        unmap(it->second);
        held_.erase(it);
      }
      const auto r = need_client().release(id, flags);
      return "ok status=" + std::to_string(static_cast<int>(r.status)) + " used=" + std::to_string(r.used);
    }
    if (cmd == "reserve") {
      std::uint64_t bytes = 0, blocks = 0;
      std::string flag;
      in >> bytes >> blocks >> flag;
      need_client().reserve_report(uuid_, bytes, blocks, flag == "reclaim" ? proto::kReportReclaim : 0u);
      return "ok";
    }
    if (cmd == "pressure") {
      int timeout = 0;
      in >> timeout;
      const auto p = need_client().wait_pressure(timeout);
      if (!p) return "ok got=0";
      return "ok got=1 bytes=" + std::to_string(p->bytes) +
             " reason=" + std::to_string(static_cast<unsigned>(p->reason)) +
             " request=" + std::to_string(p->h.request_id);
    }
    if (cmd == "sizes") {
      std::uint64_t id = 0;
      in >> id;
      std::string out = "ok sizes=";
      const Held& h = held_.at(id);
      for (std::size_t i = 0; i < h.sizes.size(); ++i) out += (i ? "," : "") + std::to_string(h.sizes[i]);
      return out;
    }
    if (cmd == "reimport") {
      std::uint64_t id = 0;
      in >> id;
      const Kept& k = kept_.at(id);
      const auto& fds = k.fds;
      const auto& known = k.sizes;  // the grant's handle sizes
      Held h;
      for (std::size_t i = 0; i < fds.size(); ++i) {
        h.handles.push_back(driver().import_fd(fds[i].get()));
        h.sizes.push_back(known[i]);
        h.bytes += known[i];
      }
      return "ok id=" + std::to_string(map_new(std::move(h), kReimportBase + id));
    }
    if (cmd == "forget") {
      std::uint64_t id = 0;
      in >> id;
      auto it = held_.find(id);
      if (it == held_.end()) return "err no such mapping";
      unmap(it->second);
      held_.erase(it);
      return "ok";
    }
    if (cmd == "closekept") {
      std::uint64_t id = 0;
      in >> id;
      kept_.erase(id);
      return "ok";
    }
    if (cmd == "share") {
      std::uint64_t id = 0;
      in >> id;
      return share(id);
    }
    if (cmd == "usage") {
      const auto r = need_client().usage(uuid_);
      return "ok status=" + std::to_string(static_cast<int>(r.status)) + " total=" + std::to_string(r.total) +
             " limit=" + std::to_string(r.limit) + " used=" + std::to_string(r.used);
    }
    if (cmd == "drop") {
      client_.reset();
      return "ok";
    }
    if (cmd == "own") {  // device memory of this process that does not come from the pool
      std::uint64_t bytes = 0;
      in >> bytes;
      own_.push_back(driver().create(DeviceOrdinal{0}, Bytes{bytes}));
      return "ok";
    }
    if (cmd == "meminfo") {
      const MemoryInfo m = driver().memory_info(DeviceOrdinal{0});
      return "ok used=" + std::to_string((m.total - m.free).value());
    }
    if (cmd == "sessions") {  // N more connections, each with a Hello, kept open
      std::string path;
      int n = 0;
      in >> path >> n;
      int opened = 0;
      int refused = 0;
      std::string why;
      for (int i = 0; i < n; ++i) {
        try {
          auto c = std::make_unique<PoolClient>(path);
          (void)c->hello();
          extra_.push_back(std::move(c));
          ++opened;
        } catch (const std::exception& e) {
          ++refused;
          why = e.what();
        }
      }
      std::replace(why.begin(), why.end(), ' ', '_');
      return "ok opened=" + std::to_string(opened) + " refused=" + std::to_string(refused) + " why=" + why;
    }
    if (cmd == "silent") {  // N connections that never say Hello, kept open
      std::string path;
      int n = 0;
      in >> path >> n;
      for (int i = 0; i < n; ++i) extra_.push_back(std::make_unique<PoolClient>(path));
      return "ok opened=" + std::to_string(n);
    }
    if (cmd == "counted") {  // N counted grants of BYTES each
      int n = 0;
      std::uint64_t bytes = 0;
      in >> n >> bytes;
      int granted = 0;
      int refused = 0;
      for (int i = 0; i < n; ++i) {
        const auto g = need_client().grant(uuid_, bytes, proto::GrantPurpose::counted);
        (g.reply.status == proto::Status::ok ? granted : refused) += 1;
      }
      return "ok granted=" + std::to_string(granted) + " refused=" + std::to_string(refused);
    }
    if (cmd == "ipcflood") {  // one alloc grant exported, then opened N times (the imports stay)
      int n = 0;
      std::uint64_t bytes = 0;
      in >> n >> bytes;
      PoolClient& c = need_client();
      const auto g = c.grant(uuid_, bytes, proto::GrantPurpose::alloc);
      if (g.reply.status != proto::Status::ok)
        return "err grant status " + std::to_string(static_cast<int>(g.reply.status));
      auto ex = proto::make<proto::IpcExport>(c.next_request_id());
      ex.grant_id = g.reply.grant_id;
      c.send(ex);
      const auto er = c.recv(10000);
      if (!er || er->closed) return "err closed";
      const auto exported = er->as<proto::IpcExportReply>();
      if (exported.status != proto::Status::ok)
        return "err export status " + std::to_string(static_cast<int>(exported.status));
      int opened = 0;
      int refused = 0;
      for (int i = 0; i < n; ++i) {
        auto o = proto::make<proto::IpcOpen>(c.next_request_id());
        o.token = exported.token;
        o.secret = exported.secret;
        c.send(o);
        const auto r = c.recv(10000);  // its descriptors close with it; the import stays
        if (!r || r->closed) return "err closed";
        (r->as<proto::IpcOpenReply>().status == proto::Status::ok ? opened : refused) += 1;
      }
      return "ok opened=" + std::to_string(opened) + " refused=" + std::to_string(refused);
    }
    if (cmd == "stress") {
      std::string path;
      int threads = 0;
      int iters = 0;
      int max_units = 0;
      unsigned seed = 0;
      in >> path >> threads >> iters >> max_units >> seed;
      return stress(path, threads, iters, max_units, seed);
    }
    return "err unknown command '" + cmd + "'";
  }

 private:
  static constexpr std::uint64_t kReimportBase = 1'000'000'000'000ull;
  static constexpr std::uint64_t kShareBase = 2'000'000'000'000ull;

  // Maps `h`'s handles back to back in a new reservation, read-write; returns the id it is kept under.
  std::uint64_t map_new(Held h, std::uint64_t id) {
    h.va = driver().reserve(Bytes{h.bytes}, Bytes{ack_.granularity});
    std::uint64_t off = 0;
    for (std::size_t i = 0; i < h.handles.size(); ++i) {
      driver().map(h.va + Bytes{off}, Bytes{h.sizes[i]}, h.handles[i]);
      off += h.sizes[i];
    }
    driver().set_access(h.va, Bytes{h.bytes}, DeviceOrdinal{0}, Access::read_write);
    h.mapped = true;
    if (auto it = held_.find(id); it != held_.end()) {
      unmap(it->second);
      held_.erase(it);
    }
    held_[id] = std::move(h);
    return id;
  }

  // An explicit share of the whole grant `id`; the new layout is mapped read-write (a hostile
  // tenant ignores kShareReadOnly), kept under kShareBase + id.
  std::string share(std::uint64_t id) {
    const Held& old = held_.at(id);
    PoolClient& c = need_client();
    Held h;
    proto::ShareReply first{};
    std::uint32_t next = 0;
    std::uint32_t total = 1;
    while (next < total) {
      auto m = proto::make<proto::ShareRequest>(c.next_request_id());
      m.grant_id = id;
      m.offset = 0;
      m.bytes = old.bytes;
      m.first_piece = next;
      c.send(m);
      auto reply = c.recv();
      if (!reply || reply->closed) return "err no ShareReply";
      const auto r = reply->as<proto::ShareReply>();
      if (next == 0) first = r;
      if (r.status != proto::Status::ok) return "ok status=" + std::to_string(static_cast<int>(r.status));
      std::size_t fd_index = 0;
      for (std::uint32_t i = 0; i < r.piece_count; ++i) {
        const auto& p = r.pieces[i];
        if ((p.flags & proto::kShareKeep) != 0) {
          // The grant's old handle number keep_index: retained from the old mapping.
          std::uint64_t at = 0;
          for (std::uint32_t k = 0; k < p.keep_index; ++k) at += old.sizes.at(k);
          h.handles.push_back(driver().retain(old.va + Bytes{at}));
        } else {
          h.handles.push_back(driver().import_fd(reply->fds.at(fd_index++).get()));
        }
        h.sizes.push_back(p.size);
        h.bytes += p.size;
      }
      total = r.total_pieces;
      next = r.first_piece + r.piece_count;
      if (r.piece_count == 0) break;
    }
    auto commit = proto::make<proto::ShareCommit>(c.next_request_id());
    commit.grant_id = id;
    commit.commit = 1;
    c.send(commit);
    auto ack = c.recv();
    if (!ack || ack->closed) return "err no ShareAck";
    const auto a = ack->as<proto::ShareAck>();
    const std::uint64_t mapped = map_new(std::move(h), kShareBase + id);
    return "ok status=" + std::to_string(static_cast<int>(a.status)) + " shared=" + std::to_string(first.shared_bytes) +
           " merged=" + std::to_string(first.merged_bytes) + " pieces=" + std::to_string(first.total_pieces) +
           " id=" + std::to_string(mapped);
  }

  PoolClient& need_client() {
    if (!client_) throw std::runtime_error("not connected");
    return *client_;
  }

  void unmap(Held& h) {
    if (h.mapped) {
      driver().unmap(h.va, Bytes{h.bytes});
      driver().free_reservation(h.va, Bytes{h.bytes});
    }
    for (auto hd : h.handles) driver().release(hd);
    h.handles.clear();
    h.mapped = false;
  }

  std::string stress(const std::string& path, int threads, int iters, int max_units, unsigned seed) {
    std::atomic<std::uint64_t> grants{0};
    std::atomic<std::uint64_t> denied{0};
    std::atomic<std::uint64_t> errors{0};
    std::string first_error;
    std::mutex mu;
    Driver& drv = driver();
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t) {
      ts.emplace_back([&, t] {
        try {
          PoolClient c(path);
          const auto ack = c.hello();
          const Uuid uuid = Uuid::from_bytes(ack.devices[0].uuid);
          std::mt19937 rng(seed * 7919u + static_cast<unsigned>(t));
          std::vector<std::uint64_t> mine;
          for (int i = 0; i < iters; ++i) {
            if (!mine.empty() && (rng() % 2 == 0 || mine.size() >= 4)) {
              const std::size_t k = rng() % mine.size();
              const auto r = c.release(mine[k]);
              if (r.status != proto::Status::ok) ++errors;
              mine.erase(mine.begin() + static_cast<std::ptrdiff_t>(k));
              continue;
            }
            const std::uint64_t bytes = (1 + rng() % static_cast<unsigned>(max_units)) * ack.granularity;
            auto g = c.grant(uuid, bytes);
            if (g.reply.status == proto::Status::ok) {
              ++grants;
              for (auto& fd : g.fds) drv.release(drv.import_fd(fd.get()));
              mine.push_back(g.reply.grant_id);
            } else if (g.reply.status == proto::Status::over_limit) {
              ++denied;
            } else {
              ++errors;
            }
          }
          for (auto id : mine) {
            if (c.release(id).status != proto::Status::ok) ++errors;
          }
        } catch (const std::exception& e) {
          ++errors;
          std::lock_guard lock(mu);
          if (first_error.empty()) first_error = e.what();
        }
      });
    }
    for (auto& th : ts) th.join();
    std::string out = "ok grants=" + std::to_string(grants) + " denied=" + std::to_string(denied) +
                      " errors=" + std::to_string(errors);
    if (!first_error.empty()) out += " first_error=" + first_error;
    for (auto& c : out) {
      if (c == '\n') c = ' ';
    }
    return out;
  }

  std::string driver_path_;
  std::unique_ptr<Driver> driver_;
  std::unique_ptr<PoolClient> client_;
  std::vector<std::unique_ptr<PoolClient>> extra_;  // sessions / silent
  proto::HelloAck ack_{};
  Uuid uuid_{};
  std::map<std::uint64_t, Held> held_;
  struct Kept {
    std::vector<UniqueFd> fds;
    std::vector<std::uint64_t> sizes;
  };
  std::map<std::uint64_t, Kept> kept_;  // grant id -> descriptors kept past its release
  std::vector<PhysicalHandle> own_;
};

}  // namespace

int main(int argc, char** argv) {
  std::string driver;
  long uid = -1;
  long gid = -1;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--driver") driver = argv[i + 1];
    else if (a == "--uid") uid = std::stol(argv[i + 1]);
    else if (a == "--gid") gid = std::stol(argv[i + 1]);
  }
  if (gid >= 0 || uid >= 0) {
    if (::setgroups(0, nullptr) != 0) return std::perror("setgroups"), 3;
    if (gid >= 0 && ::setgid(static_cast<gid_t>(gid)) != 0) return std::perror("setgid"), 3;
    if (uid >= 0 && ::setuid(static_cast<uid_t>(uid)) != 0) return std::perror("setuid"), 3;
  }
  Tool tool(driver);
  std::string line;
  std::cout << "ok ready pid=" << ::getpid() << std::endl;
  while (std::getline(std::cin, line)) {
    if (line == "exit") break;
    std::string reply;
    try {
      reply = tool.run(line);
    } catch (const std::exception& e) {
      reply = std::string("err ") + e.what();
    }
    for (auto& c : reply) {
      if (c == '\n') c = ' ';
    }
    std::cout << reply << std::endl;
  }
  return 0;
}
