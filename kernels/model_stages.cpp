// Workbench: where a model's forward spends its time, stage by stage, on any device. It runs decode
// steps (and one prefill segment) with a debug hook: every named intermediate is copied to the host,
// which synchronizes the device, so the time between two hook calls is the time of the ops between
// them. Launch overhead is included and graphs are off, so absolute numbers are pessimistic; the
// split between stages is what this is for.
//   model_stages MODEL.gguf [cuda:0|cpu] [decode steps] [prefill tokens]
#include <algorithm>
#include <chrono>
#include <span>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "model/model.h"

namespace {
double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// "blk.12.deltanet.beta" -> "deltanet.beta" with the layer's kind folded in by the caller.
std::string stage_of(std::string_view name) {
  std::string s(name);
  if (s.rfind("blk.", 0) == 0) {
    const size_t dot = s.find('.', 4);
    if (dot != std::string::npos) return s.substr(dot + 1);
  }
  return s;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: model_stages MODEL.gguf [cuda:0|cpu] [decode steps] [prefill tokens]\n");
    return 2;
  }
  ds::ModelOptions mo;
  const std::string dev = argc > 2 ? argv[2] : "cuda:0";
  if (dev.rfind("cuda", 0) == 0) mo.device = {ds::DeviceKind::kCuda, dev.size() > 5 ? std::atoi(dev.c_str() + 5) : 0};
  const int steps = argc > 3 ? std::atoi(argv[3]) : 16;
  const int prefill = argc > 4 ? std::atoi(argv[4]) : 1024;
  mo.n_ctx = prefill + steps + 64;
  mo.kv_dtype = mo.device.kind == ds::DeviceKind::kCuda ? ds::DType::F16 : ds::DType::F32;
  auto m = ds::Model::load(argv[1], mo);
  if (!m.is_ok()) {
    std::fprintf(stderr, "%s\n", m.status().to_string().c_str());
    return 1;
  }
  ds::Model& model = **m;
  std::map<std::string, double> total;  // stage -> seconds
  std::map<std::string, int> count;
  double last = 0;
  std::string prev = "start";
  model.set_debug_hook([&](std::string_view name, const ds::TensorView&) {
    const double t = now_s();
    const std::string key = prev + " -> " + stage_of(name);
    total[key] += t - last;
    count[key] += 1;
    last = t;
    prev = stage_of(name);
  });
  auto report = [&](const char* what, double wall, int units) {
    std::vector<std::pair<double, std::string>> rows;
    double sum = 0;
    for (const auto& [k, v] : total) {
      rows.push_back({v, k});
      sum += v;
    }
    std::sort(rows.rbegin(), rows.rend());
    std::printf("== %s: %.3f ms per %s (hook-synchronized), stages:\n", what, 1e3 * wall / units,
                units == 1 ? "segment" : "token");
    for (size_t i = 0; i < rows.size() && i < 24; ++i) {
      std::printf("  %6.1f%% %9.3f ms/unit %6d calls  %s\n", 100 * rows[i].first / sum, 1e3 * rows[i].first / units,
                  count[rows[i].second], rows[i].second.c_str());
    }
    total.clear();
    count.clear();
  };
  auto st = std::move(model.new_state()).value();
  std::vector<int32_t> toks(static_cast<size_t>(prefill));
  for (int i = 0; i < prefill; ++i) toks[static_cast<size_t>(i)] = (i * 7919 + 13) % static_cast<int>(model.config().n_vocab);
  // Warm-up segment (first-use allocations), not reported.
  if (!model.prefill(*st, std::span<const int32_t>(toks.data(), 8)).is_ok()) return 1;
  total.clear();
  count.clear();
  prev = "start";
  last = now_s();
  double t0 = now_s();
  if (!model.prefill(*st, std::span<const int32_t>(toks.data() + 8, toks.size() - 8)).is_ok()) return 1;
  report("prefill", now_s() - t0, 1);
  prev = "start";
  last = now_s();
  t0 = now_s();
  for (int i = 0; i < steps; ++i) {
    if (!model.decode(*st, toks[static_cast<size_t>(i)]).is_ok()) return 1;
  }
  report("decode", now_s() - t0, steps);
  return 0;
}
