// Dense linears (y = x W^T + b) on the CPU engine's micro-kernels (kernels.hpp), with the weight
// packed once, when the model is loaded. Measurements in docs/cpu.md, "Dense linears".
//
// Design:
// - Packing: bf16 weights in the pair (VNNI) layout, fp32 weights in 16-column panels, fp16
//   weights widened to fp32 panels (the engine has no fp16 kernels; widening is exact and keeps
//   the fp32-accumulation contract, at twice the bytes). Packing is parallel over panels.
// - One work unit = (row panel of <= 256 rows, 32-column block); units are walked panel-major,
//   so a panel's activations stay in L2 while every weight block streams past once per panel.
//   Decode (a handful of rows) is the same loop with one panel: each thread streams a contiguous
//   range of column blocks (the vector kernels prefetch their weight streams), so every weight
//   byte is read once per call.
// - Only the vector kernels run (avx512bf16, avx512, avx2, portable); AMX is not used here.
//   Their accumulators see products in k order whatever the row count or chunking (gemm_loop.hpp),
//   so a row's result does not depend on the other rows of the call (left-padded batches are
//   bit-identical to unpadded runs), nor on the thread count. AMX for large row counts would need
//   identical rounding to VDPBF16PS for the few-row calls, which is not established.
// - Summation order: the plain loop's (ops/cpu/cpu_ops.hpp dot), so that results do not move
//   against the fixtures it was validated with. It keeps eight accumulators (k mod 8), combines
//   them as a fixed tree and adds the k % 8 tail last. Packing permutes k so that class j
//   (k = j, j + 8, ...) is the contiguous slice j, then the tail; a kernel call per slice gives
//   each class's sum in k order, and the epilogue combines them like the loop. Products of bf16
//   values are exact in float32, so bf16 weights give the loop's bits on every path (pairs are
//   laid out in the order each kernel adds them); fp32 weights differ by FMA rounding only.
//   (A plain k-sequential sum rounded one element of DeepSeek's bf16 fixture the other way at a
//   near tie, which its router amplified to 4.8 % of the logits; measured.)
// - bf16 kernels read bf16 activations: the float32 activations are converted per call (exact
//   when they hold bf16 values: act == bf16, or checked per call otherwise); a bf16 weight with
//   activations that are not all bf16 values runs a scalar float32 loop over the packed weight
//   instead, so no activation is rounded. fp32
//   weights never go through the bf16 units.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "cpu/engine.hpp"
#include "moex/tensor.hpp"

namespace moex::cpu {

// The kernels dense linears run: kernel_set(force or the best path, packed dtype), with AMX
// replaced by avx512bf16 (see above). Throws Unsupported when `f` lacks the forced path or the
// dtype is not kBF16 / kF32.
KernelSet plan_dense_kernels(DType packed_dtype, const CpuFeatures& f,
                             std::optional<KernelPath> force = std::nullopt);

class DenseLinear {
 public:
  // Whether pack() accepts weights of this dtype (bf16, fp16, fp32).
  static bool packable(DType weight_dtype);
  // Packs weight [out, in] (host, any layout). Throws Unsupported for other dtypes and for a
  // forced path this machine lacks.
  static std::shared_ptr<const DenseLinear> pack(const Tensor& weight,
                                                 std::optional<KernelPath> force = std::nullopt);

  // y = x W^T + b, x float32 [rows, in] (contiguous), bias float32 [out] or undefined;
  // float32 accumulation, bias added in float32, rounded once to act. -> float32 [rows, out].
  Tensor run(const Tensor& x, const Tensor& bias, DType act) const;

  int64_t out() const { return out_; }
  int64_t in() const { return in_; }
  DType source_dtype() const { return source_; }
  const KernelSet& kernels() const { return kernels_; }
  size_t bytes() const { return w_.bytes(); }

 private:
  void run_scalar(const float* x, int64_t rows, const float* bias, DType act, float* y) const;

  int64_t out_ = 0, in_ = 0;
  int64_t slice_ = 0, tail_ = 0;  // packed k of each of the 8 k-class slices, of the tail
  std::vector<int32_t> order_;    // [k_pad]: source column of each packed k, -1 = zero
  DType source_ = DType::kF32;
  KernelSet kernels_;
  PackedMatrices w_;  // one matrix: n_pad = out rounded to 32, k_pad per kernels.hpp
};

}  // namespace moex::cpu
