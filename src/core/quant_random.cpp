// Synthetic block-scaled experts weights (moex/bench.hpp): what `moex bench experts --dtype fp8`
// and the quantized experts tests run on when no checkpoint is at hand.
#include <cmath>
#include <random>

#include "moex/bench.hpp"
#include "moex/error.hpp"
#include "moex/quant.hpp"

namespace moex {
namespace {

// splitmix64's finaliser: a code depends only on (seed, matrix, index), so the codes are filled
// in parallel and are the same for any thread count. With one serial generator, `moex bench
// experts --dtype fp8` at 32 DeepSeek-V3-sized experts spent 22.6 s on 2 cores before its first
// row (6.8 s in parallel); 256 experts have 8x the codes (11.3 G).
inline uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// One block-scaled matrix set [E, N, K] with its scales; values ~ base_scale x code.
void fill_matrix(const ExpertsSpec& spec, Tensor& w, Tensor& s, uint64_t seed, uint64_t matrix) {
  const bool fp4 = spec.quant.kind == QuantScheme::Kind::kFp4E2M1;
  uint8_t* b = static_cast<uint8_t*>(w.raw());
  const int64_t n = int64_t(w.numel());
  const uint64_t stream = mix(seed * 2 + matrix);
  // FP8: uniform in value over [-448, 448) (like a matrix quantized by its block amax: most codes
  // near the top); FP4: uniform over the 16 codes (every byte is two codes).
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t z = mix(stream + uint64_t(i) * 0x9E3779B97F4A7C15ull);
    b[i] = fp4 ? uint8_t(z >> 56)
               : float_to_f8e4m3((float(z >> 40) * (1.f / 16777216.f) * 2.f - 1.f) * 448.f);
  }
  std::mt19937_64 rng(mix(stream + 1));
  const int64_t K = fp4 ? w.size(2) * 2 : w.size(2);
  const float typical = fp4 ? 3.f : 448.f / std::sqrt(3.f);  // rms of the codes' values
  const float base = 1.f / (std::sqrt(float(K)) * typical);
  std::uniform_real_distribution<float> f32(0.5f, 2.f);
  std::uniform_int_distribution<int> pow2(-1, 1);
  const int64_t ns = int64_t(s.numel());
  for (int64_t i = 0; i < ns; ++i) {
    if (s.dtype() == DType::kF8E8M0)
      static_cast<uint8_t*>(s.raw())[i] = uint8_t(127 + int(std::lround(std::log2(base))) + pow2(rng));
    else
      static_cast<float*>(s.raw())[i] = base * f32(rng);
  }
}

}  // namespace

ExpertsWeights random_quantized_experts_weights(const ExpertsSpec& spec, uint64_t seed) {
  if (!spec.quant.quantized())
    throw InvalidInput("random_quantized_experts_weights needs a quantized spec, got " + spec.str());
  const bool fp4 = spec.quant.kind == QuantScheme::Kind::kFp4E2M1;
  const int64_t E = spec.num_experts, H = spec.hidden, I = spec.intermediate, R = spec.gate_up_rows();
  const int64_t bn = spec.quant.block_n, bk = spec.quant.block_k;
  const DType sd = spec.quant.scale_dtype;
  ExpertsWeights w;
  if (fp4) {
    if (H % 2 || I % 2) throw InvalidInput("FP4 experts need even H and I, got " + spec.str());
    w.gate_up = Tensor::empty({E, R, H / 2}, DType::kI8);
    w.down = Tensor::empty({E, H, I / 2}, DType::kI8);
  } else {
    w.gate_up = Tensor::empty({E, R, H}, DType::kF8E4M3);
    w.down = Tensor::empty({E, H, I}, DType::kF8E4M3);
  }
  w.gate_up_scale = Tensor::empty(
      {E, quant::scale_rows(R, bn, spec.has_gate), quant::scale_cols(H, bk)}, sd);
  w.down_scale = Tensor::empty({E, quant::scale_rows(H, bn, false), quant::scale_cols(I, bk)}, sd);
  fill_matrix(spec, w.gate_up, w.gate_up_scale, seed, 0);
  fill_matrix(spec, w.down, w.down_scale, seed, 1);
  validate_experts_weights(spec, w);
  return w;
}

}  // namespace moex
