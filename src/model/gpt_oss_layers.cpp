// See gpt_oss_layers.hpp.
#include "model/gpt_oss_layers.hpp"

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

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

namespace {

// A tiled transpose with a row permutation, experts in parallel.
template <class Elem>
void transpose_rows(const Elem* src, Elem* dst, int64_t E, int64_t src_rows, int64_t src_cols,
                    const std::vector<int64_t>& dst_row_of_col) {
  // src [E, src_rows, src_cols] -> dst [E, src_cols, src_rows], column c of src landing on row
  // dst_row_of_col[c] of dst.
  constexpr int64_t kTile = 64;
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t e = 0; e < E; ++e)
    for (int64_t r0 = 0; r0 < src_rows; r0 += kTile) {
      const Elem* s = src + e * src_rows * src_cols;
      Elem* d = dst + e * src_rows * src_cols;
      const int64_t r1 = std::min(src_rows, r0 + kTile);
      for (int64_t c0 = 0; c0 < src_cols; c0 += kTile) {
        const int64_t c1 = std::min(src_cols, c0 + kTile);
        for (int64_t c = c0; c < c1; ++c) {
          Elem* drow = d + dst_row_of_col[size_t(c)] * src_rows;
          for (int64_t r = r0; r < r1; ++r) drow[r] = s[r * src_cols + c];
        }
      }
    }
}

template <class Elem>
void relayout(const ExpertsWeights& w, ExpertsWeights& out, int64_t E, int64_t H, int64_t I) {
  std::vector<int64_t> gate_up_row(static_cast<size_t>(2 * I)), down_row(static_cast<size_t>(H));
  for (int64_t c = 0; c < 2 * I; ++c) gate_up_row[size_t(c)] = c % 2 == 0 ? c / 2 : I + c / 2;
  for (int64_t c = 0; c < H; ++c) down_row[size_t(c)] = c;
  transpose_rows(static_cast<const Elem*>(w.gate_up.raw()), static_cast<Elem*>(out.gate_up.raw()), E, H, 2 * I,
                 gate_up_row);
  transpose_rows(static_cast<const Elem*>(w.down.raw()), static_cast<Elem*>(out.down.raw()), E, I, H, down_row);
  const Elem* b = static_cast<const Elem*>(w.gate_up_bias.raw());
  Elem* ob = static_cast<Elem*>(out.gate_up_bias.raw());
  for (int64_t e = 0; e < E; ++e)
    for (int64_t c = 0; c < 2 * I; ++c) ob[e * 2 * I + gate_up_row[size_t(c)]] = b[e * 2 * I + c];
}

}  // namespace

Experts gpt_oss_experts_row_major(const Experts& experts) {
  const ExpertsSpec& s = experts.spec();
  if (!s.is_transposed || s.is_concatenated || !s.has_bias || s.quant.quantized())
    throw InvalidInput("gpt_oss_experts_row_major: expects gpt-oss's transposed, interleaved experts with biases");
  const ExpertsWeights& w = experts.weights();
  if (!w.gate_up.device().is_cpu())
    throw InvalidInput("gpt_oss_experts_row_major: expects host weights, got " + w.gate_up.device().str());
  const int64_t E = s.num_experts, H = s.hidden, I = s.intermediate;
  const DType dt = w.gate_up.dtype();
  if (w.down.dtype() != dt || w.gate_up_bias.dtype() != dt)
    throw InvalidInput("gpt_oss_experts_row_major: expects one dtype for the weights and the gate_up bias");
  ExpertsWeights out;
  out.gate_up = Tensor::empty({E, 2 * I, H}, dt);
  out.down = Tensor::empty({E, H, I}, dt);
  out.gate_up_bias = Tensor::empty({E, 2 * I}, dt);
  out.down_bias = w.down_bias;
  const Tensor gu = w.gate_up.contiguous(), dn = w.down.contiguous(), gb = w.gate_up_bias.contiguous();
  ExpertsWeights in;
  in.gate_up = gu;
  in.down = dn;
  in.gate_up_bias = gb;
  switch (dtype_size(dt)) {
    case 2: relayout<uint16_t>(in, out, E, H, I); break;
    case 4: relayout<uint32_t>(in, out, E, H, I); break;
    default: throw InvalidInput("gpt_oss_experts_row_major: unsupported dtype " + std::string(dtype_name(dt)));
  }
  ExpertsSpec rs = s;
  rs.is_transposed = false;
  rs.is_concatenated = true;
  return Experts(rs, std::move(out));
}

}  // namespace moex::model
