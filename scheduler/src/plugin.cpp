#include "vlake/scheduler/plugin.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "deviceplugin/v1beta1/api.grpc.pb.h"
#include "podresources/v1/api.grpc.pb.h"
#include "vlake/common/proc.hpp"
#include "vlake/common/unique_fd.hpp"
#include "vlake/contracts/allocation.hpp"
#include "vlake/contracts/state.hpp"
#include "vlake/scheduler/attribution.hpp"

namespace vlake::scheduler {

namespace dp = ::v1beta1;
namespace pr = ::v1;
using Clock = std::chrono::steady_clock;

namespace {

constexpr const char* kHealthy = "Healthy";
constexpr const char* kUnhealthy = "Unhealthy";
constexpr const char* kContainerDir = "/run/vlake";

bool is_socket(const std::string& path) {
  struct stat sb {};
  return ::stat(path.c_str(), &sb) == 0 && S_ISSOCK(sb.st_mode);
}

std::int64_t now_unix() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

class Plugin::Impl final : public dp::DevicePlugin::Service {
 public:
  Impl(const PluginOptions& o, std::unique_ptr<Inventory> inv, Logger& log)
      : opts_(o), inv_(std::move(inv)), log_(log) {
    try {
      gpus_ = inv_->enumerate();
    } catch (const std::exception& e) {
      throw StartupError(std::string("cannot enumerate GPUs: ") + e.what());
    }
    if (gpus_.empty()) throw StartupError("no GPU found");
    healthy_.assign(gpus_.size(), true);
    for (const GpuInfo& g : gpus_) {
      const std::uint64_t n = g.total.value() / opts_.unit.value();
      log_.info("GPU " + std::to_string(g.index) + " " + g.uuid + ": " + std::to_string(n) + " unit(s) of " +
                std::to_string(opts_.unit.value()) + " bytes");
    }
    wake_fd_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (!wake_fd_) throw StartupError(std::string("eventfd: ") + std::strerror(errno));
  }

  ~Impl() override { stop_server(); }

  // --- gRPC DevicePlugin service ------------------------------------------------------------

  grpc::Status GetDevicePluginOptions(grpc::ServerContext*, const dp::Empty*, dp::DevicePluginOptions* out) override {
    out->set_pre_start_required(false);
    out->set_get_preferred_allocation_available(true);
    return grpc::Status::OK;
  }

  grpc::Status ListAndWatch(grpc::ServerContext* ctx, const dp::Empty*,
                            grpc::ServerWriter<dp::ListAndWatchResponse>* writer) override {
    std::uint64_t sent = ~0ull;
    for (;;) {
      dp::ListAndWatchResponse resp;
      {
        std::unique_lock lk(mu_);
        cv_.wait_for(lk, std::chrono::milliseconds(200), [&] { return stopping_ || health_gen_ != sent; });
        if (stopping_ || server_epoch_stop_) return grpc::Status::OK;
        if (health_gen_ == sent) {
          if (ctx->IsCancelled()) return grpc::Status::CANCELLED;
          continue;
        }
        sent = health_gen_;
        fill_devices_locked(resp);
      }
      if (!writer->Write(resp)) return grpc::Status::OK;  // the kubelet went away
      log_.debug("ListAndWatch: sent " + std::to_string(resp.devices_size()) + " device(s)");
    }
  }

  grpc::Status GetPreferredAllocation(grpc::ServerContext*, const dp::PreferredAllocationRequest* req,
                                      dp::PreferredAllocationResponse* out) override {
    for (const auto& cr : req->container_requests()) {
      auto* resp = out->add_container_responses();
      for (const std::string& id : preferred(cr)) resp->add_deviceids(id);
    }
    return grpc::Status::OK;
  }

  grpc::Status Allocate(grpc::ServerContext*, const dp::AllocateRequest* req, dp::AllocateResponse* out) override {
    try {
      for (const auto& cr : req->container_requests()) {
        std::string why;
        const GpuInfo* gpu = gpu_of(cr.devices_ids(), why);
        if (gpu == nullptr) {
          log_.warn("Allocate refused: " + why);
          return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, why);
        }
        allocate_one(*gpu, cr, *out->add_container_responses());
      }
    } catch (const std::exception& e) {
      log_.error(std::string("Allocate failed: ") + e.what());
      return grpc::Status(grpc::StatusCode::INTERNAL, e.what());
    }
    kick_attribution();
    return grpc::Status::OK;
  }

