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
  j.field_uint("retained", u.retained);
  j.field_uint("ipc_held", u.ipc_held);
  j.field_uint("ipc_imported", u.ipc_imported);
  j.field_uint("nonpool", u.nonpool);
  j.field_uint("unhooked", u.unhooked);
  j.field_uint("limit", u.limit);
  uint_or_null(j, "guaranteed", u.guaranteed);
  j.key("share_percent").number(u.share_percent, 2);
  j.key("over_limit").boolean(u.over_limit);
  j.key("over_reason");
  if (u.over_limit) {
    j.string(u.over_reason);
  } else {
    j.null();
  }
}

// The marker after USED of a tenant above its limit, by why (the daemon's over_reason), and its
// footnote.
struct OverMark {
  const char* reason;
  const char* mark;
  const char* note;
};
constexpr OverMark kOverMarks[] = {
    {"limit_lowered", "*", "* above its limit, lowered by a reload: new grants are refused until usage drops"},
    {"contexts", "+",
     "+ above its limit through its processes' CUDA contexts and memory outside the pool: new grants are refused"},
    {"outside_vlake", "!",
     "! above its limit through memory of its processes without vlake (OUTSIDE): grants refused, per its enforce"},
    {"unknown", "?", "? above its limit (a reason this vlakectl does not know)"},
};
const OverMark* over_mark(const TenantGpuView& u) {
  if (!u.over_limit) return nullptr;
  for (const OverMark& m : kOverMarks) {
    if (u.over_reason == m.reason) return &m;
  }
  return &kOverMarks[3];
}

// USED, marked when the tenant is above its limit (the mark says why).
std::string used_text(const TenantGpuView& u) {
  const OverMark* m = over_mark(u);
  return sz(u.used) + (m != nullptr ? m->mark : "");
}

// The footnotes of the marks used in `rows` (one line each, in kOverMarks order).
std::string over_notes(const std::vector<const TenantGpuView*>& rows) {
  std::string out;
  for (const OverMark& m : kOverMarks) {
    for (const TenantGpuView* u : rows) {
      if (over_mark(*u) == &m) {
        out += std::string(m.note) + "\n";
        break;
      }
    }
  }
  return out;
}

std::string guaranteed_text(const TenantGpuView& u) { return u.guaranteed ? sz(*u.guaranteed) : "-"; }

void seconds_or_null(JsonWriter& j, std::string_view key, const std::optional<double>& v) {
  j.key(key);
  if (v) {
    j.number(*v, 3);
  } else {
    j.null();
  }
}

// Swapping shows only where it can happen (an overcommit namespace's process) or happened.
bool swapping_in_play(const NodeView& v) {
  for (const GpuView& g : v.gpus) {
    if (g.swapped != 0 || g.host != 0) return true;
  }
  for (const TenantView& t : v.tenants) {
    for (const SessionView& x : t.sessions) {
      if (x.overcommit || x.swap != "gpu") return true;
    }
  }
  return false;
}

// "host 12.5 GiB for 3m", "checkpointing 2.0 GiB", "gpu"; with the host tier (its grants on the
// host, the process on the GPU): "gpu, host tier 4.0 GiB", "gpu, moving".
std::string swap_text(const SessionView& x) {
  if (x.swap == "gpu") {
    std::string t = "gpu";
    if (x.host_bytes != 0) t += ", host tier " + sz(x.host_bytes);
    if (x.moving != 0) t += ", moving";
    return t;
  }
  std::string t = x.swap + " " + sz(x.swap_bytes);
  if (x.swap == "host" && x.swap_seconds) t += " for " + human_duration(x.swap_seconds);
  return t;
}

// "456 (team/b, swapping out), 789 (team/c, asked to give back)"; "any memory freed" when none.
std::string waits_for_text(const WaitView& w) {
  if (w.waits_for.empty()) return w.waiter.wait == "restore" ? "room on the GPU" : "any memory freed";
  std::string t;
  for (const WaitView::For& f : w.waits_for) {
    if (!t.empty()) t += ", ";
    t += f.pid != 0 ? std::to_string(f.pid) + " (" + f.tenant + ", " + f.why + ")"
                    : "session " + std::to_string(f.session) + " (gone)";
  }
  return t;
}

