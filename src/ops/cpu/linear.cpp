// The dense projection y = x W^T + b and its per-group form (see ops.hpp). Prepared weights
// run on the CPU engine's micro-kernels (src/cpu/dense_linear.hpp); the plain loops below serve
// unprepared weights, weights of a dtype the engine does not pack, and the per-group form.
#include <algorithm>
#include <vector>

#include <cstring>
#include <memory>

#include "core/parallel_errors.hpp"
#include "cpu/big_alloc.hpp"
#include "cpu/dense_linear.hpp"
#include "cpu/quant_linear.hpp"
#include "ops/cpu/cpu_ops.hpp"

namespace moex::ops {

// Here rather than in dispatch.cpp: the packed form's size lives with the host engine.
int64_t LinearWeight::nbytes() const {
  int64_t b = packed ? int64_t(packed->bytes()) : 0;
  if (tensor.defined() && !packed) b += int64_t(tensor.nbytes());
  if (scale.defined()) b += int64_t(scale.nbytes());
  return b;
}

}  // namespace moex::ops

namespace moex::ops::cpu {

LinearWeight prepare_linear(const Tensor& weight, bool keep_tensor) {
  LinearWeight w;
  w.out = weight.size(0);
  w.in = weight.size(1);
  w.dtype = weight.dtype();
  w.tensor = weight;
  if (!moex::cpu::DenseLinear::packable(weight.dtype())) return w;
  w.packed = moex::cpu::DenseLinear::pack(weight);
  // One copy of the weights: a view of the file mapping stays mapped (others may read it, e.g.
  // the embedding lookup of a tied lm_head) but gives its resident pages back; an owned copy
  // (converted at load) is dropped unless the caller still reads it.
  const bool mapped = weight.storage() && weight.storage()->file_mapped();
  if (mapped) weight.release_file_pages();
  else if (!keep_tensor) w.tensor = Tensor();
  return w;
}

Tensor prepare_quantized_codes(const Tensor& codes) {
  // The codes are read in place (src/cpu/quant_linear.cpp), on transparent huge pages as the
  // quantized experts' are (cpu/experts_quant.hpp says why: at one row the kernel streams them at
  // the DRAM's pace, and in 4 KiB pages every 4 KiB waits on a page walk). Codes still in the
  // checkpoint's file mapping cannot be collapsed: they are copied into a 2 MiB-aligned buffer
  // (every whole 2 MiB of it one huge page; a plain allocation of 2-4 MiB may hold none) and the
  // mapping's pages given back, so the resident size stays the stored size. Smaller codes stay
  // where they are.
  Tensor c = codes;
  const size_t bytes = c.defined() ? c.nbytes() : 0;
  if (bytes < moex::cpu::kHugePage || !c.is_contiguous()) return c;
  if (c.storage() && c.storage()->file_mapped()) {
    void* p = moex::cpu::big_alloc(bytes);
    std::memcpy(p, c.raw(), bytes);
    auto storage =
        std::make_shared<Storage>(p, bytes, Device::cpu(), [bytes](void* q) { moex::cpu::big_free(q, bytes); });
    Tensor copy(std::move(storage), 0, c.dtype(), c.shape(), c.strides());
    c.release_file_pages();
    c = std::move(copy);
  }
  c.collapse_to_huge_pages();
  return c;
}

Tensor linear(const Tensor& x, const LinearWeight& weight, const Tensor& bias, DType act) {
  if (weight.quantized())
    return moex::cpu::quant_linear(x, weight.tensor, weight.scale, weight.quant, weight.out, weight.in, bias, act);
  if (weight.packed) return weight.packed->run(x, bias, act);
  return linear(x, weight.tensor, bias, act);
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias, DType act) {
  const int64_t rows = x.size(0), in = weight.size(1), out = weight.size(0);
  Tensor y = Tensor::empty({rows, out}, DType::kF32);
  const float* X = x.data<float>();
  float* Y = y.data<float>();
  const float* B = bias.defined() ? bias.data<float>() : nullptr;
  constexpr int64_t kBlock = 16;  // weight rows converted together, reused for every token
  // A failed scratch allocation is rethrown after the region (none may escape it).
  ParallelErrors errors;
#pragma omp parallel if (rows * in * out >= kParallelWork)
  {
    std::vector<float> buf;
    bool ready = false;
    errors.run([&] {
      buf.resize(weight.dtype() == DType::kF32 ? 0 : size_t(kBlock * in));
      ready = true;
    });
#pragma omp for schedule(static)
    for (int64_t j0 = 0; j0 < out; j0 += kBlock) {
      if (!ready) continue;
      const int64_t nj = std::min(kBlock, out - j0);
      const float* W = float_row(weight, j0 * in, nj * in, buf.data());
      for (int64_t t = 0; t < rows; ++t) {
        const float* xr = X + t * in;
        float* yr = Y + t * out + j0;
        for (int64_t j = 0; j < nj; ++j) {
          float v = dot(xr, W + j * in, in);
          if (B) v += B[j0 + j];
          yr[j] = round_act(v, act);
        }
      }
    }
  }
  errors.rethrow();
  return y;
}

// Parallel over groups: each group's block is converted to float32 once and reused by every row.
// transpose_weight: y_g = x_g W_g, accumulated over the block's rows in ascending order (a fixed
// order, so results do not depend on the thread count).
Tensor linear_per_group(const Tensor& x, const GroupedWeight& w, bool transpose_weight, DType act) {
  const int64_t rows = x.size(0), G = w.groups, in = w.in(), br = w.rows;
  const int64_t a = transpose_weight ? br : in, b = transpose_weight ? in : br;
  Tensor y = Tensor::empty({rows, G * b}, DType::kF32);
  const float* X = x.data<float>();
  float* Y = y.data<float>();
  ParallelErrors errors;
#pragma omp parallel if (rows * G * in * br >= kParallelWork)
  {
    std::vector<float> buf, acc;
    bool ready = false;
    errors.run([&] {
      buf.resize(w.weight.dtype() == DType::kF32 ? 0 : size_t(br * in));
      acc.resize(size_t(b));
      ready = true;
    });
#pragma omp for schedule(static)
    for (int64_t g = 0; g < G; ++g) {
      if (!ready) continue;
      const float* W = float_row(w.weight, (g * w.group_rows + w.offset) * in, br * in, buf.data());
      for (int64_t t = 0; t < rows; ++t) {
        const float* xr = X + t * G * a + g * a;
        float* yr = Y + t * G * b + g * b;
        if (!transpose_weight) {
          for (int64_t j = 0; j < br; ++j) yr[j] = round_act(dot(xr, W + j * in, in), act);
          continue;
        }
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int64_t k = 0; k < br; ++k) {
          const float xk = xr[k];
          const float* wr = W + k * in;
          for (int64_t i = 0; i < in; ++i) acc[size_t(i)] += xk * wr[i];
        }
        for (int64_t i = 0; i < in; ++i) yr[i] = round_act(acc[size_t(i)], act);
      }
    }
  }
  errors.rethrow();
  return y;
}

}  // namespace moex::ops::cpu