  grpc::Status PreStartContainer(grpc::ServerContext*, const dp::PreStartContainerRequest*,
                                 dp::PreStartContainerResponse*) override {
    return grpc::Status::OK;
  }

  // --- control ------------------------------------------------------------------------------

  void run() {
    setup_watch();
    restart_server();  // start-up: a failure here is fatal (thrown to the caller)
    auto next_register = Clock::now();
    auto next_health = Clock::now();
    auto next_attr = Clock::now();
    while (!stop_requested_.load()) {
      const auto now = Clock::now();
      if (need_restart_ && now >= next_register) {
        try_restart();
        next_register = now + std::chrono::seconds(1);
      }
      if (need_register_ && !need_restart_ && now >= next_register) {
        if (register_once()) {
          need_register_ = false;
        } else {
          next_register = now + std::chrono::seconds(1);
        }
      }
      if (now >= next_health) {
        health_check();
        next_health = now + opts_.health_interval;
      }
      if (now >= next_attr || attribution_kicked_.exchange(false)) {
        attribution_pass();
        next_attr = Clock::now() + opts_.attribution_interval;
      }
      auto next = std::min(next_health, next_attr);
      if (need_register_ || need_restart_) next = std::min(next, next_register);
      auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(next - Clock::now()).count();
      wait = std::clamp<long long>(wait, 0, 1000);
      pollfd fds[2] = {{wake_fd_.get(), POLLIN, 0}, {inotify_fd_.get(), POLLIN, 0}};
      const int n = ::poll(fds, inotify_fd_ ? 2 : 1, static_cast<int>(wait));
      if (n > 0 && (fds[0].revents & POLLIN) != 0) {
        std::uint64_t v;
        (void)!::read(wake_fd_.get(), &v, sizeof v);
      }
      if (n > 0 && inotify_fd_ && (fds[1].revents & POLLIN) != 0) on_inotify();
    }
    {
      std::lock_guard lk(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    stop_server();
    ::unlink(opts_.plugin_socket().c_str());
    log_.info("stopped");
  }

  void stop() noexcept {
    stop_requested_.store(true);
    std::uint64_t one = 1;
    (void)!::write(wake_fd_.get(), &one, sizeof one);
  }

  int registrations() const noexcept { return registrations_.load(); }

  std::vector<std::string> device_ids() const {
    std::vector<std::string> out;
    for (const GpuInfo& g : gpus_) {
      const std::uint64_t n = g.total.value() / opts_.unit.value();
      for (std::uint64_t i = 0; i < n; ++i) out.push_back(alloc::device_id(g.uuid, static_cast<std::uint32_t>(i)));
    }
    return out;
  }

 private:
  // --- server and registration --------------------------------------------------------------

  void stop_server() {
    if (!server_) return;
    {
      std::lock_guard lk(mu_);
      server_epoch_stop_ = true;
    }
    cv_.notify_all();
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
    server_->Wait();
    server_.reset();
    std::lock_guard lk(mu_);
    server_epoch_stop_ = false;
  }

  void restart_server() {
    stop_server();
    const std::string path = opts_.plugin_socket();
    ::unlink(path.c_str());
    grpc::ServerBuilder b;
    b.AddListeningPort("unix:" + path, grpc::InsecureServerCredentials());
    b.RegisterService(this);
    server_ = b.BuildAndStart();
    if (!server_) throw StartupError("cannot serve gRPC on " + path);
    log_.info("serving on " + path);
    need_register_ = true;
  }

  bool register_once() {
    const std::string ks = opts_.kubelet_socket();
    if (!is_socket(ks)) {
      if (!register_wait_logged_) log_.info("waiting for the kubelet at " + ks);
      register_wait_logged_ = true;
      return false;
    }
    auto ch = grpc::CreateChannel("unix:" + ks, grpc::InsecureChannelCredentials());
    auto stub = dp::Registration::NewStub(ch);
    dp::RegisterRequest req;
    req.set_version("v1beta1");
    req.set_endpoint(opts_.endpoint);
    req.set_resource_name(opts_.resource);
    req.mutable_options()->set_get_preferred_allocation_available(true);
    req.mutable_options()->set_pre_start_required(false);
    dp::Empty resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    const grpc::Status s = stub->Register(&ctx, req, &resp);
    if (!s.ok()) {
      log_.warn("Register with " + ks + " failed: " + s.error_message() + " (retrying)");
      return false;
    }
    register_wait_logged_ = false;
    registered_ino_ = socket_inode(ks);
    ++registrations_;
    log_.info("registered " + opts_.resource + " (endpoint " + opts_.endpoint + ") with the kubelet");
    return true;
  }

  void setup_watch() {
    inotify_fd_.reset(::inotify_init1(IN_CLOEXEC | IN_NONBLOCK));
    if (!inotify_fd_) {
      log_.warn(std::string("inotify_init1: ") + std::strerror(errno) + "; kubelet restarts are not noticed");
      return;
    }
    mkdir_p(opts_.kubelet_dir);
    if (::inotify_add_watch(inotify_fd_.get(), opts_.kubelet_dir.c_str(),
                            IN_CREATE | IN_DELETE | IN_MOVED_TO | IN_MOVED_FROM) < 0) {
      log_.warn("inotify on " + opts_.kubelet_dir + ": " + std::strerror(errno));
    }
  }

  void on_inotify() {
    alignas(inotify_event) char buf[4096];
    bool kubelet_back = false;
    bool ours_gone = false;
    for (;;) {
      const ssize_t n = ::read(inotify_fd_.get(), buf, sizeof buf);
      if (n <= 0) break;
      for (ssize_t off = 0; off < n;) {
        const auto* e = reinterpret_cast<const inotify_event*>(buf + off);
        const std::string name = e->len > 0 ? std::string(e->name) : std::string();
        if (name == "kubelet.sock" && (e->mask & (IN_CREATE | IN_MOVED_TO)) != 0) kubelet_back = true;
        if (name == opts_.endpoint && (e->mask & (IN_DELETE | IN_MOVED_FROM)) != 0) ours_gone = true;
        off += static_cast<ssize_t>(sizeof(inotify_event) + e->len);
      }
    }
    // Our own restart unlinks and re-creates the socket: only a socket still missing counts.
    if (ours_gone && is_socket(opts_.plugin_socket())) ours_gone = false;
    if (ours_gone) {
      log_.info("our socket was removed: restarting and re-registering");
      try_restart();
    } else if (kubelet_back && socket_inode(opts_.kubelet_socket()) != registered_ino_) {
      // A new kubelet: our server still stands, register with it.
      log_.info("kubelet.sock was re-created (kubelet restart): re-registering");
      need_register_ = true;
    }
  }

  // restart_server() from the loop: a failure is logged and retried every second.
  void try_restart() {
    try {
      restart_server();
      need_restart_ = false;
    } catch (const std::exception& e) {
      if (!need_restart_) log_.warn(std::string(e.what()) + " (retrying)");
      need_restart_ = true;
    }
  }

  // --- devices and health -------------------------------------------------------------------

  void fill_devices_locked(dp::ListAndWatchResponse& resp) const {
    for (std::size_t k = 0; k < gpus_.size(); ++k) {
      const GpuInfo& g = gpus_[k];
      const std::uint64_t n = g.total.value() / opts_.unit.value();
      for (std::uint64_t i = 0; i < n; ++i) {
        auto* d = resp.add_devices();
        d->set_id(alloc::device_id(g.uuid, static_cast<std::uint32_t>(i)));
        d->set_health(healthy_[k] && vlaked_ok_ ? kHealthy : kUnhealthy);
      }
    }
  }

  void health_check() {
    std::vector<bool> h(gpus_.size());
    for (std::size_t k = 0; k < gpus_.size(); ++k) h[k] = inv_->check(gpus_[k]);
    const bool vlaked = opts_.vlaked_socket.empty() || is_socket(opts_.vlaked_socket);
    bool changed = false;
    {
      std::lock_guard lk(mu_);
      if (h != healthy_ || vlaked != vlaked_ok_) {
        healthy_ = h;
        vlaked_ok_ = vlaked;
        ++health_gen_;
        changed = true;
      }
    }
    if (changed) {
      cv_.notify_all();
      std::string what;
      for (std::size_t k = 0; k < gpus_.size(); ++k) {
        what += " GPU" + std::to_string(k) + "=" + (h[k] && vlaked ? kHealthy : kUnhealthy);
      }
      log_.info("health changed:" + what + (vlaked ? "" : " (vlaked socket " + opts_.vlaked_socket + " missing)"));
    }
  }

  // --- preferred allocation and Allocate ----------------------------------------------------

  const GpuInfo* gpu_by_uuid(const std::string& uuid) const {
    for (const GpuInfo& g : gpus_) {
      if (g.uuid == uuid) return &g;
    }
    return nullptr;
  }

  std::vector<std::string> preferred(const dp::ContainerPreferredAllocationRequest& cr) const {
    const auto size = static_cast<std::size_t>(std::max(0, cr.allocation_size()));
    std::map<std::string, std::vector<std::pair<std::uint32_t, std::string>>> avail;  // uuid -> (n, id)
    for (const std::string& id : cr.available_deviceids()) {
      if (auto s = alloc::split_device_id(id); s && gpu_by_uuid(s->first) != nullptr)
        avail[s->first].emplace_back(s->second, id);
    }
    std::set<std::string> must(cr.must_include_deviceids().begin(), cr.must_include_deviceids().end());
    std::set<std::string> must_gpus;
    for (const std::string& id : must) {
      auto s = alloc::split_device_id(id);
      must_gpus.insert(s ? s->first : std::string("?"));
    }
    if (must_gpus.size() > 1 || must.size() > size) return {};
    std::string chosen;
    if (!must_gpus.empty()) {
      chosen = *must_gpus.begin();
    } else {
      std::size_t best = 0;
      for (const GpuInfo& g : gpus_) {  // index order: ties go to the lower index
        const std::size_t n = avail.count(g.uuid) != 0 ? avail[g.uuid].size() : 0;
        if (n >= size && n > best) {
          best = n;
          chosen = g.uuid;
        }
      }
      if (chosen.empty()) return {};
    }
    std::vector<std::string> out(must.begin(), must.end());
    auto& list = avail[chosen];
    std::sort(list.begin(), list.end());
    for (const auto& [n, id] : list) {
      if (out.size() >= size) break;
      if (must.count(id) == 0) out.push_back(id);
    }
    if (out.size() != size) return {};
    return out;
  }

  template <class Ids>
  const GpuInfo* gpu_of(const Ids& ids, std::string& why) const {
    if (ids.empty()) {
      why = "no device ids";
      return nullptr;
    }
    const GpuInfo* gpu = nullptr;
    for (const std::string& id : ids) {
      auto s = alloc::split_device_id(id);
      const GpuInfo* g = s ? gpu_by_uuid(s->first) : nullptr;
      if (g == nullptr || s->second >= g->total.value() / opts_.unit.value()) {
        why = "unknown device id '" + id + "'";
        return nullptr;
      }
      if (gpu != nullptr && g != gpu) {
        why = "device ids of two GPUs (" + gpu->uuid + ", " + g->uuid +
              ") in one container: vlake serves a container from one GPU";
        return nullptr;
      }
      gpu = g;
    }
    return gpu;
  }

  void allocate_one(const GpuInfo& gpu, const dp::ContainerAllocateRequest& cr, dp::ContainerAllocateResponse& out) {
    alloc::Allocation a;
    a.id = alloc::new_id();
    a.gpu_uuid = gpu.uuid;
    std::set<std::string> unique(cr.devices_ids().begin(), cr.devices_ids().end());
    a.device_ids.assign(unique.begin(), unique.end());
    a.bytes = Bytes{opts_.unit.value() * a.device_ids.size()};
    a.created = now_unix();
    mkdir_p(opts_.alloc_root);
    // The record first (outside what the container sees): vlaked serves a directory only once
    // its record exists.
    alloc::write_allocation_record(opts_.alloc_root, a);
    const std::string dir = opts_.alloc_root + "/" + a.id;
    if (::mkdir(dir.c_str(), 0755) != 0) throw std::system_error(errno, std::generic_category(), "mkdir " + dir);
    ::chmod(dir.c_str(), 0755);
    alloc::write_file_atomic(dir, alloc::kPreloadFile, opts_.hook_container_path + "\n");

    auto mount = [&](const std::string& host, const std::string& container, bool ro) {
      auto* m = out.add_mounts();
      m->set_host_path(host);
      m->set_container_path(container);
      m->set_read_only(ro);
    };
    // Read-only: connecting to the socket needs no write access to the mount, and nothing the
    // container could write there is read by vlaked or the plugin.
    mount(dir, kContainerDir, true);
    mount(opts_.hook_path, opts_.hook_container_path, true);
    if (opts_.preload) mount(dir + "/" + alloc::kPreloadFile, "/etc/ld.so.preload", true);
    auto& envs = *out.mutable_envs();
    envs["VLAKE_SOCKET"] = std::string(kContainerDir) + "/" + alloc::kSocketFile;
    envs["VLAKE_ALLOCATION"] = a.id;
    if (opts_.gpu_visibility != GpuVisibility::cdi) envs["NVIDIA_VISIBLE_DEVICES"] = gpu.uuid;
    if (opts_.gpu_visibility != GpuVisibility::env) out.add_cdi_devices()->set_name(opts_.cdi_kind + "=" + gpu.uuid);
    log_.info("allocation " + a.id + ": " + std::to_string(a.device_ids.size()) + " unit(s) (" +
              std::to_string(a.bytes.value()) + " bytes) on " + gpu.uuid);
  }

  // --- attribution and clean-up -------------------------------------------------------------

  void kick_attribution() {
    attribution_kicked_.store(true);
    std::uint64_t one = 1;
    (void)!::write(wake_fd_.get(), &one, sizeof one);
  }

  struct OnDisk {
    alloc::Allocation a;
    std::optional<alloc::Owner> owner;
    // An older plugin's directory without a record: `a` comes from its pod-writable
    // `allocation` file (its `owner` file is never read) until seal_legacy() writes a record.
    bool legacy = false;
  };

  // A warning about one allocation's files: at most one line a minute per allocation (a pod
  // can make an older layout's files unreadable on purpose).
  void warn_allocation(const std::string& id, const std::string& msg) {
    file_log_.warn("allocation " + id, "allocation " + id + ": " + msg, Clock::now());
  }

  std::map<std::string, OnDisk> scan() {
    std::map<std::string, OnDisk> out;
    DIR* d = ::opendir(opts_.alloc_root.c_str());
    if (d == nullptr) return out;
    while (const dirent* e = ::readdir(d)) {
      const std::string id = e->d_name;
      if (!alloc::valid_id(id)) continue;
      try {
        if (auto a = alloc::read_allocation_record(opts_.alloc_root, id)) {
          out[id] = OnDisk{*a, alloc::read_owner_record(opts_.alloc_root, id), false};
        } else if (auto l = alloc::read_allocation(opts_.alloc_root + "/" + id); l && l->id == id) {
          out[id] = OnDisk{*l, std::nullopt, true};
        }
        // Neither: being created.
      } catch (const std::exception& ex) {
        warn_allocation(id, ex.what());
      }
    }
    ::closedir(d);
    return out;
  }

  // An older plugin's allocation that a listed container holds (the kubelet says which device
  // ids it has): its record is written with those ids and the size they make, whatever the
  // directory's own files say. Until then vlaked does not serve it.
  void seal_legacy(const std::string& id, OnDisk& d) {
    std::string why;
    const GpuInfo* gpu = gpu_of(d.a.device_ids, why);
    if (gpu == nullptr || gpu->uuid != d.a.gpu_uuid) {
      warn_allocation(id, "older layout not sealed: " + (gpu == nullptr ? why : "its GPU does not match its ids"));
      return;
    }
    d.a.bytes = Bytes{opts_.unit.value() * d.a.device_ids.size()};
    try {
      alloc::write_allocation_record(opts_.alloc_root, d.a);
      d.legacy = false;
      log_.info("allocation " + id + " (older layout): sealed, " + std::to_string(d.a.bytes.value()) +
                " bytes, as the kubelet lists its device ids");
    } catch (const std::exception& e) {
      warn_allocation(id, std::string("cannot write its record: ") + e.what());
    }
  }

  std::optional<std::vector<ListedContainer>> list_pods() {
    if (!is_socket(opts_.pod_resources_socket)) {
      log_.debug("PodResources socket " + opts_.pod_resources_socket + " not there");
      return std::nullopt;
    }
    if (!pr_stub_ || pr_socket_ino_ != socket_inode(opts_.pod_resources_socket)) {
      pr_socket_ino_ = socket_inode(opts_.pod_resources_socket);
      pr_stub_ = pr::PodResourcesLister::NewStub(
          grpc::CreateChannel("unix:" + opts_.pod_resources_socket, grpc::InsecureChannelCredentials()));
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    pr::ListPodResourcesRequest req;
    pr::ListPodResourcesResponse resp;
    const grpc::Status s = pr_stub_->List(&ctx, req, &resp);
    if (!s.ok()) {
      log_.warn("PodResources List failed: " + s.error_message());
      pr_stub_.reset();
      return std::nullopt;
    }
    std::vector<ListedContainer> out;
    for (const auto& pod : resp.pod_resources()) {
      for (const auto& c : pod.containers()) {
        ListedContainer lc{alloc::Owner{pod.namespace_(), pod.name(), c.name()}, {}};
        for (const auto& dev : c.devices()) {
          if (dev.resource_name() != opts_.resource) continue;
          lc.device_ids.insert(dev.device_ids().begin(), dev.device_ids().end());
        }
        if (!lc.device_ids.empty()) out.push_back(std::move(lc));
      }
    }
    return out;
  }

  static ino_t socket_inode(const std::string& path) {
    struct stat sb {};
    return ::stat(path.c_str(), &sb) == 0 ? sb.st_ino : 0;
  }

  // Tenant names that vlaked has a session for; nullopt when that cannot be known.
  std::optional<std::set<std::string>> session_tenants() {
    const std::string seg = state::segment_path(opts_.state);
    if (::access(seg.c_str(), F_OK) != 0 && errno == ENOENT) return std::set<std::string>{};  // no vlaked state
    try {
      state::StateReader reader(opts_.state);
      auto s = reader.snapshot();
      std::map<std::uint32_t, std::string> names;
      for (const auto& t : s->tenants) {
        if (t.in_use != 0) names[t.id] = std::string(t.name, ::strnlen(t.name, sizeof t.name));
      }
      std::set<std::string> out;
      for (const auto& r : s->sessions) {
        if (r.state == state::kSessionFree) continue;
        if (auto it = names.find(r.tenant); it != names.end()) out.insert(it->second);
      }
      return out;
    } catch (const std::exception& e) {
      log_.warn(std::string("cannot read vlaked's state (") + e.what() + "): allocations are kept");
      return std::nullopt;
    }
  }

  void attribution_pass() {
    auto disk = scan();
    // Forget what is no longer on disk.
    for (auto it = last_present_.begin(); it != last_present_.end();) {
      it = disk.count(it->first) == 0 ? last_present_.erase(it) : std::next(it);
    }
    if (disk.empty()) return;
    auto listed = list_pods();
    const auto now = Clock::now();
    if (listed) {
      std::vector<AllocView> views;
      for (const auto& [id, d] : disk) {
        views.push_back(AllocView{id, {d.a.device_ids.begin(), d.a.device_ids.end()}, d.a.created, d.owner});
      }
      const AttributionResult r = attribute(views, *listed);
      for (const auto& [id, who] : r.new_owner) {
        try {
          alloc::write_owner_record(opts_.alloc_root, id, who);
          disk[id].owner = who;
          log_.info("allocation " + id + " -> " + who.ns + "/" + who.pod + "/" + who.container);
        } catch (const std::exception& e) {
          log_.warn("allocation " + id + ": cannot write owner: " + e.what());
        }
      }
      // After the owner: vlaked reads both when the allocation record appears.
      for (auto& [id, d] : disk) {
        if (d.legacy && r.present.count(id) != 0) seal_legacy(id, d);
      }
      for (const auto& [id, d] : disk) {
        // Listed now: refresh. Never seen by this process: its grace counts from now.
        if (r.present.count(id) != 0) last_present_[id] = now;
        else last_present_.try_emplace(id, now);
      }
    } else {
      // Without a listing nothing is removed.
      for (const auto& [id, d] : disk) last_present_.try_emplace(id, now);
      return;
    }
    std::vector<std::string> expired;
    for (const auto& [id, t] : last_present_) {
      if (now - t >= opts_.gc_grace) expired.push_back(id);
    }
    if (expired.empty()) return;
    const auto sessions = session_tenants();
    if (!sessions) return;
    for (const std::string& id : expired) {
      const OnDisk& d = disk.at(id);
      const std::string tenant = alloc::tenant_name(id, d.owner);
      if (sessions->count(tenant) != 0 || sessions->count(alloc::tenant_name(id, std::nullopt)) != 0) {
        log_.debug("allocation " + id + ": unlisted but vlaked still has sessions of " + tenant);
        continue;
      }
      // The directory first (vlaked closes the socket), then the records.
      if (alloc::remove_tree(opts_.alloc_root + "/" + id) && alloc::remove_records(opts_.alloc_root, id)) {
        log_.info("allocation " + id + " (" + tenant + ") removed: its container is gone");
        last_present_.erase(id);
      } else {
        log_.warn("allocation " + id + ": cannot remove its directory: " + std::strerror(errno));
      }
    }
  }

  const PluginOptions opts_;
  std::unique_ptr<Inventory> inv_;
  Logger& log_;
  std::vector<GpuInfo> gpus_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<bool> healthy_;  // guarded by mu_
  bool vlaked_ok_ = true;      // guarded by mu_
  std::uint64_t health_gen_ = 0;
  bool stopping_ = false;
  bool server_epoch_stop_ = false;

  std::unique_ptr<grpc::Server> server_;
  UniqueFd wake_fd_;
  UniqueFd inotify_fd_;
  std::atomic<bool> stop_requested_{false};
  std::atomic<bool> attribution_kicked_{false};
  std::atomic<int> registrations_{0};
  bool need_register_ = true;
  bool need_restart_ = false;
  ino_t registered_ino_ = 0;  // kubelet.sock we last registered with
  bool register_wait_logged_ = false;
  std::unique_ptr<pr::PodResourcesLister::Stub> pr_stub_;
  ino_t pr_socket_ino_ = 0;
  std::map<std::string, Clock::time_point> last_present_;  // allocation id -> last seen listed
  LogLimiter file_log_{log_, 1.0 / 60, 1};                 // warn_allocation()
};

Plugin::Plugin(const PluginOptions& options, std::unique_ptr<Inventory> inventory, Logger& log)
    : impl_(std::make_unique<Impl>(options, std::move(inventory), log)) {}
Plugin::~Plugin() = default;
void Plugin::run() { impl_->run(); }
void Plugin::stop() noexcept { impl_->stop(); }
int Plugin::registrations() const noexcept { return impl_->registrations(); }
std::vector<std::string> Plugin::device_ids() const { return impl_->device_ids(); }

int plugin_main(int argc, const char* const* argv) noexcept {
  try {
    PluginOptions o;
    try {
      o = PluginOptions::parse(argc, argv);
    } catch (const OptionsError& e) {
      std::fprintf(stderr, "vlake-device-plugin: %s\n", e.what());
      return 2;
    }
    if (o.help) {
      std::fputs(PluginOptions::usage().c_str(), stdout);
      return 0;
    }
    Logger log(o.log_level);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, nullptr);
    ::signal(SIGPIPE, SIG_IGN);
    std::unique_ptr<Plugin> plugin;
    try {
      plugin = std::make_unique<Plugin>(o, std::make_unique<DriverInventory>(o.driver), log);
    } catch (const std::exception& e) {
      log.error(std::string("start-up failed: ") + e.what());
      return 1;
    }
    std::thread sig([&] {
      int s = 0;
      sigwait(&set, &s);
      log.info(std::string("received ") + (s == SIGTERM ? "SIGTERM" : "SIGINT") + ": stopping");
      plugin->stop();
    });
    try {
      plugin->run();
    } catch (const std::exception& e) {
      log.error(e.what());
      ::kill(::getpid(), SIGTERM);
      sig.join();
      return 1;
    }
    sig.join();
    return 0;
  } catch (...) {
    return 1;
  }
}

}  // namespace vlake::scheduler
