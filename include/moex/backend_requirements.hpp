// The hardware and checkpoint requirements of the Hopper / Blackwell experts backends named after
// DeepGEMM and SonicMoE ("deepgemm", "deepgemm_megamoe", "sonicmoe"), as pure functions of the experts spec, the
// activation dtype and a description of the device, so that every check runs on a machine
// without a GPU (tests inject the description). The CUDA backends call them with the description
// of their device; each answer is empty when served, else one sentence naming what is missing and
// what to use instead (the CLI prints it and exits with code 2).
//
// moex compiles these kernels ahead of time (sm_90a cubins in libmoex), so unlike transformers'
// DeepGEMM integration it needs no CUDA toolkit at run time and makes no nvcc / CUDA_HOME check.
#pragma once

#include <string>

#include "moex/dtype.hpp"
#include "moex/experts.hpp"

namespace moex {

// What a requirement check knows of a device.
struct DeviceDescription {
  bool cuda = false;      // false: no CUDA device (the host)
  int cc_major = 0;       // compute capability
  int cc_minor = 0;
  std::string name;       // "NVIDIA H200"; may be empty
  // "NVIDIA H200 (compute capability 9.0)", "the host (no CUDA device)"
  std::string str() const;
};

// "deepgemm": grouped GEMMs on Hopper tensor cores (TMA + wgmma), bf16 experts or FP8 (e4m3)
// experts with 128 x 128 weight blocks (float32 or UE8M0 scales) and 1 x 128 activation blocks
// quantized at run time. Needs compute capability 9.0, bfloat16 activations, row-major weights
// with [gate; up] concatenated, H and I multiples of 8 (FP8: 16). On Blackwell it names the
// scales DeepGEMM would need there (UE8M0) before saying moex has no Blackwell build.
std::string deepgemm_unsupported(const ExpertsSpec& spec, DType act, const DeviceDescription& d);

// "sonicmoe": the fused forward of gated bf16 / f16 experts on Hopper (gate_up reading the hidden
// rows in place, the gated activation in its epilogue, down, the per-token gather-and-sum).
// Needs compute capability 9.0 (moex builds it for sm_90a), gated experts with silu, gelu or
// relu (SwiGLU, GeGLU, ReGLU: transformers' ACT_MAP), unquantized weights, bfloat16 or float16
// activations, row-major weights with [gate; up] concatenated, H and I multiples of 8.
std::string sonicmoe_unsupported(const ExpertsSpec& spec, DType act, const DeviceDescription& d);

// "deepgemm_megamoe": one Blackwell kernel fusing expert-parallel dispatch, both projections,
// SwiGLU and the combine, over FP4 experts with UE8M0 scales. Every requirement is checked in
// the order a user would fix them (device, weights, scales, expert-parallel group); moex has no
// build of that kernel, so the answer is never empty.
std::string deepgemm_megamoe_unsupported(const ExpertsSpec& spec, DType act,
                                         const DeviceDescription& d, int ep_size);

}  // namespace moex
