// Quantized dense linears on the host (ops::linear over a prepared FP8 / FP4 LinearWeight) at
// decode and small-prefill row counts, DeepSeek-V3 projection shapes; GB/s of codes + scales
// against the engine's DRAM read figure (measure_dram_read_gbs, same run). Each call reads the
// next of enough weight copies to stream >= 512 MB, so the codes come from DRAM. Link it against
// two builds to compare them:
//
//   g++ -std=c++20 -O2 -fopenmp -Iinclude -Isrc lab/cpu/quant_linear_lab.cpp -LBUILD -lmoex \
//       -Wl,-rpath,BUILD -o /tmp/quant_linear_lab && OMP_NUM_THREADS=2 /tmp/quant_linear_lab
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include "cpu/engine.hpp"
#include "moex/dtype.hpp"
#include "moex/quant.hpp"
#include "ops/ops.hpp"

using namespace moex;

int main() {
  const double dram = cpu::measure_dram_read_gbs();
  std::printf("DRAM read %.1f GB/s\n", dram);
  std::mt19937_64 rng(3);
  std::normal_distribution<float> g;
  struct Shape {
    const char* what;
    int64_t n, k;
  };
  for (bool fp4 : {false, true})
    for (const Shape& sh : {Shape{"q_b_proj-like", 24576, 1536}, Shape{"o_proj", 7168, 16384},
                            Shape{"shared gate_up", 4096, 7168}}) {
      QuantScheme q;
      q.kind = fp4 ? QuantScheme::Kind::kFp4E2M1 : QuantScheme::Kind::kFp8E4M3;
      q.scale_dtype = fp4 ? DType::kF8E8M0 : DType::kF32;
      q.block_n = fp4 ? 1 : 128;
      q.block_k = fp4 ? 32 : 128;
      const int64_t row_bytes = fp4 ? sh.k / 2 : sh.k;
      const int64_t sr = quant::ceil_div(sh.n, q.block_n), sc = quant::ceil_div(sh.k, q.block_k);
      const double bytes = double(sh.n * row_bytes) + double(sr * sc) * (fp4 ? 1 : 4);
      const int copies = int(std::max(1.0, 512e6 / bytes));
      std::vector<ops::LinearWeight> ws;
      for (int c = 0; c < copies; ++c) {
        Tensor codes = Tensor::empty({sh.n, row_bytes}, fp4 ? DType::kI8 : DType::kF8E4M3);
        uint8_t* p = static_cast<uint8_t*>(codes.raw());
        for (int64_t i = 0; i < sh.n * row_bytes; ++i)
          p[i] = fp4 ? uint8_t(rng()) : float_to_f8e4m3(std::clamp(g(rng) * 100.f, -448.f, 448.f));
        Tensor scale = Tensor::empty({sr, sc}, q.scale_dtype);
        for (int64_t i = 0; i < sr * sc; ++i) {
          if (fp4) static_cast<uint8_t*>(scale.raw())[i] = uint8_t(118 + rng() % 6);
          else static_cast<float*>(scale.raw())[i] = 1e-4f;
        }
        ws.push_back(ops::prepare_quantized_linear(codes, scale, q, sh.n, sh.k));
      }
      for (int64_t rows : {1, 4, 32}) {
        std::vector<float> xv(size_t(rows * sh.k));
        for (auto& v : xv) v = g(rng);
        const Tensor x = Tensor::from_floats(xv, {rows, sh.k});
        std::vector<double> t;
        for (int it = 0; it < std::max(7, copies); ++it) {
          const auto t0 = std::chrono::steady_clock::now();
          const Tensor y = ops::linear(x, ws[size_t(it % copies)], Tensor(), DType::kBF16);
          t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        }
        std::sort(t.begin(), t.end());
        const double med = t[t.size() / 2];
        std::printf("%s [%ld, %ld] x [%ld, %ld]^T (%s): median %.3f ms, %.1f GB/s, %.0f %% of DRAM\n",
                    fp4 ? "fp4" : "fp8", long(rows), long(sh.k), long(sh.n), long(sh.k), sh.what, med * 1e3,
                    bytes / med / 1e9, 100 * bytes / med / 1e9 / dram);
      }
    }
}
