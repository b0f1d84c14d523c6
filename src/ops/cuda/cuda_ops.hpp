// CUDA implementations of the ops in src/ops/ops.hpp (same names, same contracts), reached only
// through the dispatch in src/ops/dispatch.cpp, compiled in CUDA builds only.
//
// Device conventions (ops.hpp says what is computed; this says how it runs on a GPU):
// - Activations are stored in `act` itself (bf16 / f16 / f32 tensors), so that cuBLASLt and the
//   experts read them directly; inputs of another float dtype are accepted (an op reads any of
//   f32 / f16 / bf16 and writes its documented dtype). Weights and norm vectors may be any float
//   dtype. Outputs are new tensors from the caching allocator, or the argument (in-place ops).
// - Everything runs on moex::cuda::current_stream() of the tensors' device; nothing
//   synchronises the host or allocates with cudaMalloc once warm (choose_tokens returns host
//   ids: its one device->host copy is the step's download).
// - Per-step facts (past, pads, positions, ids) are read from step.device (see ops.hpp), never
//   from the host fields, so that a step's launches are the same at every decode step: grids
//   are sized from shapes and capacities, not from the cache length.
// - Arithmetic follows the host implementation's rounding points (ops.hpp); accumulation order
//   may differ (parallel reductions), so results agree to float32 rounding, not bit for bit,
//   except where an op says it is exact (routing choices, argmax, element-wise ops).
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "ops/ops.hpp"

