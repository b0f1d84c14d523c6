// Where a decode step's time goes inside its CUDA graph: every kernel of the last replayed decode
// step with its start, duration and the idle time before it, as the GPU ran them (CUPTI activity
// records, so graph nodes, both streams and programmatic launches are seen as they overlap;
// ncu, by contrast, runs each kernel alone). Prints the step's wall time, the sum of kernel
// time, the time no kernel ran, the kernels per name, and the first layers' timeline.
//
// Build (repo root, after the CUDA build in build/), then run on the GPU machine:
//   g++ -std=c++20 -O2 -Iinclude -Isrc -I/usr/local/cuda/include lab/cuda/decode_trace.cpp \
//       -Lbuild -lmoex -L/usr/local/cuda/lib64 -lcupti -Wl,-rpath,$PWD/build -o build/decode_trace
//   build/decode_trace --model DIR [--batch 1] [--prompt 128] [--new-tokens 8] [--timeline 40]
//       [--experts-implementation grouped_mm] [--shared-experts-stream auto|on|off]
#include <cupti.h>
#include <cxxabi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "moex/model.hpp"

namespace {

struct Kernel {
  uint64_t start, end;
  uint32_t correlation, graph, stream;
  std::string name;
};
std::vector<Kernel> g_kernels;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *size = size_t(8) << 20;
  *buffer = static_cast<uint8_t*>(aligned_alloc(8, *size));
  *max_records = 0;
}

std::string short_name(const char* mangled) {
  if (!mangled) return "?";
  int status = 0;
  char* d = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string s = status == 0 && d ? d : mangled;
  std::free(d);
  // "void moex::ops::cuda::foo_kernel<...>(Params)" -> "foo_kernel<first template argument>"
  if (s.rfind("void ", 0) == 0) s = s.substr(5);
  for (size_t at; (at = s.find("(anonymous namespace)::")) != std::string::npos;) s.erase(at, 23);
  const size_t paren = s.find('(');
  std::string base = s.substr(0, paren);
  const size_t lt = base.find('<');
  std::string head = base.substr(0, lt), args = lt == std::string::npos ? "" : base.substr(lt);
  const size_t colon = head.rfind("::");
  if (colon != std::string::npos) head = head.substr(colon + 2);
  if (args.size() > 48) args = args.substr(0, 45) + "...";
  return head + args;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* r = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &r) == CUPTI_SUCCESS) {
    if (r->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && r->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(r);
    g_kernels.push_back({k->start, k->end, k->correlationId, k->graphId, k->streamId, short_name(k->name)});
  }
  std::free(buffer);
}

const char* arg(int argc, char** argv, const char* name, const char* dflt) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  return dflt;
}

}  // namespace

