// The quantized (FP8 / FP4) path of the CPU experts backends: activation rows quantized once,
// weights read in their stored bytes by the block-scaled kernel (kernels.hpp), and the stages
// (gate_up, activation + re-quantization, down) that eager, batched_mm and grouped_mm schedule
// differently. No prepared state: the weights are never converted, so the memory held stays the
// stored size (~1 byte per FP8 weight, 0.5 per FP4, plus scales).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "cpu/experts_common.hpp"
#include "cpu/kernels/kernels.hpp"

namespace moex::cpu {

// The block-scaled kernel this CPU runs (AVX512-BF16 > AVX-512 > AVX2 + F16C > portable), chosen
// once per process; QuantRows' layout and the dense linears' path follow the same choice.
kernels::BlockScaledFn block_scaled_kernel();

// Rows quantized per moex/quant.hpp, in the layout the block-scaled kernel reads.
struct QuantRows {
  int64_t k = 0, ld = 0, nb = 0;
  bool fp4 = false;
  std::vector<float> q, s;
  // bf16 copies of q for the AVX512-BF16 kernel (kernels::pack_activation_bf16), filled only
  // where that kernel runs (a CPU with AVX512-BF16); empty otherwise. With them q is in column
  // order for FP4 too (the float FP4 kernel wants each 32 block as evens, then odds).
  std::vector<uint16_t> b;
  void resize(int64_t rows, int64_t k, bool fp4);
  // Quantizes x[0, k) into row r.
  void set_row(int64_t r, const float* x);
};

// Expert e's gate_up ([R, H]) or down ([H, I]) as kernel arguments (activation fields unset).
kernels::BlockScaledArgs quant_gate_up(const ExpertsSpec& s, const ExpertsWeights& w, int64_t e);
kernels::BlockScaledArgs quant_down(const ExpertsSpec& s, const ExpertsWeights& w, int64_t e);

// y[m * ldy + n] for m < M, n0 <= n < n1: W times rows x_rows[m] (null: m) of X.
void quant_linear(kernels::BlockScaledArgs W, const QuantRows& X, const int64_t* x_rows,
                  int64_t M, int64_t n0, int64_t n1, float* y, int64_t ldy);

// Output rows per task when products with `total_rows` output rows in all (over the experts of
// one phase) are split over `threads`: up to 256 rows (each task streams its weight rows from
// cold, so short tasks pay that start often: 64-row tasks ran the DeepSeek-sized FP8 layer at
// T = 1 3-6 % slower on 2 Xeon vCPUs, docs/cpu.md), down to 16 so that there are at least four
// tasks per thread; a multiple of 16.
int64_t quant_rows_per_task(int64_t total_rows, int threads);

// The hidden rows of the problem quantized once each (threads over tokens).
void quantize_hidden(const ExpertsProblem& p, QuantRows& X);

// Row `row` of h from gate_up row gu (R values): activation, rounding to act_dtype, quantization.
void quant_activate_row(const ExpertsSpec& s, const float* gu, DType act_dtype, QuantRows& h,
                        int64_t row, std::vector<float>& scratch);

// The whole expert MLP for one row of X on the calling thread: y [H] fp32.
void quant_expert_row(const ExpertsSpec& s, const ExpertsWeights& w, int64_t e, const QuantRows& X,
                      int64_t x_row, float* y, DType act_dtype, QuantRows& h,
                      std::vector<float>& scratch);

// The prepare() of every CPU backend for quantized experts: nothing is converted or packed (the
// kernel reads the stored bytes), but the code matrices are moved onto transparent huge pages
// (Tensor::collapse_to_huge_pages), in place. At one token the FP8 layer streams its weights at
// the DRAM's pace, and with 4 KiB pages each 4 KiB of every weight stream waits on a page walk:
// 2 Xeon vCPUs, DeepSeek-V3-sized experts, T = 1, measured 8 % slower (docs/cpu.md). Returns null
// (no prepared state).
std::unique_ptr<PreparedExperts> prepare_quantized_experts(const ExpertsWeights& w);

// Grouped execution: pairs sorted by expert, each stage split into (expert, output rows) tasks
// over threads. all_at_once: every expert's tasks in one parallel loop (grouped_mm); otherwise
// one expert after another (eager, like transformers' loop). Writes out.
void quant_grouped_forward(const ExpertsProblem& p, Tensor& out, bool all_at_once);

}  // namespace moex::cpu
