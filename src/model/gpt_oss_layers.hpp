// The pieces of gpt-oss (transformers 5.17 GptOssForCausalLM) that differ from the shared ops,
// as functions that can be tested alone. Formulas: docs/arch_deepseek_v3_gpt_oss.md.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "model/ops.hpp"
#include "moex/checkpoint.hpp"
#include "moex/experts.hpp"

namespace moex::model {

// The config with GptOssConfig's rope filled in when config.json names none: yarn, factor 32,
// beta 32 / 1, no truncation, original context 4096, and theta 150000 (gpt-oss's default_theta,
// also used when only rope_theta is absent). Feed the result to make_rope.
nlohmann::json gpt_oss_rope_config(const nlohmann::json& config);

// GptOssRMSNorm: y = round_act(w * x * rsqrt(mean(x^2) + eps)), the weight product taken in
// float32 and rounded once (the Llama-style norm of ops.hpp rounds before the product).
// x float32 [rows, dim] (act values); w [dim] of any float dtype. Returns a new tensor.
Tensor gpt_oss_rms_norm(const Tensor& x, const Tensor& w, float eps, DType act);


// GptOssTopKRouter after its linear: logits [rows, E] (act values) -> the k largest (as
// torch.topk picks and orders them, see torch_topk) and softmax over those k values, rounded to act.
Routing gpt_oss_route(const Tensor& logits, int64_t k, DType act);

// gpt-oss runs transformers' eager attention (no sdpa support), whose bf16 numerics differ from
// the float32-score attention of ops.hpp: q.k is rounded to bf16, then the scaled score, then the
// score minus the row maximum (sink included), and the softmax output. For float32 models this is
// ops.hpp's attention(). Same contract as attention() (appends k, v to `kv`).
Tensor gpt_oss_attention(const Tensor& q, const Tensor& k, const Tensor& v, LayerKV& kv,
                         const Step& step, const AttentionSpec& spec, DType act);

// The experts module of one layer at `prefix` ("model.layers.L.mlp.experts"): fused tensors
// gate_up_proj [E, H, 2I] (transposed, gate/up columns interleaved), gate_up_proj_bias [E, 2I],
// down_proj [E, I, H], down_proj_bias [E, H], activation kSwigluOai with (limit, alpha).
// Throws Unsupported for MXFP4 checkpoints (`gate_up_proj_blocks`), InvalidInput on shapes.
Experts load_gpt_oss_experts(const Checkpoint& ckpt, const std::string& prefix, int64_t num_experts,
                             int64_t hidden, int64_t intermediate, DType dtype, float limit,
                             float alpha);

}  // namespace moex::model
