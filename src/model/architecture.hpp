// How an architecture plugs into moex.
//
// An architecture is a factory `make_<model_type>(checkpoint, options)` returning a CausalLM,
// listed in ONE table (src/model/architectures.cpp). Decoder-only MoE models derive from
// DecoderLM below, which owns what every such model shares: the config fields, token embedding,
// final norm, lm_head (tied or not), the layer loop, the KV cache plumbing, logits/generate and
// the experts-implementation map. The architecture implements only `layer_forward` (one decoder
// layer, residuals included) by calling the ops tier (src/ops/ops.hpp) and the blocks of
// layers.hpp, and builds its layers in its constructor:
//
//   class MyLM final : public DecoderLM {
//    public:
//     MyLM(const Checkpoint& ckpt, const LoadOptions& o) : DecoderLM(ckpt, o, ckpt.config()) {
//       for (int64_t l = 0; l < cfg().num_layers; ++l) { ... load with load_linear etc. ...
//         experts_.push_back(load_experts(ckpt, prefix() + "layers.N.mlp.experts", spec, act()));
//         info_.moe_layers.push_back(l); }
//       finish_experts(experts_, "", E, k, o.experts_implementation);  // last
//     }
//    protected:
//     void layer_forward(int64_t l, Tensor& h, const Step& s, LayerKV& kv) override {
//       ... experts output = run_experts(experts_[i], experts_backend(), x, routing, act()); ...
//     }
//   };
//   std::unique_ptr<CausalLM> make_my(const Checkpoint& c, const LoadOptions& o) {
//     return std::make_unique<MyLM>(c, o); }
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/layers.hpp"
#include "model/tensor_parallel.hpp"
#include "moex/checkpoint.hpp"
#include "moex/model.hpp"

namespace moex::model {

// Fields every decoder config has, read from config.json or its text_config. Missing required
// keys throw InvalidInput naming the key and the file.
struct DecoderConfig {
  nlohmann::json json;  // the (sub-)config object the fields were read from
  std::string where;    // "DIR/config.json" or "DIR/config.json:text_config", for messages
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;   // num_key_value_heads, default num_heads
  int64_t head_dim = 0;       // head_dim when present and not null, else hidden / heads
  double rms_norm_eps = 1e-6;  // >= 0
  bool tie_word_embeddings = false;
  int64_t max_positions = 0;  // max_position_embeddings; 0 when absent (no limit)

  // Typed getters over `json` (InvalidInput naming the key when missing / wrong type; the
  // defaulted forms also accept an explicit null as "absent").
  int64_t get_int(const std::string& key) const;
  int64_t get_int(const std::string& key, int64_t dflt) const;
  double get_double(const std::string& key) const;
  double get_double(const std::string& key, double dflt) const;
  bool get_bool(const std::string& key, bool dflt) const;
  std::string get_string(const std::string& key, const std::string& dflt) const;
  bool has(const std::string& key) const;  // present and not null
};
DecoderConfig parse_decoder_config(const nlohmann::json& j, const std::string& where);
// A boolean key of any config object (false when absent or null; InvalidInput for another type).
bool parse_decoder_flag(const nlohmann::json& j, const std::string& key, const std::string& where);

// Base of decoder-only LMs: embedding -> layer_forward for each layer -> final norm -> lm_head.
class DecoderLM : public CausalLM {
 protected:
  // Reads the common fields from `text_config` (the config object of the language model), loads
  // `<weights_prefix>embed_tokens.weight`, `<weights_prefix>norm.weight` and `lm_head.weight`
  // (tied to the embedding when tie_word_embeddings and absent), fills info_ (model_type,
  // dtype, device, sizes, parameter count) and the stop tokens. options.dtype is always set.
  DecoderLM(const Checkpoint& ckpt, const LoadOptions& options, const nlohmann::json& text_config,
            std::string weights_prefix = "model.");

  // One decoder layer on h [step.rows(), hidden] (float32 holding act values), in place,
  // residual connections included. `kv` is this layer's cache (the layer appends its keys and values).
  virtual void layer_forward(int64_t layer, Tensor& h, const Step& step, LayerKV& kv) = 0;

  // The last step of an MoE architecture's constructor, once `modules` (a container of Experts
  // whose addresses stay valid) is final: registers each under `key` (the sub-config governing
  // it, "" for the model), records E and k in info_, and applies the requested map.
  template <class Modules>
  void finish_experts(const Modules& modules, const std::string& key, int64_t num_experts,
                      int64_t top_k, const ExpertsImplementation& requested) {
    for (const Experts& e : modules) {
      register_experts_module(key, &e);
      info_.experts_weight_bytes += e.stored_weights().nbytes();
      record_experts("routed_experts", e);
    }
    info_.num_experts = num_experts;
    info_.experts_per_token = top_k;
    init_experts_implementation(requested);
  }

  // Per layer: whether it is a sliding-window layer by config "layer_types" ("sliding_attention"
  // / "full_attention", one per layer; InvalidInput otherwise), or by `fallback` (layer index ->
  // sliding) when the key is absent.
  std::vector<bool> sliding_layers(bool (*fallback)(int64_t layer)) const;