namespace moex::ops::cuda {

void make_device_step(Step& step, Device device);

// A contiguous copy of x in `dtype` on x's device (x itself when it has that dtype already).
Tensor convert(const Tensor& x, DType dtype);

void kv_append(LayerKV& kv, const Tensor& k, const Tensor& v, const Step& step);
// kv_append's host part: the cache allocated or grown for this step's columns (the copy is the
// caller's; kv.filled is not advanced).
void kv_reserve(LayerKV& kv, const Tensor& k, const Tensor& v, const Step& step);
Tensor kv_columns(const Tensor& cache, int64_t n);

void round_(Tensor& x, DType act);
void add_(Tensor& a, const Tensor& b, DType act);
void clamp_(Tensor& x, float limit);
void gated_activation_(Tensor& gate, const Tensor& up, Activation act_fn, DType act);
void add_gated_(Tensor& y, const Tensor& shared, const Tensor& gate_logit, DType act);
void add_gated_residual_(Tensor& residual, Tensor& y, const Tensor& shared, const Tensor& gate_logit, DType act);
Tensor embedding(const Tensor& table, const Step& step, DType act);
Tensor slice_columns(const Tensor& x, int64_t groups, int64_t begin, int64_t width);
Tensor concat_columns(const Tensor& a, const Tensor& b, int64_t groups, bool b_shared);
Tensor last_rows(const Tensor& x, const Step& step);

// Out of place (no clone + in-place pass) and in place.
Tensor rms_norm(const Tensor& x, const Tensor& weight, float eps, DType act, int64_t group, RmsNormStyle style);
void rms_norm_(Tensor& x, const Tensor& weight, float eps, DType act, int64_t group, RmsNormStyle style);
// add_(h, delta) then rms_norm(h) in one launch (h in act, one norm group per row).
Tensor add_rms_norm(Tensor& h, const Tensor& delta, const Tensor& weight, float eps, DType act, RmsNormStyle style);

// cos/sin computed in the kernel exactly as Rope::cos_sin does on the host (float32 product of
// inv_freq and the position, cos/sin in double, scaled, rounded), positions from step.device.
void rope_(Tensor& x, int64_t heads, int64_t head_stride, int64_t offset, const Rope& rope,
           RopeLayout layout, const Step& step, DType act);
// rope_ on two tensors of the same rows (q and k) in one launch.
void rope2_(Tensor& a, int64_t heads_a, Tensor& b, int64_t heads_b, int64_t head_stride, int64_t offset,
            const Rope& rope, RopeLayout layout, const Step& step, DType act);
void rope_kv_append_(Tensor& q, int64_t heads_q, Tensor& k, int64_t heads_k, const Tensor& v, LayerKV& kv,
                     int64_t head_dim, const Rope& rope, RopeLayout layout, const Step& step, DType act);

// ops::finish_background_work: returns once the cuDNN attention builder has no graph queued or
// being planned (attention_cudnn.cpp says why); never starts the builder.
void finish_background_work();

// cuBLASLt (fp32 without TF32; bf16 / f16 with float32 accumulation), bias and rounding in the
// epilogue.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias, DType act);
// Decode-sized linears (linear_gemv.cu): a bandwidth-bound GEMV for 1..kGemvMaxRows rows with
// 16-bit weights, x, bias and act all of the weights' dtype, in % 8 == 0 and 16-byte aligned
// operands; gemv_serves says whether a call qualifies. linear() routes such calls there.
inline constexpr int64_t kGemvMaxRows = 8;
// Above this weight size cuBLASLt's decode kernel streams at least as fast (the 622 MB lm_head
// of Qwen1.5-MoE: 143 us against the GEMV's 159 us on the H200), so it keeps those.
inline constexpr size_t kGemvMaxWeightBytes = size_t(256) << 20;
bool gemv_serves(const Tensor& x, const Tensor& weight, const Tensor& bias, DType act);
Tensor linear_gemv(const Tensor& x, const Tensor& weight, const Tensor& bias);
// Up to kGemvMaxSegments GEMVs of the same x in one launch (each weight [out_i, in] with its bias
// or an undefined tensor), each output exactly linear_gemv's; every weight must pass gemv_serves.
inline constexpr int kGemvMaxSegments = 4;
std::vector<Tensor> linear_gemv_segments(const Tensor& x, std::span<const Tensor* const> weights,
                                         std::span<const Tensor* const> biases);
// ops::linears: one GEMV launch when every linear qualifies, else one linear() each.
std::vector<Tensor> linears(const Tensor& x, std::span<const LinearOf> ls, DType act);
// ops::norm_linears: one GEMV launch forming the norm in its blocks when norm_gemv_serves and
// every linear qualifies (MOEX_NORM_GEMV=0 turns that off, for measuring), else the ops in turn.
// Rows: up to kNormGemvMaxRows. H200, Qwen1.5-MoE shape, 24 layers (docs/gpu_model.md): batch-1
// decode 403.5 / 403.4 tokens/s against 390.6 / 396.2 with the norm kernels; at batch 8 (8 rows:
// every block reads 8 rows of h for the sums and normalises 8 rows per weight chunk) 1,244 against
// 1,439, so 8-row calls keep the norm kernel.
inline constexpr int64_t kNormGemvMaxRows = 1;
bool norm_gemv_serves(const Tensor& h, const Tensor* delta, const Tensor& norm_weight, DType act);
std::vector<Tensor> norm_linear_gemv_segments(Tensor& h, const Tensor* delta, const Tensor& norm_weight, float eps,
                                              RmsNormStyle style, std::span<const Tensor* const> weights,
                                              std::span<const Tensor* const> biases, Tensor* x_out);
std::vector<Tensor> norm_linears(Tensor& h, const Tensor* delta, const NormOf& norm, std::span<const LinearOf> ls,
                                 DType act, Tensor* x_out);
// A block-quantized weight (LinearWeight::quantized()), linear_quant.cu.
Tensor linear_quantized(const Tensor& x, const LinearWeight& w, const Tensor& bias, DType act);
// Whether linear_quantized runs rows x w on the Hopper FP8 tensor cores (the experts' FP8
// wgmma kernel): more rows than the GEMV takes, FP8 weights with 128 x 128 scale blocks, bf16 /
// f16 activations, K a multiple of 16, a 16-byte aligned weight, an sm_90 device (and, checked
// at the call, 16-byte aligned activations).
bool linear_quantized_on_tensor_cores(int64_t rows, const LinearWeight& w, DType act, int device);
// cuBLASLt strided batched (one call, one batch per group, blocks read in place), float32
// accumulation, rounded once to act in the epilogue.
Tensor linear_per_group(const Tensor& x, const GroupedWeight& w, bool transpose_weight, DType act);

Tensor attention(const Tensor& q, const LayerKV& kv, const Step& step, const AttentionSpec& spec, DType act);

// Exact: the same experts, slot order and weights (to float32 rounding of the softmax) as the
// host's torch_topk-based routers; top_k_index int64 and top_k_weights float32 on the device.
Routing softmax_topk(const Tensor& logits, int64_t k, bool normalize, DType weights_dtype);
Routing topk_softmax(const Tensor& logits, int64_t k, DType act);
Routing sigmoid_group_topk(const Tensor& logits, const Tensor& correction, const GroupLimitedTopk& spec);

std::vector<int64_t> choose_tokens(const Tensor& logits, const SamplingSpec* sampling, std::mt19937_64& rng,
                                   std::vector<int64_t>* nonfinite = nullptr);
void make_device_feed(DeviceFeed& feed, const std::vector<int64_t>& stop_token, const std::vector<int64_t>& eos,
                      const std::vector<uint64_t>& seeds, Device device);
void choose_and_feed(const Tensor& logits, const SamplingSpec* sampling, Step& step, DeviceFeed& feed);

}  // namespace moex::ops::cuda
