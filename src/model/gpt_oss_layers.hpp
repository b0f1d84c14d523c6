// The loading pieces of gpt-oss (transformers 5.17 GptOssForCausalLM) that differ from the shared
// ones, as functions that can be tested alone. Formulas: docs/arch_deepseek_v3_gpt_oss.md.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "model/layers.hpp"
#include "moex/checkpoint.hpp"
#include "moex/experts.hpp"

namespace moex::model {

// The config with GptOssConfig's rope filled in when config.json names none: yarn, factor 32,
// beta 32 / 1, no truncation, original context 4096, and theta 150000 (gpt-oss's default_theta,
// also used when only rope_theta is absent). Feed the result to make_rope.
nlohmann::json gpt_oss_rope_config(const nlohmann::json& config);

// The rest of gpt-oss is ops: its RMSNorm is ops::rms_norm with RmsNormStyle::kGptOss, its router
// ops::topk_softmax, its bf16 eager attention ops::attention with AttentionSpec::eager_rounding.

// The experts module of one layer at `prefix` ("model.layers.L.mlp.experts"): fused tensors
// gate_up_proj [E, H, 2I] (transposed, gate/up columns interleaved), gate_up_proj_bias [E, 2I],
// down_proj [E, I, H], down_proj_bias [E, H], activation kSwigluOai with (limit, alpha).
// Throws Unsupported for MXFP4 checkpoints (`gate_up_proj_blocks`), InvalidInput on shapes.
Experts load_gpt_oss_experts(const Checkpoint& ckpt, const std::string& prefix, int64_t num_experts,
                             int64_t hidden, int64_t intermediate, DType dtype, float limit,
                             float alpha);

// The same experts in the layout the other architectures use: gate_up [E, 2I, H] with the gate
// rows then the up rows, gate_up_bias [E, 2I] in that order, down [E, H, I]. Why: the CUDA tensor-
// core kernels (mma.sync / wgmma, and the decode GEMV) read row-major weights whose gate and up
// halves are separate blocks; in gpt-oss's stored layout every CUDA experts call ran the CUDA-core
// GEMM (about 50 decode tokens/s on the H200 for gpt-oss-20b). A permutation of the values: the
// same function, one copy held. Expects host weights of a float dtype.
Experts gpt_oss_experts_row_major(const Experts& experts);

}  // namespace moex::model
