// vlake::pool::Node: CUDA contexts (docs/quota.md, "Contexts") — the hook asks before the driver
// creates a context; the memory is admitted against the tenant's limits like a grant, charged as
// non-pool memory until NVML shows it, then the larger of NVML's figure and the admitted size
// (features/contexts/context_book.hpp).
#include <unordered_map>

#include "vlake/pool/node.hpp"

namespace vlake::pool {

void Node::charge_contexts(TenantId t) {
  if (tenant_mut(t) == nullptr) return;
  for (const Device& d : devices_) acct_.set_nonpool(t, d.ordinal, rooms_.contexts.charge(t, d.ordinal));
  touch_tenant(t);
}

void Node::observe_contexts(const std::vector<GpuSample>& sample) {
  const NonpoolInputs in = nonpool_inputs();
  for (const GpuSample& g : sample) {
    std::unordered_map<std::uint32_t, Bytes> figure;
    for (const ProcessUsage& p : g.processes) figure[p.pid] += p.used;
    const Device& dev = devices_.at(static_cast<std::size_t>(g.device.value()));
    // vlaked's own context: its figure less the handles it holds (pool, retired ones kept alive
    // by a descriptor).
    if (const auto d = figure.find(settings_.daemon_pid); d != figure.end()) {
      const Bytes held = dev.pool->pool_bytes() + dev.pool->held_fd_bytes();
      rooms_.contexts.observe_daemon(g.device, d->second > held ? d->second - held : Bytes{0});
    }
    if (rooms_.contexts.empty()) continue;
    for (const auto& [id, s] : sessions_) {
      if (rooms_.contexts.contexts(id, g.device) == 0) continue;
      const auto f = figure.find(s.pid);
      Bytes v = f == figure.end() ? Bytes{0} : f->second;
      if (const auto o = in.orphaned.find({s.pid, g.device.value()}); o != in.orphaned.end()) {
        v = v > o->second ? v - o->second : Bytes{0};
      }
      rooms_.contexts.observe(id, g.device, f != figure.end(), v);
    }
  }
}

std::variant<proto::ContextReply, Malformed> Node::context(std::uint64_t session, const proto::ContextRequest& m,
                                                           Now now) {
  auto sit = sessions_.find(session);
  if (sit == sessions_.end()) return Malformed{"session is gone"};
  const Session& s = sit->second;
  proto::ContextReply r{};
  r.h = proto::make_header<proto::ContextReply>(proto::MsgType::context_reply, m.h.request_id);
  const Device* dev = device_by_uuid(m.device_uuid);
  Tenant* t = tenant_mut(s.tenant);
  if (dev == nullptr || t == nullptr) {
    r.status = proto::Status::unknown_device;
    return r;
  }
  const Bytes size = rooms_.contexts.size(dev->ordinal);
  r.bytes = size.value();
  if (m.op == proto::ContextOp::release) {
    r.status = rooms_.contexts.release(s.id, dev->ordinal) ? proto::Status::ok : proto::Status::unknown_grant;
  } else {
    Refusal why = Refusal::none;
    Accounting::Usage u{};
    std::optional<Accounting::Reservation> fits;
    if (size.value() > 0) fits = acct_.reserve(t->id, dev->ordinal, size, &u, &why);
    if (size.value() > 0 && !fits) {
      // Refused like a grant (counted, logged per tenant, in the refusal log): the hook fails
      // the context's creation with CUDA_ERROR_OUT_OF_MEMORY.
      proto::GrantReply g{};
      g.limit = u.limit.value();
      g.used = (u.used() + u.reserved).value();
      const Refused refused = refuse(*t, *dev, size, why, g, now);
      r.status = refused.reply.status;
      r.limit = refused.reply.limit;
      r.used = refused.reply.used;
      r.contexts = rooms_.contexts.contexts(s.id, dev->ordinal);
      st::RefusalReason reason = st::kRefusalTenantLimit;
      if (r.status == proto::Status::namespace_over_limit) reason = st::kRefusalNamespaceLimit;
      if (r.status == proto::Status::guarantee) reason = st::kRefusalGuarantee;
      record_refusal(t->id, s.pid, dev, reason, size, r.used, r.limit, std::chrono::milliseconds(0), now);
      limited_.info("context refusal " + t->name,
                    "tenant " + t->name + ": pid " + std::to_string(s.pid) + " may not create a CUDA context (" +
                        std::to_string(size.value()) + " bytes, " + rooms_.contexts.source(dev->ordinal) + ") on GPU " +
                        std::to_string(dev->ordinal.value()),
                    now.steady);
      return r;
    }
    if (fits) fits->rollback();  // the charge is non-pool memory, not a grant
    rooms_.contexts.admit(s.id, t->id, dev->ordinal);
    r.status = proto::Status::ok;
  }
  if (r.status == proto::Status::ok) charge_contexts(t->id);
  const Accounting::Usage after = acct_.usage(t->id, dev->ordinal);
  r.limit = after.limit.value();
  r.used = after.used().value();
  r.contexts = rooms_.contexts.contexts(s.id, dev->ordinal);
  return r;
}

}  // namespace vlake::pool