void session_json(JsonWriter& j, const SessionView& s) {
  j.field_uint("id", s.id);
  j.field_uint("pid", s.pid);
  j.field_uint("uid", s.uid);
  j.field_uint("gid", s.gid);
  j.field("state", s.state);
  j.field_uint("grants", s.grants);
  j.field_uint("last_active_unix_ns", s.last_active_unix_ns);
  seconds_or_null(j, "idle_seconds", s.idle_seconds);
  j.field_bool("reclaim", s.reclaim);
  j.field_bool("overcommit", s.overcommit);
  j.key("swap").begin_object();
  j.field("state", s.swap);
  j.field_uint("gpu", s.swap_gpu);
  j.field_uint("bytes", s.swap_bytes);
  j.field_uint("since_unix_ns", s.swap_since_unix_ns);
  j.field_uint("for_session", s.swap_for);
  j.field_uint("swap_outs", s.swap_outs);
  j.field_uint("swap_ins", s.swap_ins);
  j.end_object();
  j.field_uint("host_bytes", s.host_bytes);
  j.field_uint("moving", s.moving);
  j.key("wait");
  if (s.wait.empty()) {
    j.null();
  } else {
    j.begin_object();
    j.field("for", s.wait);
    j.field_uint("gpu", s.wait_gpu);
    j.field_uint("bytes", s.wait_bytes);
    j.field_uint("since_unix_ns", s.wait_since_unix_ns);
    j.field_uint("deadline_unix_ns", s.wait_deadline_unix_ns);
    j.key("waits_for").begin_array();
    for (std::uint64_t f : s.waits_for) j.uint(f);
    j.end_array();
    j.end_object();
  }
}

void wait_json(JsonWriter& j, const WaitView& w) {
  j.begin_object();
  j.field_uint("session", w.waiter.id);
  j.field_uint("pid", w.waiter.pid);
  j.field("tenant", w.tenant);
  j.key("priority").number(w.priority, 0);
  j.field("for", w.waiter.wait);
  j.field_uint("gpu", w.waiter.wait_gpu);
  j.field_uint("bytes", w.waiter.wait_bytes);
  j.field_uint("since_unix_ns", w.waiter.wait_since_unix_ns);
  j.field_uint("deadline_unix_ns", w.waiter.wait_deadline_unix_ns);
  seconds_or_null(j, "waited_seconds", w.waited_seconds);
  seconds_or_null(j, "left_seconds", w.left_seconds);
  j.key("waits_for").begin_array();
  for (const WaitView::For& f : w.waits_for) {
    j.begin_object();
    j.field_uint("session", f.session);
    j.field_uint("pid", f.pid);
    j.field("tenant", f.tenant);
    j.field("why", f.why);
    j.end_object();
  }
  j.end_array();
  j.end_object();
}

std::string waits_table(const NodeView& v, const std::string& indent) {
  Table t({{"PID", Table::Align::right},
           {"TENANT"},
           {"PRIO", Table::Align::right},
           {"FOR"},
           {"GPU", Table::Align::right},
           {"SIZE", Table::Align::right},
           {"WAITED", Table::Align::right},
           {"LEFT", Table::Align::right},
           {"WAITS FOR (PID)"}});
  for (const WaitView& w : v.waits) {
    t.add_row({std::to_string(w.waiter.pid), w.tenant, std::to_string(w.priority), w.waiter.wait,
               std::to_string(w.waiter.wait_gpu), sz(w.waiter.wait_bytes), human_duration(w.waited_seconds),
               human_duration(w.left_seconds), waits_for_text(w)});
  }
  return t.render(indent);
}

}  // namespace

