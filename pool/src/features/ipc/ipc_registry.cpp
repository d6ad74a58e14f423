#include "vlake/pool/features/ipc/ipc_registry.hpp"

namespace vlake::pool {

const IpcRegistry::Export& IpcRegistry::export_grant(std::uint64_t grant, const Random& random, bool* fresh) {
  Export& e = grants_[grant];
  if (fresh != nullptr) *fresh = e.token == 0;
  if (e.token != 0) return e;
  try {
    std::uint64_t token = random();
    while (token == 0 || tokens_.count(token) != 0) token = random();
    std::uint64_t secret = random();
    while (secret == 0) secret = random();
    e.token = token;
    e.secret = secret;
    tokens_[token] = grant;
  } catch (...) {
    if (e.imports == 0 && !e.imported) grants_.erase(grant);
    throw;
  }
  return e;
}

std::optional<std::uint64_t> IpcRegistry::find(std::uint64_t token, std::uint64_t secret) const {
  auto tok = tokens_.find(token);
  if (tok == tokens_.end()) return std::nullopt;
  auto it = grants_.find(tok->second);
  // Compared without an early exit on the first differing byte.
  if (it == grants_.end() || ((it->second.secret ^ secret) != 0)) return std::nullopt;
  return tok->second;
}

const ImportRecord& IpcRegistry::open(std::uint64_t session, TenantId tenant, std::uint64_t grant) {
  ImportRecord imp;
  imp.id = next_import_id_++;
  imp.session = session;
  imp.tenant = tenant;
  imp.grant = grant;
  Export& e = grants_[grant];
  ++e.imports;
  e.imported = true;
  SessionImports& mine = per_session_[session];
  if (mine.count++ == 0) mine.tenant = tenant;
  ++mine.grants[grant];
  return imports_.emplace(imp.id, imp).first->second;
}

std::optional<IpcRegistry::Closed> IpcRegistry::close(std::uint64_t import_id) {
  auto it = imports_.find(import_id);
  if (it == imports_.end()) return std::nullopt;
  Closed c;
  c.grant = it->second.grant;
  if (auto ps = per_session_.find(it->second.session); ps != per_session_.end()) {
    if (auto pg = ps->second.grants.find(c.grant); pg != ps->second.grants.end() && --pg->second == 0) {
      ps->second.grants.erase(pg);
    }
    if (--ps->second.count == 0) per_session_.erase(ps);
  }
  imports_.erase(it);
  auto g = grants_.find(c.grant);
  if (g == grants_.end()) return c;
  if (g->second.imports > 0) --g->second.imports;
  c.finish = g->second.imports == 0 && g->second.released;
  return c;
}

std::vector<std::uint64_t> IpcRegistry::imports_of_session(std::uint64_t session) const {
  std::vector<std::uint64_t> ids;
  for (const auto& [id, imp] : imports_) {
    if (imp.session == session) ids.push_back(id);
  }
  return ids;
}

bool IpcRegistry::hold(std::uint64_t grant) {
  auto it = grants_.find(grant);
  if (it == grants_.end() || it->second.imports == 0) return false;
  it->second.released = true;
  released_.insert(grant);
  return true;
}

void IpcRegistry::forget_grant(std::uint64_t grant) {
  auto it = grants_.find(grant);
  if (it == grants_.end()) return;
  if (it->second.token != 0) tokens_.erase(it->second.token);
  released_.erase(grant);
  grants_.erase(it);
}

std::uint32_t IpcRegistry::imports_open(std::uint64_t grant) const {
  auto it = grants_.find(grant);
  return it == grants_.end() ? 0 : it->second.imports;
}

bool IpcRegistry::ever_imported(std::uint64_t grant) const {
  auto it = grants_.find(grant);
  return it != grants_.end() && it->second.imported;
}

bool IpcRegistry::released(std::uint64_t grant) const {
  auto it = grants_.find(grant);
  return it != grants_.end() && it->second.released;
}

}  // namespace vlake::pool
