#include "vlake/pool/planner.hpp"

#include <algorithm>
#include <map>

namespace vlake::pool {

void CostModel::observe(Call c, double ns, Bytes bytes) {
  if (!(ns >= 0)) return;
  auto fold = [&](double& v, double sample) { v = (1.0 - alpha) * v + alpha * sample; };
  switch (c) {
    case Call::create: fold(create_ns, ns); break;
    case Call::export_fd: fold(export_ns, ns); break;
    case Call::map: fold(map_ns, ns); break;
    case Call::set_access: fold(set_access_ns, ns); break;
    case Call::release: fold(release_ns, ns); break;
    case Call::scrub:
      if (bytes.value() == 0) return;
      fold(scrub_ns_per_mib,
           std::max(0.0, ns - kScrubFixedNs) * static_cast<double>(1u << 20) / static_cast<double>(bytes.value()));
      break;
  }
}

const char* plan_kind_name(PlanKind k) noexcept {
  switch (k) {
    case PlanKind::none: return "none";
    case PlanKind::exact: return "exact";
    case PlanKind::stitch: return "stitched";
    case PlanKind::create: return "new";
    case PlanKind::release_create: return "release+new";
  }
  return "?";
}

bool needs_scrub(const FreeHandleView& h, TenantId tenant) noexcept {
  if (h.clean) return false;
  return !h.last_tenant || *h.last_tenant != tenant;
}

double plan_cost(const PlanInput& in, const CostModel& m, PlanKind kind, const std::vector<std::size_t>& use,
                 const std::vector<std::size_t>& release) {
  double cost = 0;
  switch (kind) {
    case PlanKind::none: return 0;
    case PlanKind::exact:
    case PlanKind::stitch:
      for (std::size_t i : use) {
        cost += m.tenant_per_handle();
        if (needs_scrub(in.free[i], in.tenant)) cost += m.scrub(in.free[i].size);
      }
      return cost;
    case PlanKind::release_create:
      // Releasing a free handle costs its unmap + release now, and throws away what it cost to
      // build (create + export + map + set-access), paid again when the pool grows back.
      cost += static_cast<double>(release.size()) * (m.release_ns + m.daemon_create());
      [[fallthrough]];
    case PlanKind::create:
      // A new handle is zeroed before its first grant.
      return cost + m.daemon_create() + m.tenant_per_handle() + m.scrub(in.bytes);
  }
  return cost;
}

namespace {

struct SizeClass {
  Bytes size;
  std::vector<std::size_t> idx;  // preferred first
};

// Depth-first over size classes (largest first), taking as many of each as fit: finds a
// combination with few handles first. Bounded by `budget` steps.
bool search(const std::vector<SizeClass>& classes, std::size_t ci, std::uint64_t remaining, std::uint32_t left,
            std::vector<std::pair<std::size_t, std::uint32_t>>& take, int& budget) {
  if (remaining == 0) return true;
  if (ci >= classes.size() || left == 0 || --budget <= 0) return false;
  const SizeClass& c = classes[ci];
  const std::uint64_t s = c.size.value();
  std::uint64_t most = std::min<std::uint64_t>({remaining / s, c.idx.size(), left});
  for (std::uint64_t k = most + 1; k-- > 0;) {
    if (k > 0) take.emplace_back(ci, static_cast<std::uint32_t>(k));
    if (search(classes, ci + 1, remaining - k * s, left - static_cast<std::uint32_t>(k), take, budget)) return true;
    if (k > 0) take.pop_back();
    if (budget <= 0) return false;
  }
  return false;
}

}  // namespace

Plan plan(const PlanInput& in, const CostModel& m) {
  std::vector<Plan> candidates;
  const std::uint64_t want = in.bytes.value();

  // exact / stitch from the free pool
  {
    std::map<std::uint64_t, SizeClass, std::greater<>> by_size;
    for (std::size_t i = 0; i < in.free.size(); ++i) {
      const std::uint64_t s = in.free[i].size.value();
      if (s == 0 || s > want || in.free[i].foreign) continue;
      if (in.free[i].kept_elsewhere && s != want && want <= in.device_free.value()) continue;
      auto& c = by_size[s];
      c.size = in.free[i].size;
      c.idx.push_back(i);
    }
    std::vector<SizeClass> classes;
    for (auto& [s, c] : by_size) {
      // Kept mapped by the requester, then not kept by another process, then same tenant (no
      // scrub), then clean, then the most recently freed.
      std::stable_sort(c.idx.begin(), c.idx.end(), [&](std::size_t a, std::size_t b) {
        if (in.free[a].kept_here != in.free[b].kept_here) return in.free[a].kept_here;
        if (in.free[a].kept_elsewhere != in.free[b].kept_elsewhere) return in.free[b].kept_elsewhere;
        const bool sa = !needs_scrub(in.free[a], in.tenant);
        const bool sb = !needs_scrub(in.free[b], in.tenant);
        if (sa != sb) return sa;
        return in.free[a].freed_seq > in.free[b].freed_seq;
      });
      classes.push_back(std::move(c));
    }
    std::vector<std::pair<std::size_t, std::uint32_t>> take;
    int budget = 4096;
    if (search(classes, 0, want, std::max<std::uint32_t>(in.max_handles, 1), take, budget)) {
      Plan p;
      for (const auto& [ci, k] : take) {
        for (std::uint32_t j = 0; j < k; ++j) p.use.push_back(classes[ci].idx[j]);
      }
      p.kind = p.use.size() == 1 ? PlanKind::exact : PlanKind::stitch;
      candidates.push_back(std::move(p));
    }
  }

  // create
  if (want <= in.device_free.value()) {
    Plan p;
    p.kind = PlanKind::create;
    candidates.push_back(std::move(p));
  } else {
    // release (least recently freed first) + create
    std::vector<std::size_t> order(in.free.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t a, std::size_t b) { return in.free[a].freed_seq < in.free[b].freed_seq; });
    std::uint64_t room = in.device_free.value();
    Plan p;
    p.kind = PlanKind::release_create;
    for (std::size_t i : order) {
      if (room >= want) break;
      p.release.push_back(i);
      room += in.free[i].size.value();
    }
    if (room >= want) candidates.push_back(std::move(p));
  }

  Plan best;
  for (Plan& p : candidates) {
    p.cost_ns = plan_cost(in, m, p.kind, p.use, p.release);
    for (std::size_t i : p.use) {
      if (needs_scrub(in.free[i], in.tenant)) ++p.scrubs;
      if (in.free[i].last_tenant && *in.free[i].last_tenant != in.tenant) p.cross_tenant = true;
    }
    if (p.kind == PlanKind::create || p.kind == PlanKind::release_create) p.scrubs = 1;
    if (best.kind == PlanKind::none || p.cost_ns < best.cost_ns) best = std::move(p);
  }
  return best;
}

}  // namespace vlake::pool
