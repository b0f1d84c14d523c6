// Ops: the top tier of the CUDA experts code. Validated problem in (raw pointers and sizes, see
// ExpertsArgs), a plan chosen by a pure function of the shape and device (experts_plan.hpp) and
// passed in as a value, launchers called in order.
//
//   batched_mm: gate_up GEMM (one tile per pair, its expert read from top_k_index by the GEMM:
//               no routing kernel; the pair's expert rows are streamed from the weight tensor,
//               nothing is copied) -> down GEMM -> combine
//   grouped_mm: route_by_expert -> grouped gate_up GEMM (gather fused in the A loads, activation
//               fused in the epilogue) -> grouped down GEMM -> combine. On Hopper, 128-row tiles
//               run the TMA + wgmma kernel instead, which needs A contiguous: a gather into
//               sorted order comes first (one extra pass over [P, H], a few % of the time).
//   sonicmoe:   route_by_expert -> gate_up reading the hidden rows in place (cp.async into the
//               wgmma stages) -> down writing per-pair rows in the element type -> combine.
//   eager:      route_by_expert, then a host loop over the experts that received tokens (it reads
//               the per-expert offsets back, so it synchronises): gather, dense gate_up,
//               activation, dense down; then combine. It is the readable reference path.
//   quantized experts: the same routing and combine; each GEMM's A operand is quantized first
//               (1 x 128 blocks, quantize_act) and the products read the weights in place. FP8
//               grouped_mm on Hopper: gather into sorted order, quantize, FP8 wgmma gate_up,
//               quantize h, FP8 wgmma down.
// All of them write per-pair rows y[pos, :] (fp32; sonicmoe: rounded to the element type) and
// share the deterministic combine, so they agree on the sum order; they differ only in how the
// products run.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "moex/experts.hpp"

#include "cuda/experts_plan.hpp"
#include "cuda/launchers.hpp"

namespace moex::cuda {

struct ExpertsArgs {
  Elem elem = Elem::kBF16;
  int64_t tokens = 0;
  int top_k = 0;
  int experts = 0, hidden = 0, intermediate = 0;
  bool gated = true, has_bias = false, transposed = false, concatenated = true;
  Activation act = Activation::kSilu;
  float limit = 7.f, alpha = 1.702f;
  const void* hidden_states = nullptr;  // [T, H]
  const void* top_k_index = nullptr;    // [T, k] int32 / int64
  bool index_i64 = true;
  const void* top_k_weights = nullptr;  // [T, k] or [T, E]
  Elem weights_elem = Elem::kF32;       // dtype of top_k_weights
  bool weights_per_expert = false;
  const void* gate_up = nullptr;
  const void* down = nullptr;
  const void* gate_up_bias = nullptr;
  const void* down_bias = nullptr;
  void* out = nullptr;                  // [T, H]
  // Block-scaled FP8 / FP4 experts (spec.quant): gate_up / down hold e4m3 bytes or e2m1 pairs
  // and these their scales (include/moex/quant.hpp). Every backend then runs the quantized
  // GEMMs its plan names: the CUDA-core ones (quant_gemm.cuh) or, grouped_mm with FP8 weights
  // on Hopper, the FP8 wgmma kernel (grouped_gemm_wgmma.cuh).
  bool quantized = false;
  QuantWeightArgs gate_up_q, down_q;
};

// What the plans read off a call, and the plans of the current device (traits read once).
ExpertsShape shape_of(const ExpertsArgs& a);
DeviceTraits traits_of(int device);

// One op per backend: `workspace` holds *_workspace_bytes(a, plan) bytes of device memory.
// batched_mm and grouped_mm never synchronise nor allocate (graph-capturable); eager reads the
// per-expert offsets back to the host (it synchronises `stream`).
size_t eager_workspace_bytes(const ExpertsArgs& a);
void eager_experts(const ExpertsArgs& a, void* workspace, cudaStream_t stream);
size_t batched_mm_workspace_bytes(const ExpertsArgs& a, const ExpertsPlan& plan);
void batched_mm_experts(const ExpertsArgs& a, const ExpertsPlan& plan, void* workspace,
                        cudaStream_t stream);
size_t grouped_mm_workspace_bytes(const ExpertsArgs& a, const ExpertsPlan& plan);
// sonicmoe (plan_sonicmoe): route_by_expert -> gate_up on Hopper tensor cores reading its A rows
// in place from the hidden states (cp.async, no gathered copy), activation in its epilogue ->
// down writing each pair's row in the element type -> the combine gathering and summing them
// per token (routing weights in the element type). Workspace: h [P, I] and y [P, H] of elem,
// against grouped_mm's gathered [P, H] copy + fp32 y.
size_t sonicmoe_workspace_bytes(const ExpertsArgs& a, const ExpertsPlan& plan);
void sonicmoe_experts(const ExpertsArgs& a, const ExpertsPlan& plan, void* workspace,
                      cudaStream_t stream);
void grouped_mm_experts(const ExpertsArgs& a, const ExpertsPlan& plan, void* workspace,
                        cudaStream_t stream);

}  // namespace moex::cuda
