// The host ops every architecture is built from.
//
// Activations are contiguous float32 host tensors [rows, dim], rows = B sequences x T new tokens,
// sequence-major (row = b * T + t). `act` is the model's activation dtype: every op rounds its
// outputs to `act` (a no-op for float32) at the points where transformers produces a tensor of
// that dtype, so that a bf16 model tracks transformers' bf16 numerics while all sums accumulate
// in float32. Weights are host tensors of any float dtype ([out, in] for linears), read in place.
// Inputs are assumed valid (checked at load / at the model API); these functions do not throw
// for shape errors beyond what Tensor itself checks.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "moex/checkpoint.hpp"
#include "moex/experts.hpp"
#include "moex/tensor.hpp"

namespace moex::model {

// ---- positions and cache ----

// One forward call: `batch` sequences, each with `tokens` new tokens at positions past.. past+tokens-1.
struct Step {
  int64_t batch = 1;
  int64_t tokens = 1;
  int64_t past = 0;  // tokens already in the cache (same for every sequence: no padding)
  int64_t rows() const { return batch * tokens; }
  int64_t position(int64_t row) const { return past + row % tokens; }
};

// Keys and values of one layer, per sequence, appended row by row (row = one position, all kv
// heads: k_dim = kv_heads * head_dim_k floats, v_dim likewise). Values are stored as float32
// holding `act`-rounded numbers.
struct LayerKV {
  int64_t k_dim = 0, v_dim = 0;
  std::vector<std::vector<float>> k, v;  // [batch][positions * dim]
  int64_t length() const { return k.empty() || k_dim == 0 ? 0 : int64_t(k[0].size()) / k_dim; }
};

struct KVCache {
  KVCache(int64_t batch, int64_t layers);
  int64_t batch;
  std::vector<LayerKV> layers;
  int64_t length() const;  // positions cached (layer 0)
};

// ---- element-wise and small ops ----

// Rounds in place to `act` (no-op for float32).
void round_to(Tensor& x, DType act);
inline float round_act(float v, DType act) { return act == DType::kBF16 ? round_bf16(v) : v; }

// Host float32 [rows, dim] tensor, uninitialised / zeroed.
Tensor new_act(int64_t rows, int64_t dim);
Tensor zeros_act(int64_t rows, int64_t dim);

// a += b (rounded to act), same shapes: the residual connection.
void add_inplace(Tensor& a, const Tensor& b, DType act);
float silu(float x);
float sigmoid(float x);

// Embedding lookup: rows of `table` [V, H] (any float dtype) -> float32 [ids.size(), H].
Tensor embedding(const Tensor& table, const std::vector<int64_t>& ids);

// ---- linear layers ----

struct Linear {
  Tensor weight;  // [out, in], any float dtype
  Tensor bias;    // [out] or undefined
  int64_t out_features() const { return weight.size(0); }
  int64_t in_features() const { return weight.size(1); }
};
// Loads `<name>.weight` [out, in] (+ `<name>.bias` [out] when `bias`) converted to `dtype`.
Linear load_linear(const Checkpoint& ckpt, const std::string& name, int64_t out, int64_t in,
                   DType dtype, bool bias = false);
// y = x W^T + b: float32 accumulation, rounded once to act. x [rows, in] -> [rows, out].
Tensor linear(const Tensor& x, const Linear& l, DType act);

// ---- normalisation ----

// Loads a norm weight [dim].
Tensor load_vector(const Checkpoint& ckpt, const std::string& name, int64_t dim, DType dtype);
// RMSNorm as transformers' LlamaRMSNorm family: y = w * round(x * rsqrt(mean(x^2) + eps)),
// statistics in float32, applied independently to each `dim`-wide group of every row (dim ==
// row width for a plain norm; dim = head_dim for per-head q/k norms). Returns a new tensor.
Tensor rms_norm(const Tensor& x, const Tensor& weight, float eps, DType act, int64_t dim = 0);
void rms_norm_inplace(Tensor& x, const Tensor& weight, float eps, DType act, int64_t dim = 0);

// ---- rotary position embedding ----

enum class RopeLayout : unsigned char {
  kHalf,         // rotate_half: pairs (x[i], x[i + d/2]) (Llama, Qwen, Mixtral, OLMoE, gpt-oss)
  kInterleaved,  // DeepSeek rope_interleave: pairs (x[2i], x[2i+1]); the output is written in
                 // rotate_half order (x[2i] -> slot i, x[2i+1] -> slot i + d/2), exactly as
                 // transformers' apply_rotary_pos_emb_interleave does.
};

// inv_freq and attention scaling from a config's rope parameters ("rope_parameters" in
// transformers 5, or the older "rope_theta" + "rope_scaling"). Types: default, linear, yarn
// (with truncate, mscale / mscale_all_dim); others throw Unsupported.
struct Rope {
  int64_t rotary_dim = 0;
  std::vector<double> inv_freq;    // rotary_dim / 2 entries
  double attention_scaling = 1.0;  // multiplies cos and sin (yarn)
  // cos/sin for one position, rounded to act as transformers casts them: out[rotary_dim/2] each.
  void cos_sin(int64_t position, DType act, float* cos_out, float* sin_out) const;
};
// `config` is the (text) config object; `rotary_dim` = dimensions rotated per head (head_dim, or
// DeepSeek's qk_rope_head_dim); inv_freq is computed in float32 as torch does.
Rope make_rope(const nlohmann::json& config, int64_t rotary_dim);

// Rotates dims [offset, offset + rope.rotary_dim) of each head's head_stride-wide slice of
// x [rows, heads * head_stride] in place, at the positions given by `step`.
// `offset` lets DeepSeek rotate the trailing rope part of each head (offset = qk_nope_head_dim).
void apply_rope(Tensor& x, int64_t heads, int64_t head_stride, int64_t offset, const Rope& rope,
                RopeLayout layout, const Step& step, DType act);

// ---- attention ----

struct AttentionSpec {
  int64_t heads = 0;       // query heads
  int64_t kv_heads = 0;    // key/value heads (GQA: heads % kv_heads == 0)
  int64_t head_dim_k = 0;  // q and k per-head width
  int64_t head_dim_v = 0;  // v and output per-head width
  float scale = 0.0f;      // softmax scale (usually 1/sqrt(head_dim_k))
  int64_t sliding_window = 0;     // > 0: query at p sees keys at q with p - q < sliding_window
  const Tensor* sinks = nullptr;  // [heads] per-head sink logits (gpt-oss), or null
};

// Appends k [rows, kv_heads*head_dim_k] and v [rows, kv_heads*head_dim_v] to each sequence's
// cache in `kv` (one row per position); attention() starts with it, variants reuse it.
void append_kv(const Tensor& k, const Tensor& v, LayerKV& kv, const Step& step,
               const AttentionSpec& spec);
// Appends k [rows, kv_heads*head_dim_k] and v [rows, kv_heads*head_dim_v] to `kv`, then runs
// causal attention of q [rows, heads*head_dim_k] over everything cached for each sequence.
// Scores and softmax in float32 (sinks join the softmax denominator and are then dropped);
// output [rows, heads*head_dim_v] rounded to act.
Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, LayerKV& kv, const Step& step,
                 const AttentionSpec& spec, DType act);

