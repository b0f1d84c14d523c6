// Dense linear lab: the plain loop of ops::linear on an unprepared bf16 weight ("before") vs the
// packed weight on the engine's micro-kernels (cpu::DenseLinear, "after"), on the shapes of
// Qwen1.5-MoE-A2.7B: the lm_head at decode, a 2048 x 2048 projection at decode, the shared
// expert's gate at 4 rows and at a 512-row prefill. Weights are bf16 and evicted from the caches:
// each call reads the next of enough copies to stream more than twice the last-level cache.
// Prints ms per call, GB/s of weights vs the measured DRAM read bandwidth, GFLOP/s vs the
// kernel peak, and the packing rate. The result of "after" is checked against "before" first.
//
// Build: lab/cpu/build.sh BUILD_DIR (needs libmoex.so there). Run: BUILD_DIR/dense_linear_lab
// [copies_bytes_mib=640] [reps=5] [pack] ("pack": packing rates only).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <random>
#include <vector>

#include "cpu/dense_linear.hpp"
#include "ops/ops.hpp"

using namespace moex;

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

Tensor random_bf16(Shape shape, uint64_t seed, DType dt) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> v(size_t(shape_numel(shape)));
  for (float& x : v) x = u(rng);
  return Tensor::from_floats(v, shape, dt);
}

// CPU seconds of the whole process (all threads): on the shared machine a rate per CPU second
// is steadier than one per wall second.
double cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Case {
  const char* name;
  int64_t rows, in, out;
};

}  // namespace

int main(int argc, char** argv) {
  const double evict_mib = argc > 1 ? std::atof(argv[1]) : 640.0;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 5;
  const double dram = cpu::measure_dram_read_gbs();
  const auto path = cpu::plan_dense_kernels(DType::kBF16, cpu::detect_cpu_features()).path;
  const double peak = cpu::measure_kernel_peak_gflops(DType::kBF16, path);
  std::printf("threads %d, kernel path %s, DRAM read %.1f GB/s, bf16 peak %.0f GFLOP/s, "
              "weights streamed per case >= %.0f MiB\n",
              omp_get_max_threads(), std::string(cpu::kernel_path_name(path)).c_str(), dram, peak,
              evict_mib);
  const Case cases[] = {{"lm_head decode", 1, 2048, 151936},
                        {"proj decode", 1, 2048, 2048},
                        {"shared gate 4 rows", 4, 2048, 5632},
                        {"shared gate prefill", 512, 2048, 5632}};
  const bool pack_only = argc > 3 && std::string(argv[3]) == "pack";
  for (const Case& c : cases) {
    const double wbytes = double(c.in * c.out) * 2;
    const int copies = std::max(1, int(std::ceil(evict_mib * 1048576.0 / wbytes)));
    std::vector<Tensor> w;
    std::vector<std::shared_ptr<const cpu::DenseLinear>> p;
    double pack_s = 0, pack_cpu = 0;
    for (int i = 0; i < copies; ++i) {
      w.push_back(random_bf16({c.out, c.in}, 100 + uint64_t(i), DType::kBF16));
      const double t0 = now(), c0 = cpu_seconds();
      p.push_back(cpu::DenseLinear::pack(w.back()));
      pack_s += now() - t0;
      pack_cpu += cpu_seconds() - c0;
    }
    if (pack_only) {
      std::printf("%-20s packing %.2f GB/s wall, %.2f GB/s per CPU second (%d copies of %.1f MB)\n",
                  c.name, wbytes * copies / pack_s / 1e9, wbytes * copies / pack_cpu / 1e9, copies,
                  wbytes / 1e6);
      continue;
    }
    const Tensor x = random_bf16({c.rows, c.in}, 7, DType::kBF16).to(DType::kF32);
    // Check first: the packed result against the plain loop (both bf16-rounded float32 sums).
    {
      const std::vector<float> a = ops::linear(x, w[0], Tensor(), DType::kBF16).to_float_vector();
      const std::vector<float> b = p[0]->run(x, Tensor(), DType::kBF16).to_float_vector();
      double worst = 0;
      for (size_t i = 0; i < a.size(); ++i)
        worst = std::max(worst, std::abs(double(a[i]) - b[i]) / (std::abs(double(a[i])) + 1.0));
      if (worst > 1.0 / 64) {
        std::printf("%s: packed result differs from the plain loop (%.3g)\n", c.name, worst);
        return 1;
      }
    }
    auto time = [&](auto&& call, int n) {
      std::vector<double> t;
      for (int r = 0, i = 0; r < n; ++r) {
        const double t0 = now();
        call(i);
        t.push_back(now() - t0);
        i = (i + 1) % copies;
      }
      return median(t);
    };
    const double flops = 2.0 * double(c.rows) * double(c.in) * double(c.out);
    const int before_reps = c.rows > 64 || c.out > 100000 ? 3 : std::max(reps, copies);
    const int after_reps = std::max(reps, std::min(copies * 2, 200));
    const double tb = time([&](int i) { ops::linear(x, w[size_t(i)], Tensor(), DType::kBF16); }, before_reps);
    const double ta = time([&](int i) { p[size_t(i)]->run(x, Tensor(), DType::kBF16); }, after_reps);
    for (auto [label, t] : {std::pair{"before", tb}, std::pair{"after ", ta}})
      std::printf("%-20s [%lld, %lld] x [%lld, %lld]^T %s %9.3f ms  %6.1f GB/s (%3.0f%% of DRAM)  "
                  "%7.1f GFLOP/s (%3.0f%% of peak)\n",
                  c.name, (long long)c.rows, (long long)c.in, (long long)c.out, (long long)c.in,
                  label, t * 1e3, wbytes / t / 1e9, 100 * wbytes / t / 1e9 / dram, flops / t / 1e9,
                  100 * flops / t / 1e9 / peak);
    std::printf("%-20s packing %.2f GB/s wall, %.2f GB/s per CPU second (%d copies of %.1f MB)\n",
                c.name, wbytes * copies / pack_s / 1e9, wbytes * copies / pack_cpu / 1e9, copies,
                wbytes / 1e6);
  }
  return 0;
}
