// The building blocks architectures share: weights loaded from a checkpoint (linears, norm
// vectors, gated MLPs, experts), the rope read from a config, and the few composed layers built
// from them. Every computation is a call into the ops tier (src/ops/ops.hpp); nothing here
// touches activation elements.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "moex/checkpoint.hpp"
#include "moex/expert_shard.hpp"
#include "moex/experts.hpp"
#include "moex/model.hpp"
#include "model/quantized_weights.hpp"
#include "moex/tensor.hpp"
#include "ops/ops.hpp"

namespace moex::model {

using ops::AttentionSpec;
using ops::LayerKV;
using ops::Rope;
using ops::RopeLayout;
using ops::Routing;

// include/moex/model.hpp forward-declares model::Step and model::KVCache (CausalLM::forward takes
// them), so they are types of their own; they are the ops' step and cache.
struct Step : ops::Step {
  Step(int64_t batch, int64_t tokens, int64_t past) : ops::Step(batch, tokens, past) {}
};
struct KVCache : ops::KVCache {
  using ops::KVCache::KVCache;
};

// ---- linear layers ----

struct Linear {
  ops::LinearWeight weight;  // [out, in], prepared for its device (ops::prepare_linear)
  Tensor bias;    // [out] holding `dtype` values (host: float32; CUDA: `dtype`), or undefined
  int64_t out_features() const { return weight.out; }
  int64_t in_features() const { return weight.in; }
};
// Loads `<name>.weight` [out, in] (+ `<name>.bias` [out] when `bias`) converted to `dtype`,
// onto `device`, and prepares it there (ops::prepare_linear: packed on the host, the tensor
// itself on a CUDA device, whose copy replaces the host's). keep_tensor: weight.tensor stays
// defined on the host too (for callers that also read the unpacked weight).
// A weight with a `weight_scale_inv` is block-quantized (quantized_weights.hpp): kept as stored
// (weight.quantized()) unless quant.dequantize; the default QuantLoad (no quantization_config)
// makes such a weight an InvalidInput.
// `tp`: this rank's share only (tensor_parallel.hpp); a row-parallel share (TpSplit::kIn) has a
// bias on rank 0 alone, so that the ranks' sum adds it once.
Linear load_linear(const Checkpoint& ckpt, const std::string& name, int64_t out, int64_t in,
                   DType dtype, bool bias = false, Device device = Device::cpu(),
                   bool keep_tensor = false, const QuantLoad& quant = QuantLoad(), const TpSplit& tp = {});
// ops::linear with the layer's weight and bias.
inline Tensor linear(const Tensor& x, const Linear& l, DType act) {
  return ops::linear(x, l.weight, l.bias, act);
}

// Several linears of the same x (ops::linears): one launch on a device for decode-sized rows.
std::vector<Tensor> linears(const Tensor& x, std::initializer_list<const Linear*> ls, DType act);
// An RMSNorm (weight `norm`, Llama rounding) of h, or of h += *delta, followed by linears of its
// output (ops::norm_linears: one launch on a device for decode-sized rows); *x_out gets the
// norm's output when given.
std::vector<Tensor> norm_linears(Tensor& h, const Tensor* delta, const Tensor& norm, float eps,
                                 std::initializer_list<const Linear*> ls, DType act, Tensor* x_out = nullptr);

// Loads a vector [dim] (norm weights, sinks, biases) onto `device`.
Tensor load_vector(const Checkpoint& ckpt, const std::string& name, int64_t dim, DType dtype,
                   Device device = Device::cpu());

// ---- rotary position embedding ----

// inv_freq and attention scaling from a config's rope parameters ("rope_parameters" in
// transformers 5, or the older "rope_theta" + "rope_scaling"). Types: default, linear, yarn
// (with truncate, mscale / mscale_all_dim); others throw Unsupported. `rotary_dim` = dimensions
// rotated per head (head_dim, or DeepSeek's qk_rope_head_dim); inv_freq is computed in float32
// as torch does. Throws InvalidInput naming the key and `where` (the config file) for a value of
// the wrong type (rope_parameters not an object, rope_theta not a number, rope_type not a string)
// and for values that give NaN or inf (rope_theta, factor, attention_factor <= 0, non-finite).
Rope make_rope(const nlohmann::json& config, int64_t rotary_dim,
               const std::string& where = "config.json");

// ---- attention ----

// Grouped-query attention over `head_dim`-wide heads with the usual 1/sqrt(head_dim) scale.
AttentionSpec gqa_spec(int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t sliding_window = 0);

// ---- MLP and MoE ----

// Dense gated MLP: down(act(gate(x)) * up(x)), the intermediate rounded to act.
struct GatedMlp {
  Linear gate, up, down;
  Activation activation = Activation::kSilu;
};
// Loads `<prefix>.gate_proj`, `.up_proj`, `.down_proj` (no biases). With `tp` (its parts and
// index; the dimension is implied) the rank's share of the intermediate columns: gate / up column
// parallel, down row parallel, so its output is the rank's partial sum.
GatedMlp load_gated_mlp(const Checkpoint& ckpt, const std::string& prefix, int64_t hidden,
                        int64_t intermediate, DType dtype, Activation activation,
                        Device device = Device::cpu(), const QuantLoad& quant = QuantLoad(),
                        const TpSplit& tp = {});
Tensor gated_mlp(const Tensor& x, const GatedMlp& mlp, DType act);
// The rest of gated_mlp once gate(x) and up(x) are computed (e.g. by linears() beside others):
// `gate` is overwritten with the rounded intermediate.
Tensor gated_mlp_rest(Tensor& gate, const Tensor& up, const GatedMlp& mlp, DType act);

// Whether the shared experts of a call on x run on a second stream beside the router and the
// routed experts (LoadOptions::shared_experts_stream): on a GPU, unquantized shared experts only
// (a quantized linear's per-call scratch is not kept for the branch), kAuto for calls of up to
// kSharedExpertsBesideRows rows.
inline constexpr int64_t kSharedExpertsBesideRows = 64;
bool shared_experts_beside(SharedExpertsStream mode, const Tensor& x, const GatedMlp& shared);

// The spec of experts stored as the hub's plain (non-transposed, no bias) gated MLPs.
ExpertsSpec gated_experts_spec(int64_t num_experts, int64_t hidden, int64_t intermediate, Activation act);

// Tensor names of one expert's projections under `<prefix>.<e>.`.
struct ExpertNames {
  std::string gate = "gate_proj", up = "up_proj", down = "down_proj";  // mixtral: w1, w3, w2
  std::string suffix = ".weight";
};
// Shapes, before anything is allocated.
// The tensors a model will load with their expected shapes, checked against the checkpoint's
// headers alone (nothing is read or allocated). Architectures check every tensor whose config
// sizes drive an allocation made before that tensor is loaded (rope tables, per-layer arrays,
// fused experts buffers), so that a wrong config value is reported at once as the tensor that
// disagrees with it, instead of after gigabytes of allocations.
struct ExpectedShapes {
  explicit ExpectedShapes(std::string config_where) : where(std::move(config_where)) {}
  // a * b for a dimension computed from config values: InvalidInput naming `what` on overflow.
  int64_t mul(int64_t a, int64_t b, const char* what) const;
  void add(const std::string& name, Shape shape) { list.emplace_back(name, std::move(shape)); }
  // `<name>.weight` [out, in].
  void add_linear(const std::string& name, int64_t out, int64_t in) { add(name + ".weight", {out, in}); }
  // The experts of one MoE layer as load_experts reads them: fused `<prefix>.gate_up_proj` +
  // `<prefix>.down_proj` when present, else every expert's gate / up / down.
  // fp4_packed: FP4 experts (two values per byte along K: the stored last dimension is halved).
  void add_experts(const Checkpoint& ckpt, const std::string& prefix, int64_t num_experts,
                   int64_t hidden, int64_t intermediate, const ExpertNames& names,
                   bool fp4_packed = false);
  // Throws InvalidInput "tensor 'x' in DIR has shape [..], expected [..] (from DIR/config.json)"
  // or "missing tensor 'x'" for the first disagreement.
  void check(const Checkpoint& ckpt) const;

