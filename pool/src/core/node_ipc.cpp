// vlake::pool::Node: CUDA IPC of alloc grants (docs/ipc.md). Served memory is VMM memory, which
// the driver's legacy IPC refuses; the hook emulates cuIpcGetMemHandle / cuIpcOpenMemHandle /
// cuIpcCloseMemHandle with these three requests.
//
// Rules
// - IpcExport: an alloc grant of the session with its handles (not orphaned, not sharing dedup
//   chunks) gets a token and a secret (getrandom), the same for the grant's whole life.
// - IpcOpen{token, secret}: unknown token, wrong secret or a grant its owner released (held for
//   the imports already open) -> unknown_handle; the importer's
//   tenant is neither the owner's nor in a namespace declaring the owner's `ipc_domain` ->
//   ipc_denied (both counted in ipc_refused, logged rate-limited); the importer at its grant cap
//   (grants + imports) or the import table full -> limit_reached. Otherwise the grant's handles
//   (one descriptor per piece, in VA order) and a new import id.
// - The memory stays charged to the owner. A grant whose owner releases it (or whose session
//   ends) while imports are open is held — charged, out of the session's list — until the last
//   import closes (IpcClose, or the importer's session ends). A grant that was ever imported is
//   finished with its handles retired (docs/pool.md, "Handle binding"), never pooled.
#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>
#include <stdexcept>

#include "vlake/contracts/codec.hpp"
#include "vlake/pool/features/dedup/dedup.hpp"
#include "vlake/pool/node.hpp"

