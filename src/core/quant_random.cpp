// Synthetic block-scaled experts weights (moex/bench.hpp): what `moex bench experts --dtype fp8`
// and the quantized experts tests run on when no checkpoint is at hand.
#include <cmath>
#include <random>

#include "moex/bench.hpp"
#include "moex/error.hpp"
#include "moex/quant.hpp"

namespace moex {
namespace {

// One block-scaled matrix set [E, N, K] with its scales; values ~ base_scale x code.
void fill_matrix(const ExpertsSpec& spec, Tensor& w, Tensor& s, std::mt19937_64& rng) {
  const bool fp4 = spec.quant.kind == QuantScheme::Kind::kFp4E2M1;
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> value(-448.f, 448.f);
  uint8_t* b = static_cast<uint8_t*>(w.raw());
  const int64_t n = int64_t(w.numel());
  // FP8: uniform in value (like a matrix quantized by its block amax: most codes near the top);
  // FP4: uniform over the 16 codes (every byte is two codes).
  for (int64_t i = 0; i < n; ++i) b[i] = fp4 ? uint8_t(byte(rng)) : float_to_f8e4m3(value(rng));
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
  std::mt19937_64 rng(seed);
  fill_matrix(spec, w.gate_up, w.gate_up_scale, rng);
  fill_matrix(spec, w.down, w.down_scale, rng);
  validate_experts_weights(spec, w);
  return w;
}

}  // namespace moex
