// Kernel lab for the host attention (src/ops/cpu/attention*.cpp): one layer of Qwen1.5-MoE-shaped
// attention (16 heads x 128, no GQA, bf16 activations) through the library and through the
// per-row loop it replaced (copied below, sdpa arithmetic only), checked against each other,
// then timed: median of repeats, GFLOP/s of causal attention for prefill against the AVX-512 FMA
// peak, GB/s of KV cache read for decode against the DRAM read bandwidth. Build with
// lab/cpu/build.sh; threads from OMP_NUM_THREADS.
//
//   attention_cpu_lab            prefill 512, 2048; decode at past 512, 4096, batch 1 and 8
//   attention_cpu_lab loop T P B  only the library kernel, 50 calls (T tokens after P, batch B), for perf
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <random>
#include <string>
#include <cstdlib>
#include <vector>

#include "cpu/engine.hpp"
#include "ops/cpu/cpu_ops.hpp"

using namespace moex;
using namespace moex::ops;

namespace {

// LAB_CPUTIME=1 times with the process CPU clock (as experts_lab does): with OMP_NUM_THREADS=1 on
// the shared 2-core machine it measures the work of one core even while other jobs take time
// slices from it, which otherwise dominate the sub-millisecond decode steps.
double now_s() {
  static const bool cpu = std::getenv("LAB_CPUTIME") != nullptr;
  if (cpu) {
    timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The scalar loop per (query row, head) the library used before the tiled kernel (sdpa mode).
Tensor attention_rowloop(const Tensor& q, const LayerKV& kv, const Step& step, const AttentionSpec& spec,
                         DType act) {
  const int64_t kd = kv.k.size(2), vd = kv.v.size(2), cap = kv.capacity();
  const int64_t group = spec.heads / spec.kv_heads;
  const int64_t qd = spec.heads * spec.head_dim_k, od = spec.heads * spec.head_dim_v;
  Tensor out = Tensor::empty({step.rows(), od}, DType::kF32);
  const float* Q = q.data<float>();
  const float* K = kv.k.data<float>();
  const float* V = kv.v.data<float>();
  float* O = out.data<float>();
#pragma omp parallel
  {
    std::vector<float> scores, acc(static_cast<size_t>(spec.head_dim_v));
#pragma omp for collapse(2) schedule(static)
    for (int64_t r = 0; r < step.rows(); ++r) {
      for (int64_t h = 0; h < spec.heads; ++h) {
        const int64_t b = r / step.tokens, col = step.column(r);
        const float* keys = K + b * cap * kd + (h / group) * spec.head_dim_k;
        const float* vals = V + b * cap * vd + (h / group) * spec.head_dim_v;
        const int64_t first = step.pad_of(b), n = col + 1 - first;
        float* o = O + r * od + h * spec.head_dim_v;
        scores.resize(size_t(n));
        const float* qv = Q + r * qd + h * spec.head_dim_k;
        float mx = -INFINITY;
        for (int64_t j = 0; j < n; ++j) {
          scores[size_t(j)] = ops::cpu::dot(qv, keys + (first + j) * kd, spec.head_dim_k) * spec.scale;
          mx = std::max(mx, scores[size_t(j)]);
        }
        double denom = 0.0;
        for (int64_t j = 0; j < n; ++j) {
          scores[size_t(j)] = std::exp(scores[size_t(j)] - mx);
          denom += scores[size_t(j)];
        }
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int64_t j = 0; j < n; ++j) {
          const float w = ops::cpu::round_act(scores[size_t(j)], act);
          const float* vv = vals + (first + j) * vd;
          for (int64_t i = 0; i < spec.head_dim_v; ++i) acc[size_t(i)] += w * vv[i];
        }
        for (int64_t i = 0; i < spec.head_dim_v; ++i) o[i] = ops::cpu::round_act(acc[size_t(i)] / float(denom), act);
      }
    }
  }
  return out;
}

Tensor random_rows(int64_t rows, int64_t dim, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(size_t(rows * dim));
  for (auto& x : v) x = round_bf16(u(rng));
  return Tensor::from_floats(v, {rows, dim});
}

double rel_diff(const Tensor& a, const Tensor& b) {
  const auto x = a.to_float_vector(), y = b.to_float_vector();
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    num += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
    den += double(y[i]) * y[i];
  }
  return std::sqrt(num / den);
}

template <class F>
double time_median(F&& f, int reps, bool warm_up = true) {
  std::vector<double> t;
  if (warm_up) f();
  for (int i = 0; i < reps; ++i) {
    const double t0 = now_s();
    f();
    t.push_back(now_s() - t0);
  }
  return median(t);
}

void run_case(const char* name, int64_t batch, int64_t tokens, int64_t past, double peak_gflops, double dram_gbs) {
  constexpr int64_t kHeads = 16, kDim = 128;
  AttentionSpec spec;
  spec.heads = spec.kv_heads = kHeads;
  spec.head_dim_k = spec.head_dim_v = kDim;
  spec.scale = 1.0f / std::sqrt(float(kDim));
  std::mt19937 rng(42);
  LayerKV kv;
  kv.capacity_hint = past + tokens;
  if (past > 0) {
    const Step s{batch, past, 0};
    kv_append(kv, random_rows(s.rows(), kHeads * kDim, rng), random_rows(s.rows(), kHeads * kDim, rng), s);
  }
  const Step step{batch, tokens, past};
  kv_append(kv, random_rows(step.rows(), kHeads * kDim, rng), random_rows(step.rows(), kHeads * kDim, rng), step);
  const Tensor q = random_rows(step.rows(), kHeads * kDim, rng);
  const Tensor got = ops::cpu::attention(q, kv, step, spec, DType::kBF16);
  const Tensor old = attention_rowloop(q, kv, step, spec, DType::kBF16);
  // Visible (query, key) pairs: each does 2 * dk + 2 * dv flops per head.
  double pairs = 0;
  for (int64_t t = 0; t < tokens; ++t) pairs += double(past + t + 1);
  pairs *= double(batch);
  const double flops = pairs * kHeads * 4.0 * kDim;
  const double kv_bytes = double(batch) * double(past + tokens) * kHeads * 2.0 * kDim * 4.0;
  const bool prefill = tokens > 1;
  const int reps = prefill ? (tokens > 1000 ? 3 : 5) : 21;
  const double t_new = time_median([&] { ops::cpu::attention(q, kv, step, spec, DType::kBF16); }, reps);
  // The old loop's long prefill runs for tens of seconds on one core: once, cold.
  const bool long_old = tokens > 1000;
  const double t_old = time_median([&] { attention_rowloop(q, kv, step, spec, DType::kBF16); },
                                   long_old ? 1 : prefill ? 3 : reps, !long_old);
  std::printf("%-22s new %9.3f ms  old %9.3f ms  x%5.1f  ", name, 1e3 * t_new, 1e3 * t_old, t_old / t_new);
  if (prefill)
    std::printf("new %6.1f GFLOP/s (%4.1f%% of FMA peak)  old %6.1f GFLOP/s", flops / t_new * 1e-9,
                100.0 * flops / t_new * 1e-9 / peak_gflops, flops / t_old * 1e-9);
  else
    std::printf("new %6.1f GB/s (%4.1f%% of DRAM read)  old %6.1f GB/s", kv_bytes / t_new * 1e-9,
                100.0 * kv_bytes / t_new * 1e-9 / dram_gbs, kv_bytes / t_old * 1e-9);
  std::printf("  rel diff %.2e\n", rel_diff(got, old));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 5 && std::string(argv[1]) == "loop") {
    const int64_t T = std::atoll(argv[2]), P = std::atoll(argv[3]), B = std::atoll(argv[4]);
    AttentionSpec spec;
    spec.heads = spec.kv_heads = 16;
    spec.head_dim_k = spec.head_dim_v = 128;
    spec.scale = 0.088f;
    std::mt19937 rng(1);
    LayerKV kv;
    const Step step{B, T + P, 0}, q_step{B, T, P};
    kv_append(kv, random_rows(step.rows(), 2048, rng), random_rows(step.rows(), 2048, rng), step);
    const Tensor q = random_rows(q_step.rows(), 2048, rng);
    const double t = time_median([&] { ops::cpu::attention(q, kv, q_step, spec, DType::kBF16); }, 50);
    std::printf("median %.3f ms\n", 1e3 * t);
    return 0;
  }
  const double dram = moex::cpu::measure_dram_read_gbs();
  const double peak = moex::cpu::measure_kernel_peak_gflops(DType::kF32, moex::cpu::KernelPath::kAvx512);
  std::printf("threads %d  DRAM read %.1f GB/s  AVX-512 FMA peak %.1f GFLOP/s\n", omp_get_max_threads(), dram, peak);
  run_case("prefill 512", 1, 512, 0, peak, dram);
  run_case("prefill 2048", 1, 2048, 0, peak, dram);
  run_case("decode b1 past 512", 1, 1, 512, peak, dram);
  run_case("decode b8 past 512", 8, 1, 512, peak, dram);
  run_case("decode b1 past 4096", 1, 1, 4096, peak, dram);
  run_case("decode b8 past 4096", 8, 1, 4096, peak, dram);
  return 0;
}
