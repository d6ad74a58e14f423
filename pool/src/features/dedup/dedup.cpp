#include "vlake/pool/features/dedup/dedup.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

namespace vlake::pool {

std::uint64_t chunk_hash(const void* data, std::size_t n) noexcept { return chunk_hash_reference(data, n); }

int Dedup::Piece::fd() const noexcept {
  if (kind == PieceKind::copy && handle) return handle->fd.get();
  return -1;
}

int Dedup::chunk_fd(std::uint64_t chunk) const {
  auto it = chunks_.find(chunk);
  return it == chunks_.end() || !it->second->handle ? -1 : it->second->handle->fd.get();
}

const Dedup::Plan* Dedup::pending(std::uint64_t session) const {
  auto it = pending_.find(session);
  return it == pending_.end() ? nullptr : &it->second;
}

std::uint64_t Dedup::find_or_add(DevicePool& pool, TenantId tenant, const std::string& domain, std::uint64_t h,
                                 Bytes size, PoolHandle& src, Bytes src_offset, bool& merged) {
  const Key key{domain, pool.device().value(), size.value(), h};
  auto [lo, hi] = index_.equal_range(key);
  bool loaded = false;
  for (auto it = lo; it != hi; ++it) {
    Chunk& c = *chunks_.at(it->second);
    const auto n = static_cast<std::size_t>(size.value());
    if (!loaded) {
      mine_.resize(n);
      driver_.copy_to_host(mine_.data(), DevicePtr{src.va.value() + src_offset.value()}, size);
      loaded = true;
    }
    scratch_.resize(n);
    driver_.copy_to_host(scratch_.data(), c.handle->va, size);
    if (std::memcmp(scratch_.data(), mine_.data(), n) == 0) {
      ++c.refs;
      merged = true;
      return c.id;
    }
  }
  // A new shared chunk: a G handle from the pool, filled on the device from the tenant's chunk
  // (with binding, bound to the tenant that creates it).
  DevicePool::Served s = pool.serve(size, tenant, 1);
  auto c = std::make_unique<Chunk>();
  c->handle = std::move(s.handles.at(0));
  try {
    driver_.copy_device(c->handle->va, DevicePtr{src.va.value() + src_offset.value()}, size);
  } catch (...) {
    pool.put_back(std::move(c->handle), tenant);
    throw;
  }
  c->id = next_chunk_++;
  c->device = pool.device();
  c->hash = h;
  c->domain = domain;
  c->refs = 1;
  const std::uint64_t id = c->id;
  index_.emplace(key, id);
  chunks_.emplace(id, std::move(c));
  merged = false;
  return id;
}

void Dedup::unref(std::uint64_t chunk, DevicePool& pool) noexcept {
  auto it = chunks_.find(chunk);
  if (it == chunks_.end()) return;
  Chunk& c = *it->second;
  if (c.refs > 1) {
    --c.refs;
    return;
  }
  const Key key{c.domain, c.device.value(), c.handle->size.value(), c.hash};
  auto [lo, hi] = index_.equal_range(key);
  for (auto x = lo; x != hi; ++x) {
    if (x->second == chunk) {
      index_.erase(x);
      break;
    }
  }
  // Its descriptor went to every tenant that merged it: with binding it never serves anyone
  // again (retired, its descriptor kept while another process holds it, charged to the tenant
  // that created it). Without: no tenant, so the next grant of this handle scrubs it.
  try {
    if (pool.binding()) pool.retire(std::move(c.handle));
    else pool.put_back(std::move(c.handle), TenantId{0});
  } catch (...) {
    log_.error("dedup: returning a shared chunk to the pool failed");
  }
  chunks_.erase(it);
}

void Dedup::drop_plan(Plan& p, DevicePool& pool, TenantId tenant) noexcept {
  for (Piece& piece : p.pieces) {
    if (piece.kind == PieceKind::copy && piece.handle) {
      try {
        pool.put_back(std::move(piece.handle), tenant);
      } catch (...) {
      }
    } else if (piece.kind == PieceKind::shared) {
      unref(piece.chunk, pool);
    }
  }
  p.pieces.clear();
}

const Dedup::Plan& Dedup::plan(std::uint64_t session, std::uint64_t grant_id, DevicePool& pool, TenantId tenant,
                               const std::string& domain, const std::vector<std::unique_ptr<PoolHandle>>& handles,
                               Bytes offset, Bytes bytes) {
  abort(session, pool, tenant);
  const std::uint64_t g = pool.granularity().value();
  std::uint64_t total = 0;
  for (const auto& h : handles) total += h->size.value();
  const std::uint64_t a = offset.value();
  const std::uint64_t b = a + bytes.value();
  if (bytes.value() == 0 || a % g != 0 || b % g != 0 || b > total || b < a) {
    throw std::invalid_argument("range [" + std::to_string(a) + ", " + std::to_string(b) +
                                ") is not chunk-aligned inside the grant of " + std::to_string(total) + " bytes");
  }
  Plan p;
  p.grant_id = grant_id;
  p.device = pool.device();
  try {
    std::uint64_t o = 0;
    for (std::uint32_t i = 0; i < handles.size(); ++i) {
      PoolHandle& h = *handles[i];
      const std::uint64_t end = o + h.size.value();
      if (end <= a || o >= b) {
        Piece k;
        k.offset = Bytes{o};
        k.size = h.size;
        k.kind = PieceKind::keep;
        k.keep_index = i;
        p.pieces.push_back(std::move(k));
        o = end;
        continue;
      }
      auto copy_part = [&](std::uint64_t from, std::uint64_t to) {
        if (from >= to) return;
        DevicePool::Served s = pool.serve(Bytes{to - from}, tenant, 1);
        Piece c;
        c.offset = Bytes{from};
        c.size = Bytes{to - from};
        c.kind = PieceKind::copy;
        c.handle = std::move(s.handles.at(0));
        driver_.copy_device(c.handle->va, DevicePtr{h.va.value() + (from - o)}, Bytes{to - from});
        p.copied += c.size;
        p.pieces.push_back(std::move(c));
      };
      const std::uint64_t in_from = std::max(o, a);
      const std::uint64_t in_to = std::min(end, b);
      copy_part(o, in_from);
      for (std::uint64_t c = in_from; c < in_to; c += g) {
        // Hashed where it lies (the daemon's mapping of the tenant's chunk); no host copy.
        const std::uint64_t hash = driver_.hash_chunk(DevicePtr{h.va.value() + (c - o)}, Bytes{g});
        bool merged = false;
        Piece s;
        s.offset = Bytes{c};
        s.size = Bytes{g};
        s.kind = PieceKind::shared;
        s.chunk = find_or_add(pool, tenant, domain, hash, Bytes{g}, h, Bytes{c - o}, merged);
        p.shared += Bytes{g};
        if (merged) p.merged += Bytes{g};
        p.pieces.push_back(std::move(s));
      }
      copy_part(in_to, end);
      o = end;
    }
  } catch (...) {
    drop_plan(p, pool, tenant);
    throw;
  }
  auto [it, inserted] = pending_.insert_or_assign(session, std::move(p));
  (void)inserted;
  return it->second;
}

bool Dedup::commit(std::uint64_t session, std::vector<std::unique_ptr<PoolHandle>>& handles, DevicePool& pool,
                   TenantId tenant) noexcept {
  auto it = pending_.find(session);
  if (it == pending_.end()) return false;
  Plan& p = it->second;
  std::vector<std::unique_ptr<PoolHandle>> next;
  std::vector<std::uint64_t> refs;
  std::vector<bool> kept(handles.size(), false);
  for (Piece& piece : p.pieces) {
    switch (piece.kind) {
      case PieceKind::keep:
        kept[piece.keep_index] = true;
        next.push_back(std::move(handles[piece.keep_index]));
        break;
      case PieceKind::copy: next.push_back(std::move(piece.handle)); break;
      case PieceKind::shared: refs.push_back(piece.chunk); break;
    }
  }
  // The replaced handles go back to the driver, not into the free pool: the memory a share
  // saves must show up as free GPU memory (docs/dedup.md, "Accounting"). Their descriptors went
  // to `tenant`: retire() keeps each open, held and charged to it, while another process still
  // holds it (docs/security.md, docs/pool.md "Handle binding"); the caller settles the pool.
  for (std::size_t i = 0; i < handles.size(); ++i) {
    if (!kept[i] && handles[i]) pool.retire(std::move(handles[i]), tenant);
  }
  handles = std::move(next);
  auto& v = grant_refs_[p.grant_id];
  v.insert(v.end(), refs.begin(), refs.end());
  pending_.erase(it);
  return true;
}

void Dedup::abort(std::uint64_t session, DevicePool& pool, TenantId tenant) noexcept {
  auto it = pending_.find(session);
  if (it == pending_.end()) return;
  drop_plan(it->second, pool, tenant);
  pending_.erase(it);
}

void Dedup::release_grant(std::uint64_t grant_id, DevicePool& pool) noexcept {
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (it->second.grant_id == grant_id) {
      drop_plan(it->second, pool, TenantId{0});
      it = pending_.erase(it);
    } else {
      ++it;
    }
  }
  auto it = grant_refs_.find(grant_id);
  if (it == grant_refs_.end()) return;
  for (std::uint64_t c : it->second) unref(c, pool);
  grant_refs_.erase(it);
}

