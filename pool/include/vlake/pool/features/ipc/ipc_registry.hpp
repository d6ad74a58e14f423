// vlake::pool::IpcRegistry — CUDA IPC of alloc grants (docs/ipc.md): which grants are exported
// (token and secret), which imports are open, and which released grants are held for them.
//
// What it does
//   - export_grant(): a grant's token and secret, drawn once (non-zero, tokens unique) and the
//     same for the grant's whole life; find(token, secret) answers the grant they name, with the
//     secret compared without an early exit.
//   - open()/close(): imports (import id, importing session and tenant, grant). A grant that was
//     ever imported is retired at its end, never pooled (ever_imported()).
//   - hold(): a grant its owner releases while imports are open is held (released() true)
//     until the last import closes: close() then says the grant is to be finished.
//   - forget_grant(): the grant ended; its token dies with it.
//   The Node decides who may open what (tenant, ipc_domain, caps) and owns the grants.
// Ownership: plain values keyed by grant and import ids. Errors: export_grant() passes on what
//   its random source throws (nothing is recorded then). Thread-safety: none; the loop's thread.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "vlake/common/strong_types.hpp"

namespace vlake::pool {

// An open IPC import: `session` (of `tenant`) maps grant `grant` (docs/ipc.md).
struct ImportRecord {
  std::uint64_t id = 0;
  std::uint64_t session = 0;
  TenantId tenant;
  std::uint64_t grant = 0;
};

class IpcRegistry {
 public:
  // What the registry knows of one grant.
  struct Export {
    std::uint64_t token = 0;  // 0: never exported
    std::uint64_t secret = 0;
    std::uint32_t imports = 0;  // open now
    bool imported = false;      // ever opened by an import
    bool released = false;      // its owner released it; held for its open imports
  };
  // Draws a random non-zero 64-bit value (getrandom in vlaked); may throw.
  using Random = std::function<std::uint64_t()>;

  // The grant's token and secret, drawn now if it has none (`fresh` true). Throws what `random` throws.
  const Export& export_grant(std::uint64_t grant, const Random& random, bool* fresh = nullptr);
  // The grant a token and secret name (nullopt: unknown token or wrong secret).
  [[nodiscard]] std::optional<std::uint64_t> find(std::uint64_t token, std::uint64_t secret) const;
  [[nodiscard]] bool known_token(std::uint64_t token) const { return tokens_.count(token) != 0; }

  // Opens an import of `grant` for `session` of `tenant`; returns it (a new import id).
  const ImportRecord& open(std::uint64_t session, TenantId tenant, std::uint64_t grant);
  struct Closed {
    std::uint64_t grant = 0;
    bool finish = false;  // its last import closed and its owner had released it
  };
  // Closes an import (nullopt: no such import).
  std::optional<Closed> close(std::uint64_t import_id);
  // The session's open imports (its process ended).
  [[nodiscard]] std::vector<std::uint64_t> imports_of_session(std::uint64_t session) const;
  // A grant being released: true (held, released() from now on) if imports are open.
  bool hold(std::uint64_t grant);
  // The grant ended: its token and record go.
  void forget_grant(std::uint64_t grant);

  [[nodiscard]] std::uint32_t imports_open(std::uint64_t grant) const;
  [[nodiscard]] bool ever_imported(std::uint64_t grant) const;
  // The grant has a token (exported, maybe not imported yet).
  [[nodiscard]] bool exported(std::uint64_t grant) const { return grants_.count(grant) != 0; }
  [[nodiscard]] bool released(std::uint64_t grant) const;
  [[nodiscard]] const std::unordered_map<std::uint64_t, ImportRecord>& imports() const noexcept { return imports_; }
  // Open imports per importing session, with the session's tenant when it opened the first of
  // them and the open imports per grant (what the import caps, the import table's fair share and
  // the per-tenant views count, without a walk over every import).
  struct SessionImports {
    std::uint32_t count = 0;
    TenantId tenant{};
    std::unordered_map<std::uint64_t, std::uint32_t> grants;  // grant id -> imports of it open
  };
  [[nodiscard]] const std::unordered_map<std::uint64_t, SessionImports>& per_session() const noexcept {
    return per_session_;
  }
  // The grants held for their imports after their owner released them (released() true).
  [[nodiscard]] const std::unordered_set<std::uint64_t>& released_grants() const noexcept { return released_; }

 private:
  std::unordered_map<std::uint64_t, Export> grants_;               // by grant id (exported or imported)
  std::unordered_map<std::uint64_t, std::uint64_t> tokens_;        // token -> grant id
  std::unordered_map<std::uint64_t, ImportRecord> imports_;        // by import id
  std::unordered_map<std::uint64_t, SessionImports> per_session_;  // by importing session
  std::unordered_set<std::uint64_t> released_;                     // grants with released true
  std::uint64_t next_import_id_ = 1;
};

}  // namespace vlake::pool