namespace vlake::pool {

namespace {

// A random non-zero 64-bit value (the kernel's CSPRNG). Throws on failure.
std::uint64_t random_u64() {
  for (;;) {
    std::uint64_t v = 0;
    const ssize_t n = ::getrandom(&v, sizeof v, 0);
    if (n == static_cast<ssize_t>(sizeof v)) {
      if (v != 0) return v;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    throw std::runtime_error(std::string("getrandom: ") + std::strerror(errno));
  }
}

}  // namespace

std::size_t Node::imports_of(TenantId t) const {
  // By the importing session's tenant now (a reload may have moved the session).
  std::size_t n = 0;
  for (const auto& [sid, imp] : rooms_.ipc.per_session()) {
    const Session* s = session(sid);
    n += (s != nullptr ? s->tenant : imp.tenant) == t ? imp.count : 0;
  }
  return n;
}

std::size_t Node::import_holders() const {
  std::set<TenantId> held;
  for (const auto& [sid, imp] : rooms_.ipc.per_session()) {
    const Session* s = session(sid);
    held.insert(s != nullptr ? s->tenant : imp.tenant);
  }
  return held.size();
}

std::variant<proto::IpcExportReply, Malformed> Node::ipc_export(std::uint64_t session, const proto::IpcExport& m) {
  const Session* s = this->session(session);
  if (s == nullptr) return Malformed{"session is gone"};
  proto::IpcExportReply r = proto::make<proto::IpcExportReply>(m.h.request_id);
  if (!s->holds(m.grant_id)) return with_status(r, proto::Status::unknown_grant);
  const Grant& g = grants_.at(m.grant_id);
  const Tenant& t = tenants_.at(s->tenant.value());
  // Only memory this daemon can hand out again: an alloc grant with live handles whose layout is
  // the plain one (shared dedup chunks are not exported; docs/ipc.md, "Limits").
  if (g.purpose != proto::GrantPurpose::alloc || g.orphaned || g.handles.empty() ||
      (dedup_ && dedup_->is_shared(g.id))) {
    limited_.info("ipc export " + t.name,
                  "tenant " + t.name + ": IPC export of grant " + std::to_string(g.id) +
                      " refused: not an alloc grant with handles of its own (counted, orphaned or dedup-shared)",
                  steady_now());
    r.status = proto::Status::bad_request;
    return r;
  }
  const IpcRegistry::Export* e = nullptr;
  bool fresh = false;
  try {
    e = &rooms_.ipc.export_grant(g.id, random_u64, &fresh);
  } catch (const std::exception& ex) {
    limited_.write(LogLevel::error, "ipc random", std::string("IPC export failed: ") + ex.what(), steady_now());
    r.status = proto::Status::internal;
    return r;
  }
  if (fresh) {
    ++counters_.ipc_exports;
    if (log_.enabled(LogLevel::debug)) {
      log_.debug("grant " + std::to_string(g.id) + " of " + t.name + " exported for CUDA IPC");
    }
  }
  r.status = proto::Status::ok;
  r.token = e->token;
  r.secret = e->secret;
  r.bytes = g.bytes.value();
  return r;
}

std::variant<Node::IpcOpened, Malformed> Node::ipc_open(std::uint64_t session, const proto::IpcOpen& m, Now now) {
  auto sit = sessions_.find(session);
  if (sit == sessions_.end()) return Malformed{"session is gone"};
  last_now_ = std::max(last_now_, now.steady);
  Session& s = sit->second;
  const Tenant& me = tenants_.at(s.tenant.value());
  IpcOpened out;
  proto::IpcOpenReply& r = out.reply;
  r.h = proto::make_header<proto::IpcOpenReply>(proto::MsgType::ipc_open_reply, m.h.request_id);
  auto refuse = [&](proto::Status st, const std::string& why) {
    ++counters_.ipc_refused;
    limited_.warn("ipc refused " + me.name,
                  "tenant " + me.name + " (pid " + std::to_string(s.pid) + "): IPC open refused: " + why, now.steady);
    r.status = st;
    return out;
  };
  if (!rooms_.ipc.known_token(m.token)) return refuse(proto::Status::unknown_handle, "unknown handle");
  const std::optional<std::uint64_t> named = rooms_.ipc.find(m.token, m.secret);
  auto git = named ? grants_.find(*named) : grants_.end();
  if (git == grants_.end()) return refuse(proto::Status::unknown_handle, "unknown handle or wrong secret");
  Grant& g = git->second;
  const Tenant* owner = tenant(g.tenant);
  const bool same = g.tenant == s.tenant;
  const bool domain = owner != nullptr && !owner->ipc_domain.empty() && owner->ipc_domain == me.ipc_domain;
  if (!same && !domain) {
    return refuse(proto::Status::ipc_denied, "the handle belongs to tenant " +
                                                 (owner != nullptr ? owner->name : std::string("?")) +
                                                 ", outside this tenant's ipc_domain");
  }
  if (g.handles.empty()) return refuse(proto::Status::unknown_handle, "the grant has no handles left");
  // Freed by its owner, held only for the imports already open: no new ones (as the driver
  // refuses a handle of freed memory).
  if (rooms_.ipc.released(g.id)) return refuse(proto::Status::unknown_handle, "the memory was freed by its owner");
  if (const std::size_t held = grants_of(me.id) + imports_of(me.id); held >= settings_.max_grants_per_tenant) {
    ++counters_.denials_grant_cap;
    limited_.warn("grant cap " + me.name,
                  "tenant " + me.name + ": IPC open refused: grant cap: " + std::to_string(held) + " of " +
                      std::to_string(settings_.max_grants_per_tenant) +
                      " grants and imports (vlaked --max-grants-per-tenant)",
                  now.steady);
    r.status = proto::Status::limit_reached;
    return out;
  }
  // The import table is shared fairly (fair_share.hpp): near full, a tenant holding its share
  // of imports already is refused, so colluding tenants cannot take the last imports.
  const std::size_t imports = rooms_.ipc.imports().size();
  const bool contended = rooms_.import_share.contended(imports);
  const std::size_t mine = contended ? imports_of(me.id) : 0;
  const FairShare::Table table{imports, contended ? import_holders() : std::size_t{0}};
  if (const FairShare::Verdict v = rooms_.import_share.decide(table, mine); v != FairShare::Verdict::admit) {
    const bool full = v == FairShare::Verdict::table_full;
    if (full) ++counters_.denials_other;
    else ++counters_.denials_grant_cap;
    limited_.write(full ? LogLevel::error : LogLevel::warn, full ? "import table" : "import share " + me.name,
                   "tenant " + me.name + ": IPC open refused: " +
                       rooms_.import_share.describe(v, "import", "tenant " + me.name, table, mine),
                   now.steady);
    r.status = proto::Status::limit_reached;
    return out;
  }
  Device& dev = devices_.at(static_cast<std::size_t>(g.device.value()));
  // A share of this grant being planned would replace the handles the importer maps: the import
  // wins (the owner's ShareCommit then answers unknown_grant).
  if (dedup_) {
    if (const Dedup::Plan* p = dedup_->pending(g.session); p != nullptr && p->grant_id == g.id) {
      dedup_->abort(g.session, *dev.pool, g.tenant);
      (void)settle_device(dev);
      changes_.devices = true;
    }
  }
  std::uint64_t offset = 0;
  for (const auto& h : g.handles) {
    proto::SharePiece& p = r.pieces[r.piece_count++];
    p.size = h->size.value();
    p.offset = offset;
    p.flags = 0;
    p.keep_index = 0;
    offset += h->size.value();
    out.fds.push_back(h->fd.get());
  }
  const Import& imp = rooms_.ipc.open(s.id, s.tenant, g.id);
  ++counters_.ipc_opens;
  touch_tenant(s.tenant);  // its imported figure (state.hpp TenantRecord::ipc_imported)
  r.status = proto::Status::ok;
  r.import_id = imp.id;
  r.bytes = g.bytes.value();
  std::memcpy(r.device_uuid, dev.uuid.data(), sizeof r.device_uuid);
  r.owner_tenant = g.tenant.value();
  if (log_.enabled(LogLevel::debug)) {
    log_.debug("grant " + std::to_string(g.id) + " opened by session " + std::to_string(s.id) + " (" + me.name +
               "), import " + std::to_string(imp.id));
  }
  return out;
}

void Node::ipc_undeliverable(std::uint64_t import_id) {
  if (rooms_.ipc.imports().count(import_id) == 0) return;
  --counters_.ipc_opens;
  drop_import(import_id);
}

std::variant<proto::IpcCloseAck, Malformed> Node::ipc_close(std::uint64_t session, const proto::IpcClose& m) {
  if (sessions_.count(session) == 0) return Malformed{"session is gone"};
  proto::IpcCloseAck ack{};
  ack.h = proto::make_header<proto::IpcCloseAck>(proto::MsgType::ipc_close_ack, m.h.request_id);
  auto it = rooms_.ipc.imports().find(m.import_id);
  if (it == rooms_.ipc.imports().end() || it->second.session != session) {
    ack.status = proto::Status::unknown_handle;
    return ack;
  }
  drop_import(m.import_id);
  ack.status = proto::Status::ok;
  return ack;
}

void Node::drop_import(std::uint64_t import_id) {
  const auto open = rooms_.ipc.imports().find(import_id);
  if (open == rooms_.ipc.imports().end()) return;
  const Session* importer = session(open->second.session);
  touch_tenant(importer != nullptr ? importer->tenant : open->second.tenant);  // its imported figure
  const std::optional<IpcRegistry::Closed> c = rooms_.ipc.close(import_id);
  if (!c) return;
  auto git = grants_.find(c->grant);
  if (git == grants_.end()) return;
  Grant& g = git->second;
  if (c->finish) {
    const TenantId owner = g.tenant;
    finish_grant(g, owner, true);  // imported: retired, never pooled
    free_tenant_if_idle(owner);
  }
}

// Every import of the session (it ended).
void Node::drop_imports_of(std::uint64_t session) {
  for (std::uint64_t id : rooms_.ipc.imports_of_session(session)) drop_import(id);
}

// A grant that is being released (by its owner, or at its session's end): true if it is held
// for open imports (marked released, out of its session's list) instead of being finished.
bool Node::hold_for_imports(Grant& g) {
  if (!rooms_.ipc.hold(g.id)) return false;
  auto sit = sessions_.find(g.session);
  if (sit != sessions_.end()) {
    auto& v = sit->second.grants;
    v.erase(std::remove(v.begin(), v.end(), g.id), v.end());
    touch_session(sit->second);
  }
  changes_.grants.insert(g.slot);
  touch_tenant(g.tenant);  // its ipc_held figure
  limited_.info("ipc held " + std::to_string(g.tenant.value()),
                "grant " + std::to_string(g.id) + " released by its owner while " +
                    std::to_string(rooms_.ipc.imports_open(g.id)) +
                    " IPC import(s) are open: held (and charged) until they close",
                steady_now());
  return true;
}

}  // namespace vlake::pool