  // For ModelInfo: per layer, `kv_width` cached values per token (keys + values of every kv
  // head) and `pair_flops` flops per (query, key) pair (2 * heads * (head_dim_k + head_dim_v)).
  void set_attention_cost(int64_t kv_width, int64_t pair_flops) {
    const int64_t es = info_.device.is_cuda() ? int64_t(dtype_size(info_.dtype)) : 4;
    info_.kv_bytes_per_token = cfg_.num_layers * kv_width * es;
    info_.attention_flops_per_pair = cfg_.num_layers * pair_flops;
  }

  // ModelInfo::weight_groups: adds a weight of module group `group` (attention, dense_mlp,
  // shared_experts, router, ...) as held in memory. The constructor records the embeddings and
  // the lm_head, finish_experts the routed experts; architectures record the rest.
  void record_weights(const std::string& group, const ops::LinearWeight& w);
  // second_form: a copy of a weight already recorded, in another form (its bytes count, its
  // values not again: WeightGroupInfo::elements).
  void record_weights(const std::string& group, const Tensor& t, bool second_form = false);
  void record_experts(const std::string& group, const Experts& e);
  void record_weights(const std::string& group, std::initializer_list<const Linear*> ls) {
    for (const Linear* l : ls) record_weights(group, l->weight);
  }
  void record_mlp(const std::string& group, const GatedMlp& m) {
    record_weights(group, {&m.gate, &m.up, &m.down});
  }
  // How this checkpoint's quantized weights load (quantized_weights.hpp); pass it to the loaders.
  const QuantLoad& quant() const { return quant_; }

  // Expert parallelism (LoadOptions::ep_comm): the share of a layer's E routed experts this model
  // holds (all of them without a communicator). Pass it to load_experts.
  ExpertShard expert_shard(int64_t num_experts) const;
  // The experts of an MoE layer on x with the router's choice: the experts call of layers.hpp, or
  // with a communicator expert_parallel_forward over the ranks (each holding expert_shard(E)).
  // Architectures call it unqualified, so this member is the one they reach.
  Tensor run_experts(const Experts& experts, const std::string& backend, const Tensor& x,
                     const Routing& routing, DType act) const;

  // Tensor parallelism (LoadOptions::tp_comm): the rank's share for the loaders (parts = 1
  // without a communicator; pick the dimension with TpSplit::along), and the sum of the ranks'
  // partial outputs of a row-parallel block, in place (every rank gets the same bits, rounded to
  // act once; nothing without tensor parallelism). On a GPU the sum is stream work (captured with
  // a decode step); each new shape is first summed with the ranks' agreement checked.
  TpSplit tp() const;
  void tp_reduce_(Tensor& partial) const;

  const DecoderConfig& cfg() const { return cfg_; }
  DType act() const { return info_.dtype; }
  const std::string& prefix() const { return prefix_; }  // "model." or "model.language_model."

  Tensor forward(Step& step, KVCache& cache, bool last_only) final;
  // An expert-parallel GPU model's MoE layers are collectives no host call waits for (a replayed
  // decode graph runs them): one barrier per generate / logits makes a rank whose group was
  // aborted meanwhile fail the call instead of returning what the aborted collectives left.
  void finish_call() override;
  // ... and before each decode step its group must still stand: a replay on an aborted NCCL
  // communicator would run collectives on freed resources.
  void before_step() override;

 private:
  void record_group(WeightGroupInfo entry);

  DecoderConfig cfg_;
  QuantLoad quant_;
  Communicator* ep_comm_ = nullptr;
  Communicator* tp_comm_ = nullptr;
  // The distinct groups (ep and tp may be one), for the per-call barrier and abort checks.
  std::vector<Communicator*> groups() const {
    std::vector<Communicator*> g;
    for (Communicator* c : {ep_comm_, tp_comm_})
      if (c && (g.empty() || g.front() != c)) g.push_back(c);
    return g;
  }
  mutable std::vector<int64_t> tp_checked_shape_;  // the last partial-sum shape checked (GPU)
  ExpertParallelMode ep_mode_ = ExpertParallelMode::kReplicated;
  mutable std::vector<int64_t> ep_checked_shape_;  // the last call shape the ranks agreed on (GPU)
  std::string prefix_;
  Tensor embed_, final_norm_;
  ops::LinearWeight lm_head_;  // prepared once (packed on the host)
};

// Device / dtype checks shared by the factories: float32 or bfloat16 on the CPU or CUDA (where only
// the experts run on the GPU; an absent device is Unsupported).
void check_model_target(const LoadOptions& options);

// ---- the architecture table ----

using ArchitectureFactory = std::unique_ptr<CausalLM> (*)(const Checkpoint&, const LoadOptions&);
struct ArchitectureEntry {
  const char* model_type;
  ArchitectureFactory make;
};
const std::vector<ArchitectureEntry>& architectures();  // src/model/architectures.cpp

std::unique_ptr<CausalLM> make_qwen2_moe(const Checkpoint&, const LoadOptions&);
std::unique_ptr<CausalLM> make_qwen3_moe(const Checkpoint&, const LoadOptions&);
std::unique_ptr<CausalLM> make_mixtral(const Checkpoint&, const LoadOptions&);
std::unique_ptr<CausalLM> make_olmoe(const Checkpoint&, const LoadOptions&);
std::unique_ptr<CausalLM> make_qwen3_vl_moe(const Checkpoint&, const LoadOptions&);
std::unique_ptr<CausalLM> make_deepseek_v3(const Checkpoint&, const LoadOptions&);
std::unique_ptr<CausalLM> make_gpt_oss(const Checkpoint&, const LoadOptions&);    

}  // namespace moex::model