std::string render_top_text(const NodeView& v, const std::string& state, const std::string& stamp) {
  std::string out = heading(v, state, stamp);
  if (v.config.rejected) {
    // The limits below are the previous file's: say so before anyone reads them.
    out += "QUOTA FILE REJECTED: " + v.config.last_error + "\n  the limits shown are the previous configuration's (" +
           "generation " + std::to_string(v.config.generation) + "); check the file with: vlakectl quota check " +
           (v.config.path.empty() ? std::string("FILE") : v.config.path) + "\n";
  }
  const std::vector<TopRow> rows = top_rows(v);
  if (v.gpus.empty()) out += "no GPUs in the state (has vlaked finished starting?)\n";
  std::vector<const TenantGpuView*> marked;
  const bool swapping = swapping_in_play(v);
  for (const GpuView& g : v.gpus) {
    out += "\nGPU " + std::to_string(g.index) + "  " + g.uuid_short + "  total " + sz(g.total) + "  pool: granted " +
           sz(g.granted) + " / free " + sz(g.free) + "  non-pool " + sz(g.nonpool) + "  guaranteed " +
           sz(g.guaranteed) + " (borrowed " + sz(g.borrowed) + ")" +
           (g.unhooked != 0 ? "  outside vlake " + sz(g.unhooked) : std::string()) +
           (g.swapped != 0 ? "  on host " + sz(g.swapped) : std::string()) +
           (g.host != 0 ? "  host tier " + sz(g.host) : std::string()) +
           (g.retained != 0 ? "  retained " + sz(g.retained) : std::string()) + "\n";
    std::vector<Table::Column> cols = {{"NAMESPACE"},
                                       {"TENANT"},
                                       {"USED", Table::Align::right},
                                       {"RETAINED", Table::Align::right},
                                       {"OUTSIDE", Table::Align::right},
                                       {"LIMIT", Table::Align::right},
                                       {"GUARANTEED", Table::Align::right},
                                       {"SHARE", Table::Align::right},
                                       {"IDLE", Table::Align::right}};
    if (swapping) cols.push_back({"ON HOST", Table::Align::right});
    cols.push_back({"PROCS", Table::Align::right});
    cols.push_back({"PIDS"});
    Table t(std::move(cols));
    for (const TopRow& r : rows) {
      if (r.gpu != g.index) continue;
      if (r.usage.over_limit) marked.push_back(&r.usage);
      std::vector<std::string> cells = {
          r.namespace_name,
          r.tenant,
          used_text(r.usage),
          sz(r.usage.retained) + (r.usage.ipc_held != 0 ? " (ipc " + sz(r.usage.ipc_held) + ")" : ""),
          sz(r.usage.unhooked),
          sz(r.usage.limit),
          guaranteed_text(r.usage),
          percent(r.usage.share_percent),
          human_duration(r.idle_seconds)};
      if (swapping) cells.push_back(sz(r.usage.swapped + r.usage.host));  // checkpointed + host tier
      cells.push_back(std::to_string(r.pids.size()));
      cells.push_back(join_pids(r.pids));
      t.add_row(std::move(cells));
    }
    // vlaked's own process on this GPU, never a tenant's: its CUDA context (NVML's figure for it
    // beyond its pool; the pool is the line above).
    if (g.daemon_nvml != 0) {
      std::vector<std::string> cells = {
          "-",
          "vlaked",
          sz(g.daemon_context),
          "-",
          "-",
          "-",
          "-",
          percent(g.total == 0 ? 0 : 100.0 * static_cast<double>(g.daemon_context) / static_cast<double>(g.total)),
          "-"};
      if (swapping) cells.push_back("-");
      cells.push_back("1");
      cells.push_back(std::to_string(v.daemon.pid));
      t.add_row(std::move(cells));
    }
    if (t.rows() == 0) {
      out += "  no tenant holds memory\n";
    } else {
      out += t.render("  ");
    }
  }
  if (!marked.empty()) out += "\n" + over_notes(marked);
  const std::vector<TenantView> idle = idle_tenants(v);
  if (!idle.empty()) {
    out += "\nconnected, no memory:";
    for (const TenantView& x : idle) out += " " + x.name + " (" + join_pids(x.pids) + ")";
    out += "\n";
  }
  if (!v.waits.empty()) out += "\nwaiting (vlakectl waits):\n" + waits_table(v, "  ");
  return out;
}

