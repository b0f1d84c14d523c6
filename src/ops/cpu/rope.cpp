// Rotary position embedding (see ops.hpp).
#include <cmath>
#include <cstring>
#include <vector>

#include "core/parallel_errors.hpp"
#include "ops/cpu/cpu_ops.hpp"

namespace moex::ops {

void Rope::cos_sin(int64_t position, DType act, float* cos_out, float* sin_out) const {
  // float32 as transformers computes it: freqs = inv_freq (f32) * position (f32), then cos/sin.
  const float scale = float(attention_scaling);
  for (size_t i = 0; i < inv_freq.size(); ++i) {
    const float f = float(inv_freq[i]) * float(position);
    cos_out[i] = cpu::round_act(float(std::cos(double(f))) * scale, act);
    sin_out[i] = cpu::round_act(float(std::sin(double(f))) * scale, act);
  }
}

namespace cpu {

void rope_(Tensor& x, int64_t heads, int64_t head_stride, int64_t offset, const Rope& rope,
           RopeLayout layout, const Step& step, DType act) {
  const int64_t d = rope.rotary_dim, half = d / 2, width = x.size(1);
  float* p = x.data<float>();
  // A failed scratch allocation is rethrown after the region (none may escape it).
  ParallelErrors errors;
#pragma omp parallel if (x.numel() * 8 >= kParallelWork)
  {
    std::vector<float> c, s, tmp;
    bool ready = false;
    errors.run([&] {
      c.resize(size_t(half));
      s.resize(size_t(half));
      tmp.resize(size_t(d));
      ready = true;
    });
#pragma omp for schedule(static)
    for (int64_t r = 0; r < step.rows(); ++r) {
      if (!ready) continue;
      rope.cos_sin(step.position(r), act, c.data(), s.data());
      for (int64_t h = 0; h < heads; ++h) {
        float* v = p + r * width + h * head_stride + offset;
        if (layout == RopeLayout::kInterleaved) {
          for (int64_t i = 0; i < half; ++i) {
            tmp[size_t(i)] = v[2 * i];
            tmp[size_t(i + half)] = v[2 * i + 1];
          }
          std::memcpy(v, tmp.data(), size_t(d) * sizeof(float));
        }
        for (int64_t i = 0; i < half; ++i) {
          const float x1 = v[i], x2 = v[i + half];
          // (x * cos) + (rotate_half(x) * sin), each product rounded as torch does in bf16.
          v[i] = round_act(round_act(x1 * c[size_t(i)], act) + round_act(-x2 * s[size_t(i)], act), act);
          v[i + half] = round_act(round_act(x2 * c[size_t(i)], act) + round_act(x1 * s[size_t(i)], act), act);
        }
      }
    }
  }
  errors.rethrow();
}

}  // namespace cpu
}  // namespace moex::ops
