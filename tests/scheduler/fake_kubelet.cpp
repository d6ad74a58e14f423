#include "fake_kubelet.hpp"

#include <unistd.h>

#include <chrono>
#include <stdexcept>

namespace vlake::schedtest {

grpc::Status FakeRegistration::Register(grpc::ServerContext*, const ::v1beta1::RegisterRequest* req,
                                        ::v1beta1::Empty*) {
  {
    std::lock_guard lk(mu_);
    reqs_.push_back(*req);
  }
  cv_.notify_all();
  return grpc::Status::OK;
}

bool FakeRegistration::wait_requests(std::size_t n, int timeout_ms) {
  std::unique_lock lk(mu_);
  return cv_.wait_for(lk, std::chrono::milliseconds(timeout_ms), [&] { return reqs_.size() >= n; });
}

std::vector<::v1beta1::RegisterRequest> FakeRegistration::requests() {
  std::lock_guard lk(mu_);
  return reqs_;
}

FakeKubelet::FakeKubelet(std::string dir) : dir_(std::move(dir)) {
  const std::string path = dir_ + "/kubelet.sock";
  ::unlink(path.c_str());
  grpc::ServerBuilder b;
  b.AddListeningPort("unix:" + path, grpc::InsecureServerCredentials());
  b.RegisterService(&registration);
  server_ = b.BuildAndStart();
  if (!server_) throw std::runtime_error("fake kubelet: cannot serve " + path);
}

FakeKubelet::~FakeKubelet() { stop(); }

void FakeKubelet::stop() {
  if (!server_) return;
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
  server_->Wait();
  server_.reset();
  ::unlink((dir_ + "/kubelet.sock").c_str());
}

std::unique_ptr<::v1beta1::DevicePlugin::Stub> FakeKubelet::plugin(const std::string& endpoint) const {
  return ::v1beta1::DevicePlugin::NewStub(
      grpc::CreateChannel("unix:" + dir_ + "/" + endpoint, grpc::InsecureChannelCredentials()));
}

FakePodResources::FakePodResources(std::string socket) : socket_(std::move(socket)) {
  ::unlink(socket_.c_str());
  grpc::ServerBuilder b;
  b.AddListeningPort("unix:" + socket_, grpc::InsecureServerCredentials());
  b.RegisterService(this);
  server_ = b.BuildAndStart();
  if (!server_) throw std::runtime_error("fake PodResources: cannot serve " + socket_);
}

FakePodResources::~FakePodResources() {
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
  server_->Wait();
  ::unlink(socket_.c_str());
}

grpc::Status FakePodResources::List(grpc::ServerContext*, const ::v1::ListPodResourcesRequest*,
                                    ::v1::ListPodResourcesResponse* out) {
  std::lock_guard lk(mu_);
  ++lists_;
  *out = resp_;
  return grpc::Status::OK;
}

void FakePodResources::add(const std::string& ns, const std::string& pod, const std::string& container,
                           const std::string& resource, const std::vector<std::string>& ids) {
  std::lock_guard lk(mu_);
  auto* p = resp_.add_pod_resources();
  p->set_namespace_(ns);
  p->set_name(pod);
  auto* c = p->add_containers();
  c->set_name(container);
  auto* d = c->add_devices();
  d->set_resource_name(resource);
  for (const auto& id : ids) d->add_device_ids(id);
  auto* other = c->add_devices();  // another resource of the same container: ignored
  other->set_resource_name("example.com/other");
  other->add_device_ids("x-0");
}

void FakePodResources::clear() {
  std::lock_guard lk(mu_);
  resp_.Clear();
}

int FakePodResources::lists() const {
  std::lock_guard lk(mu_);
  return lists_;
}

}  // namespace vlake::schedtest