void Dedup::retire_all(std::map<int, DevicePool*> pools) noexcept {
  for (auto& [s, p] : pending_) {
    auto pit = pools.find(p.device.value());
    for (Piece& piece : p.pieces) {
      if (piece.kind == PieceKind::copy && piece.handle && pit != pools.end())
        pit->second->retire(std::move(piece.handle));
    }
  }
  pending_.clear();
  for (auto& [id, c] : chunks_) {
    auto pit = pools.find(c->device.value());
    if (pit != pools.end() && c->handle) pit->second->retire(std::move(c->handle));
  }
  chunks_.clear();
  index_.clear();
  grant_refs_.clear();
}

std::vector<SharedRef> Dedup::refs(std::uint64_t grant_id) const {
  std::vector<SharedRef> out;
  auto it = grant_refs_.find(grant_id);
  if (it == grant_refs_.end()) return out;
  out.reserve(it->second.size());
  for (std::uint64_t id : it->second) {
    auto c = chunks_.find(id);
    if (c != chunks_.end() && c->second->handle) out.push_back(SharedRef{id, c->second->handle->size});
  }
  return out;
}

Bytes Dedup::logical_bytes(DeviceOrdinal d) const {
  std::uint64_t sum = 0;
  for (const auto& [gid, refs] : grant_refs_) {
    for (std::uint64_t id : refs) {
      auto it = chunks_.find(id);
      if (it != chunks_.end() && it->second->device == d) sum += it->second->handle->size.value();
    }
  }
  return Bytes{sum};
}

Bytes Dedup::physical_bytes(DeviceOrdinal d) const {
  std::uint64_t sum = 0;
  for (const auto& [id, c] : chunks_) {
    if (c->device == d && c->handle) sum += c->handle->size.value();
  }
  return Bytes{sum};
}

}  // namespace vlake::pool
