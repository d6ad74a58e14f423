// A fake kubelet for the device-plugin tests: the Registration service on <dir>/kubelet.sock
// (records every RegisterRequest), a client of the plugin's endpoint, and a PodResources
// server whose List answer the test sets. Real gRPC over real Unix sockets.
// Thread-safety: every method may be called from the test thread while gRPC threads serve.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "deviceplugin/v1beta1/api.grpc.pb.h"
#include "podresources/v1/api.grpc.pb.h"

namespace vlake::schedtest {

class FakeRegistration final : public ::v1beta1::Registration::Service {
 public:
  grpc::Status Register(grpc::ServerContext*, const ::v1beta1::RegisterRequest* req, ::v1beta1::Empty*) override;
  // Waits until at least `n` requests arrived (false after timeout_ms).
  bool wait_requests(std::size_t n, int timeout_ms = 10000);
  std::vector<::v1beta1::RegisterRequest> requests();

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<::v1beta1::RegisterRequest> reqs_;
};

class FakeKubelet {
 public:
  explicit FakeKubelet(std::string dir);  // starts serving <dir>/kubelet.sock
  ~FakeKubelet();
  void stop();  // shuts the server down and removes kubelet.sock (a kubelet going away)
  FakeRegistration registration;
  // A stub of the plugin's DevicePlugin service at <dir>/<endpoint>.
  std::unique_ptr<::v1beta1::DevicePlugin::Stub> plugin(const std::string& endpoint) const;

 private:
  std::string dir_;
  std::unique_ptr<grpc::Server> server_;
};

class FakePodResources final : public ::v1::PodResourcesLister::Service {
 public:
  explicit FakePodResources(std::string socket);
  ~FakePodResources() override;
  grpc::Status List(grpc::ServerContext*, const ::v1::ListPodResourcesRequest*,
                    ::v1::ListPodResourcesResponse* out) override;
  // Lists one container holding `ids` of `resource`.
  void add(const std::string& ns, const std::string& pod, const std::string& container, const std::string& resource,
           const std::vector<std::string>& ids);
  void clear();
  int lists() const;

 private:
  mutable std::mutex mu_;
  ::v1::ListPodResourcesResponse resp_;
  int lists_ = 0;
  std::string socket_;
  std::unique_ptr<grpc::Server> server_;
};

}  // namespace vlake::schedtest