// ---- MLP and MoE ----

// Dense gated MLP: down(act(gate(x)) * up(x)), the intermediate rounded to act.
struct GatedMlp {
  Linear gate, up, down;
  Activation activation = Activation::kSilu;
};
// Loads `<prefix>.gate_proj`, `.up_proj`, `.down_proj` (no biases).
GatedMlp load_gated_mlp(const Checkpoint& ckpt, const std::string& prefix, int64_t hidden,
                        int64_t intermediate, DType dtype, Activation activation);
Tensor gated_mlp(const Tensor& x, const GatedMlp& mlp, DType act);

// Routing result passed to the experts: top_k_index int64 [rows, k], top_k_weights float32
// [rows, k] (values rounded to act, as transformers casts routing weights to the hidden dtype).
struct Routing {
  Tensor top_k_index;
  Tensor top_k_weights;
};
// Softmax router (Mixtral / Qwen-MoE / OLMoE): probs = softmax(logits) in float32, top-k (largest
// first, ties as torch.topk on CPU), optionally renormalised to sum 1 (norm_topk_prob), rounded to act.
Routing softmax_topk(const Tensor& router_logits, int64_t k, bool norm_topk_prob, DType act);
// torch.topk(largest=True) exactly as torch's CPU kernel picks it, ties included: (value, index)
// pairs in index order, std::partial_sort when k * 64 <= n, else std::nth_element at k - 1 (then
// std::sort of the first k - 1 when `sorted`), comparing values only (NaN counts as largest).
// Routers need this: bf16 router logits tie often (gpt-oss fixture, layer 0, token 6), and the
// chosen expert then decides the output. Every router uses it (softmax_topk, gpt-oss, DeepSeek).
void torch_topk(const float* values, int64_t n, int64_t k, bool sorted, int64_t* idx_out,
                float* val_out);
// torch.topk(scores, k) of one row (sorted, as the softmax routers call it): values and indices.
void topk_rows(const float* scores, int64_t n, int64_t k, int64_t* idx_out, float* val_out);

// Tensor names of one expert's projections under `<prefix>.<e>.`.
struct ExpertNames {
  std::string gate = "gate_proj", up = "up_proj", down = "down_proj";  // mixtral: w1, w3, w2
  std::string suffix = ".weight";
};
// Builds the experts module of one MoE layer at `prefix` (e.g. "model.layers.3.mlp.experts"):
// either per-expert tensors `<prefix>.<e>.<gate|up|down><suffix>` fused into gate_up [E, 2I, H]
// = [gate; up] and down [E, H, I] (hub layout), or already-fused `<prefix>.gate_up_proj`
// [E, 2I, H] + `<prefix>.down_proj` [E, H, I] when those exist. spec.num_experts / hidden /
// intermediate / act must be set; weights are converted to `dtype`. Layouts with biases,
// transposition or interleaving (gpt-oss) are built by the architecture itself.
// `device`: where the experts weights live (CUDA: the experts run there, see run_experts).
Experts load_experts(const Checkpoint& ckpt, const std::string& prefix, const ExpertsSpec& spec,
                     DType dtype, const ExpertNames& names = {}, Device device = Device::cpu());
// The same experts with their weights copied to `device` (unchanged when already there or when
// `device` is host-accessible: the fake GPU of the tests computes on host tensors).
Experts experts_to(const Experts& experts, Device device);
// Calls the experts through `backend`: x float32 [rows, H] is handed over in `act` (bf16 models
// pass bf16 activations), the result comes back as float32 [rows, H] (values in act). When the
// experts weights live on a CUDA device, hidden and routing are copied there and the result back
// (the rest of the model runs on the host).
Tensor run_experts(const Experts& experts, const std::string& backend, const Tensor& x,
                   const Routing& routing, DType act);

// ---- output head ----

// logits [rows, V] float32 = round_act(x W^T) for W = lm_head [V, H].
Tensor lm_head(const Tensor& x, const Tensor& weight, DType act);

}  // namespace moex::model
