#include "launch_bench.hpp"

#include <cudaTypedefs.h>

#include <algorithm>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>

#include "../../common/src/kernels_ptx.hpp"
#include "bench_support.hpp"

namespace vlake::bench {

namespace {

// The driver state of one worker: context, module, stream and the graphs captured so far.
class Launcher {
 public:
  explicit Launcher(const std::string& driver) : api_(driver) {
    api_.init_context(DeviceOrdinal{0});
    load_ = api_.entry<PFN_cuModuleLoadData_v2000>("cuModuleLoadData");
    get_function_ = api_.entry<PFN_cuModuleGetFunction_v2000>("cuModuleGetFunction");
    launch_ = api_.entry<PFN_cuLaunchKernel_v4000>("cuLaunchKernel");
    stream_create_ = api_.entry<PFN_cuStreamCreate_v2000>("cuStreamCreate");
    sync_ = api_.entry<PFN_cuStreamSynchronize_v2000>("cuStreamSynchronize");
    CUmodule module = nullptr;
    api_.check(load_(&module, detail::kKernelsPtx), "cuModuleLoadData");
    api_.check(get_function_(&fn_, module, "vlake_fill_u32"), "cuModuleGetFunction");
    api_.check(stream_create_(&stream_, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  }

  // N launches back to back; returns the seconds from the first launch to the end of the sync.
  double loop(long n) {
    for (long i = 0; i < std::min(n, 1000L); ++i) launch_once();  // untimed: the worker may have been idle
    api_.check(sync_(stream_), "cuStreamSynchronize");
    const std::uint64_t t0 = now_ns();
    for (long i = 0; i < n; ++i) launch_once();
    api_.check(sync_(stream_), "cuStreamSynchronize");
    return static_cast<double>(now_ns() - t0) / 1e9;
  }

  // ceil(n / g) replays of a graph of g kernel nodes; returns seconds and the nodes launched.
  std::pair<double, long> graph(long n, int g) {
    CUgraphExec exec = graph_of(g);
    auto graph_launch = api_.entry<PFN_cuGraphLaunch_v10000>("cuGraphLaunch");
    const long replays = (n + g - 1) / g;
    for (long i = 0; i < std::min(replays, 10L); ++i) api_.check(graph_launch(exec, stream_), "cuGraphLaunch");
    api_.check(sync_(stream_), "cuStreamSynchronize");
    const std::uint64_t t0 = now_ns();
    for (long i = 0; i < replays; ++i) api_.check(graph_launch(exec, stream_), "cuGraphLaunch");
    api_.check(sync_(stream_), "cuStreamSynchronize");
    return {static_cast<double>(now_ns() - t0) / 1e9, replays * g};
  }

 private:
  void launch_once() {
    CUdeviceptr p = 0;
    unsigned long long n = 0;
    unsigned v = 0;
    void* params[] = {&p, &n, &v};
    api_.check(launch_(fn_, 1, 1, 1, 32, 1, 1, 0, stream_, params, nullptr), "cuLaunchKernel");
  }

  CUgraphExec graph_of(int g) {
    if (auto it = graphs_.find(g); it != graphs_.end()) return it->second;
    auto begin = api_.entry<PFN_cuStreamBeginCapture_v10010>("cuStreamBeginCapture_v2");
    auto end = api_.entry<PFN_cuStreamEndCapture_v10000>("cuStreamEndCapture");
    auto instantiate = api_.entry<PFN_cuGraphInstantiateWithFlags_v11040>("cuGraphInstantiateWithFlags");
    api_.check(begin(stream_, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "cuStreamBeginCapture_v2");
    for (int i = 0; i < g; ++i) launch_once();
    CUgraph graph = nullptr;
    api_.check(end(stream_, &graph), "cuStreamEndCapture");
    CUgraphExec exec = nullptr;
    api_.check(instantiate(&exec, graph, 0), "cuGraphInstantiateWithFlags");
    graphs_[g] = exec;
    return exec;
  }

  CudaApi api_;
  PFN_cuModuleLoadData_v2000 load_ = nullptr;
  PFN_cuModuleGetFunction_v2000 get_function_ = nullptr;
  PFN_cuLaunchKernel_v4000 launch_ = nullptr;
  PFN_cuStreamCreate_v2000 stream_create_ = nullptr;
  PFN_cuStreamSynchronize_v2000 sync_ = nullptr;
  CUfunction fn_ = nullptr;
  CUstream stream_ = nullptr;
  std::map<int, CUgraphExec> graphs_;
};

std::string measure(Launcher& l, const std::string& op, long n, int g, const std::string& label) {
  double secs = 0;
  long launched = n;
  if (op == "loop") {
    secs = l.loop(n);
  } else if (op == "graph") {
    std::tie(secs, launched) = l.graph(n, g);
  } else {
    throw std::invalid_argument("unknown op '" + op + "' (loop, graph)");
  }
  Json j;
  j.begin_object().key("bench").value("launch").key("op").value(op).key("launches");
  j.value(static_cast<std::uint64_t>(launched))
      .key("graph_nodes")
      .value(static_cast<std::uint64_t>(op == "graph" ? g : 0));
  j.key("ns")
      .value(static_cast<std::uint64_t>(secs * 1e9))
      .key("value")
      .value(secs > 0 ? static_cast<double>(launched) / secs : 0.0);
  j.key("unit").value("launches/s").key("label").value(label).end_object();
  return j.str();
}

std::string error_json(const std::string& what) {
  Json j;
  j.begin_object().key("error").value(what).end_object();
  return j.str();
}

}  // namespace

const char* LaunchBench::usage() noexcept {
  return "usage: vlake_bench_launch [--op loop|graph] [--launches N] [--graph-nodes G] [--serve]\n"
         "                          [--driver PATH] [--label TEXT]\n"
         "  --serve: after {\"ready\":true}, answers stdin lines \"loop N\" / \"graph N G\" (\"quit\" ends)\n";
}

LaunchOptions LaunchBench::parse(const std::vector<std::string>& args) {
  LaunchOptions o;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") throw std::invalid_argument("help");
    if (a == "--serve") {
      o.serve = true;
      continue;
    }
    if (i + 1 >= args.size()) throw std::invalid_argument(a + " needs a value (see --help)");
    const std::string& v = args[++i];
    if (a == "--op") {
      if (v != "loop" && v != "graph") throw std::invalid_argument("--op takes loop or graph, got '" + v + "'");
      o.op = v;
    } else if (a == "--launches") {
      o.launches = parse_number(a, v, 1, 100000000);
    } else if (a == "--graph-nodes") {
      o.graph_nodes = static_cast<int>(parse_number(a, v, 1, 10000));
    } else if (a == "--driver") {
      o.driver = v;
    } else if (a == "--label") {
      o.label = v;
    } else {
      throw std::invalid_argument("unknown option '" + a + "' (see --help)");
    }
  }
  return o;
}

std::string LaunchBench::run() {
  Launcher l(o_.driver);
  if (!o_.serve) return measure(l, o_.op, o_.launches, o_.graph_nodes, o_.label);
  std::cout << "{\"ready\":true,\"bench\":\"launch\"}" << std::endl;
  std::string line;
  std::string last;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string op;
    in >> op;
    if (op.empty()) continue;
    if (op == "quit") break;
    try {
      std::string n_text;
      std::string g_text;
      in >> n_text >> g_text;
      const long n = parse_number("launches", n_text.empty() ? "20000" : n_text, 1, 100000000);
      const int g = static_cast<int>(parse_number("graph nodes", g_text.empty() ? "100" : g_text, 1, 10000));
      last = measure(l, op, n, g, o_.label);
    } catch (const std::exception& e) {
      last = error_json(e.what());
    }
    std::cout << last << std::endl;
  }
  return "{\"bench\":\"launch\",\"done\":true}";
}

int launch_main(int argc, char** argv) { return bench_main<LaunchBench>("vlake_bench_launch", argc, argv); }

}  // namespace vlake::bench
