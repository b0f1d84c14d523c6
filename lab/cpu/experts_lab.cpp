// Kernel lab for the CPU experts engine (llm.c dev/cuda style): standalone measurements that
// decide what goes into src/cpu. Not part of the library build; build with lab/cpu/build.sh.
//
//   experts_lab ceilings                 DRAM read GB/s and the register-resident peak per family
//   experts_lab kernels [K]              one expert block GEMM per path and row count (GFLOP/s, GB/s)
//   experts_lab experts [dtype] [paths]  the Qwen1.5-MoE experts layer through the engine, per path
//                                        and T, median of repeats, weights flushed from cache
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <string>
#include <vector>

#include "cpu/engine.hpp"
#include "moex/experts.hpp"

using namespace moex;
using namespace moex::cpu;

namespace {

// LAB_CPUTIME=1 times with the process CPU clock instead of the wall clock: on the shared 2-core
// machine a single-threaded run then measures the work of one core even while other jobs take
// time slices from it (cache pollution by them still counts).
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

// Evicts the weights from every cache level by streaming a buffer larger than the L3.
void flush_caches() {
  static std::vector<uint64_t> junk(size_t(768) << 17);  // 768 MiB
  uint64_t s = 0;
#pragma omp parallel for reduction(+ : s)
  for (size_t i = 0; i < junk.size(); i += 8) s += junk[i]++;
  static volatile uint64_t sink;
  sink = s;
}

void fill_random(Tensor& t, float scale, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  const int64_t n = t.numel();
  if (t.dtype() == DType::kBF16) {
    auto* p = t.data<uint16_t>();
    for (int64_t i = 0; i < n; ++i) p[i] = float_to_bf16(u(rng));
  } else {
    auto* p = t.data<float>();
    for (int64_t i = 0; i < n; ++i) p[i] = u(rng);
  }
}

int cmd_ceilings() {
  std::printf("threads %d\n", omp_get_max_threads());
  for (int i = 0; i < 3; ++i) std::printf("dram_read_gbs %.2f\n", measure_dram_read_gbs());
  struct L { const char* name; double (*fn)(int64_t); int64_t iters; KernelPath need; };
  const L loops[] = {{"amx_bf16", kernels::peak_loop_amx, 2'000'000, KernelPath::kAmx},
                     {"avx512bf16", kernels::peak_loop_avx512bf16, 4'000'000, KernelPath::kAvx512Bf16},
                     {"avx512_f32", kernels::peak_loop_avx512_f32, 4'000'000, KernelPath::kAvx512},
                     {"avx2_f32", kernels::peak_loop_avx2_f32, 4'000'000, KernelPath::kAvx2}};
  for (const L& l : loops) {
    if (!kernel_path_supported(l.need)) continue;
    std::vector<double> ts;
    double flops = 0;
    for (int rep = 0; rep < 5; ++rep) {
      double t0 = now_s();
#pragma omp parallel
      {
        double f = l.fn(l.iters);
#pragma omp master
        flops = f * omp_get_num_threads();
      }
      ts.push_back(now_s() - t0);
    }
    std::printf("peak %-11s %8.1f GFLOP/s (median of 5)\n", l.name, flops / median(ts) / 1e9);
  }
  return 0;
}

// One expert's gate_up-sized matrix [N=2816, K] packed per path; m rows; single thread, so the
// numbers are per core. Hot: the panel set stays in L2/L3 between repeats.
int cmd_kernels(int64_t K) {
  const int64_t N = 2816;
  for (DType dt : {DType::kBF16, DType::kF32}) {
    ExpertsSpec s;
    s.num_experts = 1;
    s.hidden = K;
    s.intermediate = N / 2;
    ExpertsWeights w;
    w.gate_up = Tensor::empty(s.gate_up_shape(), dt);
    w.down = Tensor::empty(s.down_shape(), dt);
    fill_random(w.gate_up, 0.02f, 1);
    fill_random(w.down, 0.02f, 2);
    for (KernelPath path : kAllKernelPaths) {
      if (!kernel_path_supported(path)) continue;
      if (dt == DType::kF32 && (path == KernelPath::kAmx || path == KernelPath::kAvx512Bf16)) continue;
      auto p = prepare_cpu_experts(s, w, path);
      const size_t elem = dt == DType::kBF16 ? 2 : 4;
      std::vector<char> a(size_t(kernels::kMaxRows + kernels::kRowSlack) * size_t(p->gate_up.k_pad) * elem, 0);
      std::vector<float> c(kernels::kMaxRows * kernels::kBlockCols);
      std::vector<char> abig(size_t(512 + kernels::kRowSlack) * size_t(p->gate_up.k_pad) * elem, 0);
      for (int m : {1, 2, 4, 8, 16, 32, 64, 68, 256}) {
        std::vector<kernels::GemmFn> fns = {m <= p->kernels.small_max_rows ? p->kernels.small : p->kernels.large};
        if (path == KernelPath::kAmx && m < 8) fns.push_back(kernels::gemm_bf16_amx);
        for (kernels::GemmFn fn : fns) {
        const int64_t blocks = p->gate_up.n_pad / kernels::kBlockCols;
        auto pass = [&] {
          for (int64_t b = 0; b < blocks; ++b)
          for (int r0 = 0; r0 < m; r0 += kernels::kMaxRows) {
            kernels::GemmArgs g;
            g.a = abig.data() + size_t(r0) * size_t(p->gate_up.k_pad) * elem;
            g.lda = p->gate_up.k_pad;
            g.b = p->gate_up.block(0, b);
            g.panel_stride = p->gate_up.panel_stride;
            g.k = p->gate_up.k_pad;
            g.m = std::min(m - r0, kernels::kMaxRows);
            g.c = c.data();
            g.ldc = kernels::kBlockCols;
            fn(g);
          }
        };
        pass();
        std::vector<double> ts;
        for (int rep = 0; rep < 7; ++rep) {
          double t0 = now_s();
          pass();
          ts.push_back(now_s() - t0);
        }
        const double t = median(ts);
        std::printf("%-5s %-11s%s m=%3d  %8.1f GFLOP/s  %7.1f GB/s (weights, cache-hot)\n",
                    std::string(dtype_name(dt)).c_str(), std::string(p->kernels.name).c_str(),
                    fn == kernels::gemm_bf16_amx ? "(amx)" : "", m,
                    2.0 * m * N * K / t / 1e9, double(p->gate_up.bytes()) / t / 1e9);
        }
      }
    }
  }
  return 0;
}

int cmd_experts(DType dt, const std::vector<KernelPath>& paths, const std::vector<int64_t>& Ts) {
  ExpertsSpec s;  // Qwen1.5-MoE-A2.7B experts
  s.num_experts = 60;
  s.hidden = 2048;
  s.intermediate = 1408;
  const int64_t k = 4;
  ExpertsWeights w;
  w.gate_up = Tensor::empty(s.gate_up_shape(), dt);
  w.down = Tensor::empty(s.down_shape(), dt);
  fill_random(w.gate_up, 1.f / std::sqrt(2048.f), 1);
  fill_random(w.down, 1.f / std::sqrt(1408.f), 2);
  const double expert_bytes = double(w.gate_up.nbytes() + w.down.nbytes()) / 60;
  const double dram = measure_dram_read_gbs();
  std::printf("dram_read_gbs %.2f\n", dram);
  for (KernelPath path : paths) {
    if (!kernel_path_supported(path)) continue;
    auto p = prepare_cpu_experts(s, w, path);
    for (int64_t T : Ts) {
      std::mt19937_64 rng(uint64_t(T) * 7 + 3);
      std::vector<double> ts, gbs;
      Tensor hidden = Tensor::empty({T, s.hidden}, dt);
      fill_random(hidden, 1.f, 5);
      Tensor out = Tensor::empty({T, s.hidden}, dt);
      const int reps = T <= 64 ? 9 : (T <= 1024 ? 5 : 3);
      for (int rep = 0; rep < reps; ++rep) {
        std::vector<int64_t> ids(size_t(T * k));
        std::vector<float> rw(size_t(T * k), 0.25f);
        std::vector<bool> hit(60, false);
        for (int64_t t = 0; t < T; ++t) {
          std::vector<int64_t> perm(60);
          for (int e = 0; e < 60; ++e) perm[size_t(e)] = e;
          for (int j = 0; j < k; ++j) {
            std::swap(perm[size_t(j)], perm[size_t(j) + rng() % size_t(60 - j)]);
            ids[size_t(t * k + j)] = perm[size_t(j)];
            hit[size_t(perm[size_t(j)])] = true;
          }
        }
        const int n_hit = int(std::count(hit.begin(), hit.end(), true));
        ExpertsProblem pr;
        pr.spec = &s;
        pr.weights = &w;
        pr.prepared = p.get();
        pr.hidden = hidden;
        pr.top_k_index = Tensor::from_ints(ids, {T, k});
        pr.top_k_weights = Tensor::from_floats(rw, {T, k});
        flush_caches();
        double t0 = now_s();
        run_cpu_experts(*p, pr, out);
        double t = now_s() - t0;
        ts.push_back(t);
        gbs.push_back(n_hit * expert_bytes / t / 1e9);
      }
      const double t = median(ts);
      const double flops = 2.0 * T * k * 3 * s.hidden * s.intermediate;
      std::printf("%-8s %-15s T=%5ld  %9.3f ms  %8.1f GFLOP/s  %6.1f GB/s of hit experts (%.0f%% of DRAM)\n",
                  std::string(dtype_name(dt)).c_str(), std::string(p->kernels.name).c_str(), long(T),
                  t * 1e3, flops / t / 1e9, median(gbs), 100 * median(gbs) / dram);
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string cmd = argc > 1 ? argv[1] : "ceilings";
  if (cmd == "ceilings") return cmd_ceilings();
  if (cmd == "kernels") return cmd_kernels(argc > 2 ? std::stoll(argv[2]) : 2048);
  if (cmd == "experts") {
    DType dt = argc > 2 ? parse_dtype(argv[2]) : DType::kBF16;
    std::vector<KernelPath> paths;
    if (argc > 3) {
      std::string list = argv[3];
      for (size_t pos = 0; pos <= list.size();) {
        size_t comma = list.find(',', pos);
        if (comma == std::string::npos) comma = list.size();
        paths.push_back(parse_kernel_path(list.substr(pos, comma - pos)));
        pos = comma + 1;
      }
    } else {
      paths = {best_kernel_path()};
    }
    std::vector<int64_t> Ts = {1, 4, 16, 64, 256, 1024, 4096};
    if (argc > 4) {
      Ts.clear();
      std::string list = argv[4];
      for (size_t pos = 0; pos <= list.size();) {
        size_t comma = list.find(',', pos);
        if (comma == std::string::npos) comma = list.size();
        Ts.push_back(std::stoll(list.substr(pos, comma - pos)));
        pos = comma + 1;
      }
    }
    return cmd_experts(dt, paths, Ts);
  }
  std::fprintf(stderr, "usage: experts_lab ceilings | kernels [K] | experts [dtype] [paths] [Ts]\n");
  return 2;
}