int main(int argc, char** argv) {
  const char* dir = arg(argc, argv, "--model", nullptr);
  if (!dir) {
    std::fprintf(stderr, "usage: decode_trace --model DIR [--batch B] [--prompt P] [--new-tokens N] [--timeline K]\n"
                         "       [--experts-implementation NAME] [--shared-experts-stream auto|on|off]\n");
    return 2;
  }
  const int64_t B = std::atoll(arg(argc, argv, "--batch", "1")), P = std::atoll(arg(argc, argv, "--prompt", "128"));
  const int64_t N = std::atoll(arg(argc, argv, "--new-tokens", "8"));
  const int timeline = std::atoi(arg(argc, argv, "--timeline", "40"));
  try {
    moex::LoadOptions o = moex::make_load_options("bfloat16", "cuda", arg(argc, argv, "--experts-implementation", ""));
    const std::string side = arg(argc, argv, "--shared-experts-stream", "auto");
    o.shared_experts_stream = side == "on"    ? moex::SharedExpertsStream::kOn
                              : side == "off" ? moex::SharedExpertsStream::kOff
                                              : moex::SharedExpertsStream::kAuto;
    auto lm = moex::from_pretrained(dir, o);
    std::mt19937_64 rng(1);
    std::vector<int64_t> ids(size_t(B * P));
    for (auto& v : ids) v = int64_t(rng() % uint64_t(lm->info().vocab_size));
    const moex::Tensor prompt = moex::Tensor::from_ints(ids, {B, P});
    moex::GenerationOptions g;
    g.max_new_tokens = N;
    g.eos_token_ids = std::vector<int64_t>{};
    lm->generate(prompt, g);  // warm: plans, graphs of attention, caches

    cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
    cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    lm->generate(prompt, g);
    cuptiActivityFlushAll(1);
    cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    if (!lm->last_generation_stats().graph)
      std::printf("note: decode ran without a graph: %s\n", lm->last_generation_stats().graph_note.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "decode_trace: %s\n", e.what());
    return 1;
  }

  // The decode stage as a whole: each replay's span (one cudaGraphLaunch = one correlation id),
  // the interval between consecutive replays' starts (what a token costs once the graph runs) and
  // the idle time between one replay's last kernel and the next one's first; and what ran before
  // the first replay (prefill, the direct first step, the capture's warm run).
  {
    std::map<uint32_t, std::pair<uint64_t, uint64_t>> span;  // correlation -> (first start, last end)
    uint64_t first = UINT64_MAX, last_end = 0;
    for (const Kernel& k : g_kernels) {
      first = std::min(first, k.start);
      last_end = std::max(last_end, k.end);
      if (!k.graph) continue;
      auto it = span.find(k.correlation);
      if (it == span.end()) span[k.correlation] = {k.start, k.end};
      else it->second = {std::min(it->second.first, k.start), std::max(it->second.second, k.end)};
    }
    std::vector<std::pair<uint64_t, uint64_t>> r;
    for (const auto& [c, se] : span) r.push_back(se);
    std::sort(r.begin(), r.end());
    std::vector<double> interval, gap;
    for (size_t i = 1; i < r.size(); ++i) {
      interval.push_back((r[i].first - r[i - 1].first) / 1e3);
      gap.push_back(r[i].first > r[i - 1].second ? (r[i].first - r[i - 1].second) / 1e3 : 0.0);
    }
    auto median = [](std::vector<double> v) {
      if (v.empty()) return 0.0;
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    if (!r.empty())
      std::printf("decode stage: %zu replays, median %.1f us from one replay's start to the next, median %.1f us idle "
                  "between replays; %.2f ms of kernels' span before the first replay, %.2f ms from it to the last "
                  "kernel, %.2f ms in all\n",
                  r.size(), median(interval), median(gap), (r.front().first - first) / 1e6,
                  (last_end - r.front().first) / 1e6, (last_end - first) / 1e6);
  }

  // The last replayed step: the graph kernels of the highest correlation id (one cudaGraphLaunch).
  uint32_t last = 0;
  for (const Kernel& k : g_kernels)
    if (k.graph) last = std::max(last, k.correlation);
  std::vector<Kernel> step;
  for (const Kernel& k : g_kernels)
    if (k.graph && k.correlation == last) step.push_back(k);
  if (step.empty()) {
    std::printf("no graph kernels recorded (%zu kernels in all)\n", g_kernels.size());
    return 1;
  }
  std::sort(step.begin(), step.end(), [](const Kernel& a, const Kernel& b) { return a.start < b.start; });
  const uint64_t t0 = step.front().start;
  uint64_t t1 = 0, busy = 0, cover_end = t0, kernel_sum = 0;
  for (const Kernel& k : step) {
    t1 = std::max(t1, k.end);
    kernel_sum += k.end - k.start;
    // Union of the kernels' intervals: time at least one kernel ran.
    if (k.end > cover_end) {
      busy += k.end - std::max(k.start, cover_end);
      cover_end = k.end;
    }
  }
  std::printf("decode step (graph replay): %zu kernels, %.1f us wall, %.1f us with a kernel running, "
              "%.1f us idle, %.1f us kernel time summed\n",
              step.size(), (t1 - t0) / 1e3, busy / 1e3, (t1 - t0 - busy) / 1e3, kernel_sum / 1e3);

  struct Sum {
    int n = 0;
    uint64_t t = 0;
  };
  std::map<std::string, Sum> by_name;
  for (const Kernel& k : step) {
    Sum& s = by_name[k.name];
    s.n++;
    s.t += k.end - k.start;
  }
  std::vector<std::pair<std::string, Sum>> rows(by_name.begin(), by_name.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.t > b.second.t; });
  std::printf("\n%10s %6s %9s  kernel\n", "total us", "count", "mean us");
  for (const auto& [name, s] : rows) std::printf("%10.1f %6d %9.2f  %s\n", s.t / 1e3, s.n, s.t / 1e3 / s.n, name.c_str());

  std::printf("\ntimeline of the first %d kernels (us from the step's first kernel; gap: since the previous "
              "kernel on any stream ended)\n%9s %8s %7s %7s  kernel\n", timeline, "start", "dur", "gap", "stream");
  uint64_t prev_end = t0;
  for (int i = 0; i < timeline && i < int(step.size()); ++i) {
    const Kernel& k = step[size_t(i)];
    const double gap = k.start > prev_end ? (k.start - prev_end) / 1e3 : -((prev_end - k.start) / 1e3);
    std::printf("%9.2f %8.2f %7.2f %7u  %s\n", (k.start - t0) / 1e3, (k.end - k.start) / 1e3, gap, k.stream,
                k.name.c_str());
    prev_end = std::max(prev_end, k.end);
  }
  std::fflush(stdout);
  std::_Exit(0);  // skip CUPTI's and the library's teardown
}