  std::string where;
  std::vector<std::pair<std::string, Shape>> list;
};

// Builds the experts module of one MoE layer at `prefix` (e.g. "model.layers.3.mlp.experts"):
// either per-expert tensors `<prefix>.<e>.<gate|up|down><suffix>` fused into gate_up [E, 2I, H]
// = [gate; up] and down [E, H, I] (hub layout), or already-fused `<prefix>.gate_up_proj`
// [E, 2I, H] + `<prefix>.down_proj` [E, H, I] when those exist. spec.num_experts / hidden /
// intermediate / act must be set; weights are converted to `dtype`. Layouts with biases,
// transposition or interleaving (gpt-oss) are built by the architecture itself.
// `device`: where the experts weights live. On the host the hub's per-expert tensors are kept
// as they are (ExpertsWeights' per-expert form: views into the memory map), so packing backends
// read them in place and no fused copy exists unless a backend that needs one is used. On a
// CUDA device they are copied straight into their slices of the fused device tensors (no fused
// host copy).
// Block-quantized experts (each expert's weights with a `weight_scale_inv`): with
// quant.dequantize they are dequantized to `dtype` and held as above; otherwise they stay as
// stored, fused as include/moex/quant.hpp lays them out (FP8: gate_up [E, 2I, H] float8_e4m3fn,
// gate_up_scale [E, 2 ceil(I/128), ceil(H/128)] with gate's scale rows then up's, down [E, H, I],
// down_scale [E, ceil(H/128), ceil(I/128)]; FP4: int8 [E, 2I, H/2] / [E, H, I/2] with UE8M0
// scales [E, 2I, H/32] / [E, H, I/32]) and the spec's `quant` set.
// With `shard` (expert parallelism) only the shard's experts are read: the result holds
// shard->count experts, global ids [first, first + count), and the other experts' tensors are
// never touched (a rank's memory holds its share).
Experts load_experts(const Checkpoint& ckpt, const std::string& prefix, const ExpertsSpec& spec,
                     DType dtype, const ExpertNames& names = {}, Device device = Device::cpu(),
                     const QuantLoad& quant = QuantLoad(), const ExpertShard* shard = nullptr);
// The same experts with their weights copied to `device` (unchanged when already there or when
// `device` is the host).
Experts experts_to(const Experts& experts, Device device);
// Calls the experts through `backend`: x [rows, H] is handed over in `act` (bf16 models pass
// bf16 activations), the result comes back in x's storage dtype (values in act). x, the routing
// and the experts weights live on the same device (the model's).
Tensor run_experts(const Experts& experts, const std::string& backend, const Tensor& x,
                   const Routing& routing, DType act);

}  // namespace moex::model
