// See gpt_oss_layers.hpp.
#include "model/gpt_oss_layers.hpp"

#include <utility>

#include "moex/error.hpp"

namespace moex::model {

nlohmann::json gpt_oss_rope_config(const nlohmann::json& config) {
  nlohmann::json c = config;
  // Present = not absent and not null; a present value that is not an object is left for
  // make_rope to report.
  auto is_obj = [&](const char* k) { return c.contains(k) && !c[k].is_null(); };
  if (!is_obj("rope_parameters") && !is_obj("rope_scaling"))
    c["rope_parameters"] = {{"rope_type", "yarn"}, {"factor", 32.0},
                            {"beta_fast", 32.0},   {"beta_slow", 1.0},
                            {"truncate", false},   {"original_max_position_embeddings", 4096}};
  const char* key = is_obj("rope_parameters") ? "rope_parameters" : "rope_scaling";
  if (!c[key].is_object()) return c;
  // A rope_theta of the wrong type counts as present: make_rope reports it.
  auto given = [](const nlohmann::json& j) { return j.contains("rope_theta") && !j["rope_theta"].is_null(); };
  const bool has_theta = given(c[key]) || given(c);
  if (!has_theta) c[key]["rope_theta"] = 150000.0;
  return c;
}

Experts load_gpt_oss_experts(const Checkpoint& ckpt, const std::string& prefix, int64_t num_experts,
                             int64_t hidden, int64_t intermediate, DType dtype, float limit, float alpha) {
  if (ckpt.has(prefix + ".gate_up_proj_blocks") && !ckpt.has(prefix + ".gate_up_proj"))
    throw Unsupported("'" + prefix + ".gate_up_proj_blocks' in " + ckpt.dir() +
                      ": MXFP4 gpt-oss experts are not supported; dequantize the checkpoint to "
                      "bfloat16 first");
  ExpertsSpec spec;
  spec.num_experts = num_experts;
  spec.hidden = hidden;
  spec.intermediate = intermediate;
  spec.has_gate = true;
  spec.has_bias = true;
  spec.is_transposed = true;
  spec.is_concatenated = false;
  spec.act = Activation::kSwigluOai;
  spec.swiglu_limit = limit;
  spec.swiglu_alpha = alpha;
  const int64_t E = num_experts, H = hidden, I = intermediate;
  ExpertsWeights w;
  w.gate_up = ckpt.get(prefix + ".gate_up_proj", {E, H, 2 * I}, dtype);
  w.gate_up_bias = ckpt.get(prefix + ".gate_up_proj_bias", {E, 2 * I}, dtype);
  w.down = ckpt.get(prefix + ".down_proj", {E, I, H}, dtype);
  w.down_bias = ckpt.get(prefix + ".down_proj_bias", {E, H}, dtype);
  return Experts(spec, std::move(w));
}

}  // namespace moex::model