std::string render_top_json(const NodeView& v, const std::string& state) {
  JsonWriter j;
  j.begin_object();
  j.field("state", state);
  daemon_json(j, v.daemon);
  j.key("config").begin_object();
  j.field("path", v.config.path);
  j.field_bool("from_file", v.config.from_file);
  j.field_uint("generation", v.config.generation);
  j.field_bool("rejected", v.config.rejected);
  j.field("last_error", v.config.last_error);
  j.field_uint("error_unix_ns", v.config.error_unix_ns);
  j.end_object();
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
    j.field_uint("swapped", g.swapped);
    j.field_uint("host", g.host);
    j.field_uint("retained", g.retained);
    // vlaked's own process on this GPU (not a tenant): NVML's figure, and its context beyond the pool.
    j.key("daemon").begin_object();
    j.field_uint("pid", v.daemon.pid);
    j.field_uint("nvml", g.daemon_nvml);
    j.field_uint("context", g.daemon_context);
    j.end_object();
    j.key("tenants").begin_array();
    for (const TopRow& r : rows) {
      if (r.gpu != g.index) continue;
      j.begin_object();
      j.field_uint("id", r.tenant_id);
      j.field("name", r.tenant);
      j.field("namespace", r.namespace_name);
      usage_json(j, r.usage);
      j.field_uint("swapped", r.usage.swapped);
      j.field_uint("host", r.usage.host);
      seconds_or_null(j, "idle_seconds", r.idle_seconds);
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
  j.key("waits").begin_array();
  for (const WaitView& w : v.waits) wait_json(j, w);
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
           {"RETAINED", Table::Align::right},
           {"IPC HELD", Table::Align::right},
           {"IMPORTED", Table::Align::right},
           {"NON-POOL", Table::Align::right},
           {"OUTSIDE", Table::Align::right},
           {"LIMIT", Table::Align::right},
           {"GRANTS", Table::Align::right},
           {"REFUSED", Table::Align::right},
           {"IDLE", Table::Align::right},
           {"SESSIONS (PIDS)"}});
  std::vector<const TenantGpuView*> marked;
  for (const TenantView& x : v.tenants) {
    const std::string sessions =
        x.sessions.empty() ? "-" : std::to_string(x.sessions.size()) + " (" + join_pids(x.pids) + ")";
    std::uint64_t refused = 0;
    for (const auto& [why, n] : x.denials) refused += n;
    bool first = true;
    for (const TenantGpuView& u : x.gpus) {
      if (u.over_limit) marked.push_back(&u);
      t.add_row({first ? std::to_string(x.id) : "", first ? x.name : "", std::to_string(u.gpu), used_text(u),
                 sz(u.granted), sz(u.retained), sz(u.ipc_held), sz(u.ipc_imported), sz(u.nonpool), sz(u.unhooked),
                 sz(u.limit), first ? std::to_string(x.grant_count) : "", first ? std::to_string(refused) : "",
                 first ? human_duration(x.idle_seconds) : "", first ? sessions : ""});
      first = false;
    }
    if (x.gpus.empty()) {
      t.add_row({std::to_string(x.id), x.name, "-", "-", "-", "-", "-", "-", "-", "-", "-",
                 std::to_string(x.grant_count), std::to_string(refused), human_duration(x.idle_seconds), sessions});
    }
  }
  out += "\n" + t.render();
  // vlaked's own process, not a tenant: its CUDA context on each GPU where NVML lists it.
  for (const GpuView& g : v.gpus) {
    if (g.daemon_nvml != 0) {
      out += "vlaked (pid " + std::to_string(v.daemon.pid) + ", not a tenant) on GPU " + std::to_string(g.index) +
             ": context " + sz(g.daemon_context) + ", pool " + sz(g.pool_bytes) + "\n";
    }
  }
  if (!marked.empty()) out += "\n" + over_notes(marked);
  return out;
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
    j.key("priority").number(x.priority, 0);
    seconds_or_null(j, "idle_seconds", x.idle_seconds);
    j.key("denials").begin_object();
    for (const auto& [why, n] : x.denials) j.field_uint(why, n);
    j.end_object();
    pids_json(j, x.pids);
    j.key("sessions").begin_array();
    for (const SessionView& s : x.sessions) {
      j.begin_object();
      session_json(j, s);
      j.end_object();
    }
    j.end_array();
    j.key("gpus").begin_array();
    for (const TenantGpuView& u : x.gpus) {
      j.begin_object();
      j.field_uint("index", u.gpu);
      usage_json(j, u);
      j.field_uint("swapped", u.swapped);
      j.end_object();
    }
    j.end_array();
    j.end_object();
  }
  j.end_array();
  // vlaked's own process (not a tenant): per GPU, NVML's figure and its context beyond the pool.
  j.key("daemon").begin_object();
  j.field_uint("pid", v.daemon.pid);
  j.key("gpus").begin_array();
  for (const GpuView& g : v.gpus) {
    j.begin_object();
    j.field_uint("index", g.index);
    j.field_uint("nvml", g.daemon_nvml);
    j.field_uint("context", g.daemon_context);
    j.field_uint("pool_bytes", g.pool_bytes);
    j.end_object();
  }
  j.end_array();
  j.end_object();
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
           {"BORROWED", Table::Align::right},
           {"ON HOST", Table::Align::right}});
  for (const GpuView& g : v.gpus) {
    t.add_row({std::to_string(g.index), g.uuid, sz(g.total), sz(g.pool_bytes), sz(g.granted), sz(g.free),
               std::to_string(g.free_handles), sz(g.largest_servable), sz(g.orphaned), sz(g.counted), sz(g.nonpool),
               sz(g.guaranteed), sz(g.borrowed), sz(g.swapped)});
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
    j.field_uint("swapped", g.swapped);
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

namespace {
// "" or " (N pushed out: tenant n, ...)": what a ring lost, by tenant (its own flood, or a
// tenant's holding no fewer entries).
std::string evicted_note(const NodeView& v, std::uint64_t total, std::uint64_t TenantView::*of) {
  if (total == 0) return "";
  std::string out = "; " + std::to_string(total) + " pushed out";
  std::string by;
  for (const TenantView& t : v.tenants) {
    if (t.*of != 0) by += (by.empty() ? ": " : ", ") + t.name + " " + std::to_string(t.*of);
  }
  return out + by;
}

std::string refusals_text(const NodeView& v) {
  if (v.refusals.empty()) return "\nno refusals\n";
  Table t({{"SEQ", Table::Align::right},
           {"TIME (UTC)"},
           {"REASON"},
           {"TENANT"},
           {"GPU", Table::Align::right},
           {"PID", Table::Align::right},
           {"ASKED", Table::Align::right},
           {"USED", Table::Align::right},
           {"LIMIT", Table::Align::right},
           {"WAITED", Table::Align::right}});
  for (const RefusalView& r : v.refusals) {
    const bool bytes = r.reason != "limit_reached";  // caps count sessions or grants
    t.add_row({std::to_string(r.seq), utc(r.time_unix_ns), r.reason, r.tenant.empty() ? "-" : r.tenant,
               r.gpu ? std::to_string(*r.gpu) : "-", std::to_string(r.pid), r.bytes != 0 ? sz(r.bytes) : "-",
               bytes ? sz(r.used) : std::to_string(r.used),
               r.limit == 0 ? "-"
               : bytes      ? sz(r.limit)
                            : std::to_string(r.limit),
               r.waited_ms != 0 ? human_duration(static_cast<double>(r.waited_ms) / 1e3) : "-"});
  }
  return "\nrefusals (" + std::to_string(state::kRefusalEvents) + " kept, per tenant" +
         evicted_note(v, v.refusals_evicted, &TenantView::refusals_evicted) + "):\n" + t.render("  ");
}
}  // namespace

std::string render_events_text(const NodeView& v, const std::string& state) {
  std::string out = heading(v, state, "");
  if (v.events.empty()) return out + "\nno guard alarms\n" + refusals_text(v);
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
  return out + "\nguard alarms (" + std::to_string(state::kGuardEvents) + " kept, per tenant" +
         evicted_note(v, v.guard_events_evicted, &TenantView::guard_events_evicted) + "):\n" + t.render("  ") +
         refusals_text(v);
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
  j.field_uint("guard_events_evicted", v.guard_events_evicted);
  j.field_uint("refusals_evicted", v.refusals_evicted);
  j.key("evicted").begin_array();
  for (const TenantView& t : v.tenants) {
    if (t.guard_events_evicted == 0 && t.refusals_evicted == 0) continue;
    j.begin_object();
    j.field_uint("tenant_id", t.id);
    j.field("tenant", t.name);
    j.field_uint("guard_events", t.guard_events_evicted);
    j.field_uint("refusals", t.refusals_evicted);
    j.end_object();
  }
  j.end_array();
  j.key("refusals").begin_array();
  for (const RefusalView& r : v.refusals) {
    j.begin_object();
    j.field_uint("seq", r.seq);
    j.field_uint("time_unix_ns", r.time_unix_ns);
    j.field("reason", r.reason);
    j.field_uint("tenant_id", r.tenant_id);
    j.field("tenant", r.tenant);
    uint_or_null(j, "gpu", r.gpu);
    j.field_uint("pid", r.pid);
    j.field_uint("bytes", r.bytes);
    j.field_uint("used", r.used);
    j.field_uint("limit", r.limit);
    j.field_uint("waited_ms", r.waited_ms);
    j.end_object();
  }
  j.end_array();
  j.end_object();
  return j.str();
}

std::string render_processes_text(const NodeView& v, const std::string& state) {
  std::string out = heading(v, state, "");
  const auto rows = all_sessions(v);
  if (rows.empty()) return out + "\nno processes\n";
  const bool swapping = swapping_in_play(v);
  std::vector<Table::Column> cols = {
      {"PID", Table::Align::right},    {"SESSION", Table::Align::right}, {"TENANT"}, {"STATE"},
      {"GRANTS", Table::Align::right}, {"IDLE", Table::Align::right},    {"RECLAIM"}};
  if (swapping) cols.push_back({"WHERE"});
  cols.push_back({"WAITING"});
  Table t(std::move(cols));
  for (const auto& [tn, x] : rows) {
    std::string waiting = "-";
    if (!x->wait.empty()) {
      waiting = x->wait + " " + sz(x->wait_bytes) + " on GPU " + std::to_string(x->wait_gpu);
      if (x->wait_seconds) waiting += " for " + human_duration(x->wait_seconds);
    }
    std::vector<std::string> cells = {
        std::to_string(x->pid),          std::to_string(x->id),    tn->name, x->state, std::to_string(x->grants),
        human_duration(x->idle_seconds), x->reclaim ? "yes" : "no"};
    if (swapping) cells.push_back(swap_text(*x));
    cells.push_back(waiting);
    t.add_row(std::move(cells));
  }
  return out + "\n" + t.render();
}

std::string render_processes_json(const NodeView& v, const std::string& state) {
  JsonWriter j;
  j.begin_object();
  j.field("state", state);
  daemon_json(j, v.daemon);
  j.field_uint("now_unix_ns", v.now_unix_ns);
  j.key("processes").begin_array();
  for (const auto& [tn, x] : all_sessions(v)) {
    j.begin_object();
    j.field_uint("tenant_id", tn->id);
    j.field("tenant", tn->name);
    j.field("namespace", tn->namespace_name);
    session_json(j, *x);
    j.end_object();
  }
  j.end_array();
  j.end_object();
  return j.str();
}

std::string render_waits_text(const NodeView& v, const std::string& state) {
  std::string out = heading(v, state, "");
  if (v.waits.empty()) return out + "\nnobody waits for memory\n";
  return out + "\n" + waits_table(v, "");
}

std::string render_waits_json(const NodeView& v, const std::string& state) {
  JsonWriter j;
  j.begin_object();
  j.field("state", state);
  daemon_json(j, v.daemon);
  j.field_uint("now_unix_ns", v.now_unix_ns);
  j.key("waits").begin_array();
  for (const WaitView& w : v.waits) wait_json(j, w);
  j.end_array();
  j.end_object();
  return j.str();
}

}  // namespace vlake::ctl
