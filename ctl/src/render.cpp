#include "vlake/ctl/render.hpp"

#include <cstdio>
#include <ctime>

#include "vlake/ctl/format.hpp"
#include "vlake/ctl/json.hpp"

namespace vlake::ctl {

namespace {

std::string sz(std::uint64_t b) { return human_size(Bytes{b}); }

std::string join_pids(const std::vector<std::uint32_t>& pids) {
  if (pids.empty()) return "-";
  std::string s;
  for (std::size_t i = 0; i < pids.size(); ++i) {
    if (i > 0) s += ',';
    s += std::to_string(pids[i]);
  }
  return s;
}

std::string daemon_status(const DaemonView& d) {
  if (d.alive) return "running";
  return d.clean ? "stopped" : "not running";
}

std::string heading(const NodeView& v, const std::string& state, const std::string& stamp) {
  std::string s = "vlaked pid " + std::to_string(v.daemon.pid) + " (" + daemon_status(v.daemon) + "), state " + state +
                  ", " + std::to_string(v.sessions) + " session" + (v.sessions == 1 ? "" : "s") + ", " +
                  std::to_string(v.grants) + " grant" + (v.grants == 1 ? "" : "s");
  if (!stamp.empty()) s += ", at " + stamp;
  return s + "\n";
}

void daemon_json(JsonWriter& j, const DaemonView& d) {
  j.key("daemon").begin_object();
  j.field_uint("layout_version", d.layout_version);
  j.field_uint("pid", d.pid);
  j.field_uint("start_time", d.start_time);
  j.field_uint("starts", d.starts);
  j.field_bool("clean", d.clean);
  j.field_bool("running", d.alive);
  j.field_uint("updated_unix_ns", d.updated_unix_ns);
  j.end_object();
}

void pids_json(JsonWriter& j, const std::vector<std::uint32_t>& pids) {
  j.key("pids").begin_array();
  for (auto p : pids) j.uint(p);
  j.end_array();
}

// `key`: the value, or null when there is none.
template <class T>
void uint_or_null(JsonWriter& j, std::string_view key, const std::optional<T>& v) {
  j.key(key);
  if (v) {
    j.uint(*v);
  } else {
    j.null();
  }
}

void usage_json(JsonWriter& j, const TenantGpuView& u) {
  j.field_uint("used", u.used);
  j.field_uint("granted", u.granted);
  j.field_uint("nonpool", u.nonpool);
  j.field_uint("unhooked", u.unhooked);
  j.field_uint("limit", u.limit);
  uint_or_null(j, "guaranteed", u.guaranteed);
  j.key("share_percent").number(u.share_percent, 2);
  j.key("over_limit").boolean(u.over_limit);
}

// USED, marked when a lowered limit left the tenant above it.
std::string used_text(const TenantGpuView& u) { return sz(u.used) + (u.over_limit ? "*" : ""); }

std::string guaranteed_text(const TenantGpuView& u) { return u.guaranteed ? sz(*u.guaranteed) : "-"; }

}  // namespace

std::string render_top_text(const NodeView& v, const std::string& state, const std::string& stamp) {
  std::string out = heading(v, state, stamp);
  const std::vector<TopRow> rows = top_rows(v);
  if (v.gpus.empty()) out += "no GPUs in the state (has vlaked finished starting?)\n";
  bool over = false;
  for (const GpuView& g : v.gpus) {
    out += "\nGPU " + std::to_string(g.index) + "  " + g.uuid_short + "  total " + sz(g.total) + "  pool: granted " +
           sz(g.granted) + " / free " + sz(g.free) + "  non-pool " + sz(g.nonpool) + "  guaranteed " +
           sz(g.guaranteed) + " (borrowed " + sz(g.borrowed) + ")" +
           (g.unhooked != 0 ? "  outside vlake " + sz(g.unhooked) : std::string()) + "\n";
    Table t({{"NAMESPACE"},
             {"TENANT"},
             {"USED", Table::Align::right},
             {"OUTSIDE", Table::Align::right},
             {"LIMIT", Table::Align::right},
             {"GUARANTEED", Table::Align::right},
             {"SHARE", Table::Align::right},
             {"PROCS", Table::Align::right},
             {"PIDS"}});
    for (const TopRow& r : rows) {
      if (r.gpu != g.index) continue;
      over = over || r.usage.over_limit;
      t.add_row({r.namespace_name, r.tenant, used_text(r.usage), sz(r.usage.unhooked), sz(r.usage.limit),
                 guaranteed_text(r.usage), percent(r.usage.share_percent), std::to_string(r.pids.size()),
                 join_pids(r.pids)});
    }
    if (t.rows() == 0) {
      out += "  no tenant holds memory\n";
    } else {
      out += t.render("  ");
    }
  }
  if (over) out += "\n* above its limit (lowered by a reload): new grants are refused until usage drops\n";
  const std::vector<TenantView> idle = idle_tenants(v);
  if (!idle.empty()) {
    out += "\nconnected, no memory:";
    for (const TenantView& x : idle) out += " " + x.name + " (" + join_pids(x.pids) + ")";
    out += "\n";
  }
  return out;
}

std::string render_top_json(const NodeView& v, const std::string& state) {
  JsonWriter j;
  j.begin_object();
  j.field("state", state);
  daemon_json(j, v.daemon);
  const std::vector<TopRow> rows = top_rows(v);
  j.key("gpus").begin_array();
  for (const GpuView& g : v.gpus) {
    j.begin_object();
    j.field_uint("index", g.index);
    j.field("uuid", g.uuid);
    j.field_uint("total", g.total);
    j.field_uint("pool_bytes", g.pool_bytes);
    j.field_uint("granted", g.granted);
    j.field_uint("free", g.free);
    j.field_uint("nonpool", g.nonpool);
    j.field_uint("guaranteed", g.guaranteed);
    j.field_uint("borrowed", g.borrowed);
    j.key("tenants").begin_array();
    for (const TopRow& r : rows) {
      if (r.gpu != g.index) continue;
      j.begin_object();
      j.field_uint("id", r.tenant_id);
      j.field("name", r.tenant);
      j.field("namespace", r.namespace_name);
      usage_json(j, r.usage);
      j.field_uint("sessions", r.pids.size());
      pids_json(j, r.pids);
      j.end_object();
    }
    j.end_array();
    j.end_object();
  }
  j.end_array();
  j.key("idle_tenants").begin_array();
  for (const TenantView& x : idle_tenants(v)) {
    j.begin_object();
    j.field_uint("id", x.id);
    j.field("name", x.name);
    j.field_uint("sessions", x.sessions.size());
    pids_json(j, x.pids);
    j.end_object();
  }
  j.end_array();
  j.end_object();
  return j.str();
}

std::string render_tenants_text(const NodeView& v, const std::string& state) {
  std::string out = heading(v, state, "");
  if (v.tenants.empty()) return out + "no tenants\n";
  Table t({{"ID", Table::Align::right},
           {"TENANT"},
           {"GPU", Table::Align::right},
           {"USED", Table::Align::right},
           {"GRANTED", Table::Align::right},
           {"NON-POOL", Table::Align::right},
           {"OUTSIDE", Table::Align::right},
           {"LIMIT", Table::Align::right},
           {"GRANTS", Table::Align::right},
           {"SESSIONS (PIDS)"}});
  for (const TenantView& x : v.tenants) {
    const std::string sessions =
        x.sessions.empty() ? "-" : std::to_string(x.sessions.size()) + " (" + join_pids(x.pids) + ")";
    bool first = true;
    for (const TenantGpuView& u : x.gpus) {
      t.add_row({first ? std::to_string(x.id) : "", first ? x.name : "", std::to_string(u.gpu), used_text(u),
                 sz(u.granted), sz(u.nonpool), sz(u.unhooked), sz(u.limit), first ? std::to_string(x.grant_count) : "",
                 first ? sessions : ""});
      first = false;
    }
    if (x.gpus.empty()) {
      t.add_row({std::to_string(x.id), x.name, "-", "-", "-", "-", "-", "-", std::to_string(x.grant_count), sessions});
    }
  }
  return out + "\n" + t.render();
}

std::string render_tenants_json(const NodeView& v, const std::string& state) {
  JsonWriter j;
  j.begin_object();
  j.field("state", state);
  j.key("tenants").begin_array();
  for (const TenantView& x : v.tenants) {
    j.begin_object();
    j.field_uint("id", x.id);
    j.field("name", x.name);
    j.field("namespace", x.namespace_name);
    j.field("enforce", x.enforce);
    j.field_uint("unhooked_processes", x.unhooked_processes);
    j.field_uint("grant_count", x.grant_count);
    pids_json(j, x.pids);
    j.key("sessions").begin_array();
    for (const SessionView& s : x.sessions) {
      j.begin_object();
      j.field_uint("id", s.id);
      j.field_uint("pid", s.pid);
      j.field_uint("uid", s.uid);
      j.field_uint("gid", s.gid);
      j.field("state", s.state);
      j.field_uint("grants", s.grants);
      j.end_object();
    }
    j.end_array();
    j.key("gpus").begin_array();
    for (const TenantGpuView& u : x.gpus) {
      j.begin_object();
      j.field_uint("index", u.gpu);
      usage_json(j, u);
      j.end_object();
    }
    j.end_array();
    j.end_object();
  }
  j.end_array();
  j.end_object();
  return j.str();
}

std::string render_pool_text(const NodeView& v, const std::string& state) {
  const DaemonView& d = v.daemon;
  std::string out = "vlaked pid " + std::to_string(d.pid) + " (" + daemon_status(d) + "), starts " +
                    std::to_string(d.starts) + ", state " + state + " (layout " + std::to_string(d.layout_version) +
                    "), " + std::to_string(v.sessions) + " sessions, " + std::to_string(v.grants) + " grants\n\n";
  Table t({{"GPU", Table::Align::right},
           {"UUID"},
           {"TOTAL", Table::Align::right},
           {"POOL", Table::Align::right},
           {"GRANTED", Table::Align::right},
           {"FREE", Table::Align::right},
           {"FREE HANDLES", Table::Align::right},
           {"SERVABLE", Table::Align::right},
           {"ORPHANED", Table::Align::right},
           {"COUNTED", Table::Align::right},
           {"NON-POOL", Table::Align::right},
           {"GUARANTEED", Table::Align::right},
           {"BORROWED", Table::Align::right}});
  for (const GpuView& g : v.gpus) {
    t.add_row({std::to_string(g.index), g.uuid, sz(g.total), sz(g.pool_bytes), sz(g.granted), sz(g.free),
               std::to_string(g.free_handles), sz(g.largest_servable), sz(g.orphaned), sz(g.counted), sz(g.nonpool),
               sz(g.guaranteed), sz(g.borrowed)});
  }
  out += v.gpus.empty() ? "no GPUs in the state\n" : t.render();
  out += "\ncounters:\n";
  Table c({{"NAME"}, {"VALUE", Table::Align::right}});
  for (const auto& [name, value] : v.counters) c.add_row({name, std::to_string(value)});
  out += c.render("  ");
  return out;
}

std::string render_pool_json(const NodeView& v, const std::string& state) {
  JsonWriter j;
  j.begin_object();
  j.field("state", state);
  daemon_json(j, v.daemon);
  j.field_uint("sessions", v.sessions);
  j.field_uint("grants", v.grants);
  j.key("gpus").begin_array();
  for (const GpuView& g : v.gpus) {
    j.begin_object();
    j.field_uint("index", g.index);
    j.field("uuid", g.uuid);
    j.field_uint("total", g.total);
    j.field_uint("granularity", g.granularity);
    j.field_uint("pool_bytes", g.pool_bytes);
    j.field_uint("granted", g.granted);
    j.field_uint("free", g.free);
    j.field_uint("free_handles", g.free_handles);
    j.field_uint("largest_servable", g.largest_servable);
    j.field_uint("largest_servable_new_tenant", g.largest_servable_new_tenant);
    j.field_uint("orphaned", g.orphaned);
    j.field_uint("counted", g.counted);
    j.field_uint("nonpool", g.nonpool);
    j.field_uint("unhooked", g.unhooked);
    j.field_uint("nvml_used", g.nvml_used);
    j.field_uint("unlisted", g.unlisted);
    j.field_uint("guaranteed", g.guaranteed);
    j.field_uint("borrowed", g.borrowed);
    j.end_object();
  }
  j.end_array();
  j.key("counters").begin_object();
  for (const auto& [name, value] : v.counters) j.field_uint(name, value);
  j.end_object();
  j.end_object();
  return j.str();
}

namespace {
std::string utc(std::uint64_t unix_ns) {
  if (unix_ns == 0) return "-";
  const std::time_t t = static_cast<std::time_t>(unix_ns / 1'000'000'000ull);
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string hex_address(std::uint64_t a) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(a));
  return buf;
}
}  // namespace

std::string render_events_text(const NodeView& v, const std::string& state) {
  std::string out = heading(v, state, "");
  if (v.events.empty()) return out + "\nno guard alarms\n";
  Table t({{"SEQ", Table::Align::right},
           {"TIME (UTC)"},
           {"KIND"},
           {"TENANT"},
           {"GPU", Table::Align::right},
           {"PID", Table::Align::right},
           {"SIZE", Table::Align::right},
           {"FIRST BAD", Table::Align::right},
           {"ALLOCATED (UTC)"},
           {"WHERE"}});
  for (const GuardEventView& e : v.events) {
    std::string where = e.call;
    if (e.kind == "fault") {
      where += std::string(" guarded=") + (e.guarded ? "yes" : "no") + " maps_shared=" + (e.maps_shared ? "yes" : "no");
    }
    if (e.kind == "readonly_write" && !e.suspects.empty()) {
      where += " to " + hex_address(e.address) + " hits allocation " + hex_address(e.suspects[0].first) + "+" +
               sz(e.suspects[0].second) + " (shared from offset " + std::to_string(e.first_bad_offset) + ", grant " +
               std::to_string(e.grant_id) + ")";
    } else if ((e.kind == "fault" || e.kind == "readonly") && !e.suspects.empty()) {
      where += " (newest allocations:";
      for (const auto& [addr, bytes] : e.suspects) where += " " + hex_address(addr) + "+" + sz(bytes);
      where += ")";
    } else if (e.grant_id != 0) {
      where += " grant " + std::to_string(e.grant_id);
    }
    t.add_row({std::to_string(e.seq), utc(e.time_unix_ns), e.kind, e.tenant, e.gpu ? std::to_string(*e.gpu) : "?",
               std::to_string(e.pid), e.requested_bytes != 0 ? sz(e.requested_bytes) : "-",
               e.kind == "canary" ? std::to_string(e.first_bad_offset) : "-", utc(e.allocated_unix_ns), where});
  }
  return out + "\n" + t.render();
}

std::string render_events_json(const NodeView& v, const std::string& state) {
  JsonWriter j;
  j.begin_object();
  j.field("state", state);
  daemon_json(j, v.daemon);
  j.key("events").begin_array();
  for (const GuardEventView& e : v.events) {
    j.begin_object();
    j.field_uint("seq", e.seq);
    j.field_uint("time_unix_ns", e.time_unix_ns);
    j.field("kind", e.kind);
    j.field_uint("tenant_id", e.tenant_id);
    j.field("tenant", e.tenant);
    uint_or_null(j, "gpu", e.gpu);
    j.field_uint("pid", e.pid);
    j.field_uint("grant_id", e.grant_id);
    j.field_uint("address", e.address);
    j.field_uint("requested_bytes", e.requested_bytes);
    j.field_uint("first_bad_offset", e.first_bad_offset);
    j.field_uint("allocated_unix_ns", e.allocated_unix_ns);
    j.key("cuda_status").number(e.cuda_status, 0);
    j.field_uint("live_allocations", e.live_allocations);
    j.field("call", e.call);
    if (e.kind == "fault") {
      j.field_bool("guarded", e.guarded);
      j.field_bool("maps_shared", e.maps_shared);
    }
    j.key("suspects").begin_array();
    for (const auto& [addr, bytes] : e.suspects) {
      j.begin_object();
      j.field_uint("address", addr);
      j.field_uint("bytes", bytes);
      j.end_object();
    }
    j.end_array();
    j.end_object();
  }
  j.end_array();
  j.end_object();
  return j.str();
}

}  // namespace vlake::ctl
