// Causal language models with Mixture-of-Experts layers, loaded from Hugging Face checkpoints.
//
//   auto lm = moex::from_pretrained("path/to/checkpoint", {.experts_implementation = {{"", "eager"}}});
//   moex::Tensor logits = lm->logits(input_ids);                // int64 [B, T] -> float32 [B, T, V]
//   moex::Tensor seq = lm->generate(input_ids, {.max_new_tokens = 12});  // int64 [B, T + N]
//   lm->logits(input_ids, attention_mask);  // prompts of different lengths, left-padded (below)
//
// Experts implementation (the backend that runs the experts of each MoE layer) is a map from a
// sub-config name to a registered backend name, as in transformers:
//   {"": <default>, "text_config": ..., "vision_config": ...}     (one entry per sub-config)
// The "" key is the default for the model AND for every sub-config not named (the documented
// meaning; transformers 5.17 applies it to the top-level entry only). A plain name sets every entry.
// The default, when nothing is given, is "grouped_mm" (what transformers 5.17 reports).
//
// Numerics: float32 models compute in float32. bfloat16 models keep bf16 weights and round every
// activation to bf16 where transformers produces a bf16 tensor, while sums accumulate in float32;
// logits are returned as float32 holding bf16 values.
//
// Errors: InvalidInput (bad checkpoint, token id >= vocab, empty prompt, bad attention mask, bad
// SPEC), UnknownName (unknown model_type, backend or sub-config key; the message lists the valid
// names), Unsupported (a device or backend that cannot serve the model).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "moex/device.hpp"
#include "moex/dtype.hpp"
#include "moex/expert_parallel.hpp"
#include "moex/tensor.hpp"

namespace moex {

class Experts;
namespace model {
struct KVCache;
struct Step;
}  // namespace model

// {"": default backend, "<sub-config>": backend, ...}.
using ExpertsImplementation = std::map<std::string, std::string>;

// Parses a user SPEC: a backend name ("eager" -> {"": "eager"}) or a JSON object of strings
// ({"text_config": "grouped_mm", "": "eager"}). Throws InvalidInput on malformed JSON, a key given
// twice or values that are not strings. Names are checked later, against the model and the registry.
ExpertsImplementation parse_experts_implementation(const std::string& spec);
// JSON text of a map, keys sorted ("{\"\": \"eager\", \"text_config\": \"eager\"}" style, compact).
std::string experts_implementation_json(const ExpertsImplementation& map);

enum class SharedExpertsStream : unsigned char { kAuto, kOn, kOff };

struct LoadOptions {
  // Weight and activation dtype; nullopt = the checkpoint's config "dtype" / "torch_dtype"
  // (float32 when absent). float32 and bfloat16 are supported.
  std::optional<DType> dtype;
  // cpu: everything on the host. cuda[:i]: every weight, the KV cache and every op of the model
  // on that GPU (weights are copied from the memory-mapped files straight to the device).
  Device device = Device::cpu();
  ExpertsImplementation experts_implementation;  // {} = the default everywhere
  // Load progress: called on the loading thread with the bytes of checkpoint tensors read so far
  // and the bytes of all of them, as each weight is read, and once more with done == total when
  // the model is built. Empty = no calls.
  std::function<void(int64_t done, int64_t total)> progress;
  // Block-quantized checkpoints (config quantization_config: FP8 e4m3 / FP4 e2m1 weights with
  // block scales; docs/loading.md): false keeps every quantized weight as stored (1 byte per FP8
  // weight, half a byte per FP4 weight, plus scales) and runs quantized linears and experts;
  // true converts each to `dtype` at load (value x scale in float32, then rounded), after which
  // the model runs exactly as a checkpoint stored in `dtype`. Ignored for other checkpoints.
  bool dequantize = false;
  // CUDA: where a model has shared experts (Qwen2-MoE's shared_expert, DeepSeek's shared_experts),
  // whether they run on a second stream of the GPU beside the router and the routed experts.
  // kAuto: for decode-sized calls (docs/gpu_model.md has the measurement); kOn: every call; kOff:
  // never. The outputs are the same bits either way. Quantized shared experts and the host run
  // them in line.
  SharedExpertsStream shared_experts_stream = SharedExpertsStream::kAuto;
  // Expert parallelism (docs/expert_parallel.md): with a communicator of N ranks, this model
  // loads only its rank's contiguous share of every MoE layer's routed experts (E / N of them;
  // InvalidInput when N does not divide E) and runs them with expert_parallel_forward in
  // `ep_mode`; everything else is replicated. Every rank loads the same checkpoint with the same
  // options and makes the same calls in the same order (its peers wait for it in each MoE layer).
  // Host models take any communicator (make_thread_group's ranks). A CUDA model takes an NCCL
  // rank on its own device (make_nccl_group / make_nccl_rank; InvalidInput for a communicator on
  // another device); in the replicated mode its MoE layers are stream work, captured with the rest
  // of a decode step; the all-to-all mode reads each layer's routing on the host, so its decode
  // steps run without a graph (GenerationStats::graph_note says so). Null: no parallelism.
  Communicator* ep_comm = nullptr;
  ExpertParallelMode ep_mode = ExpertParallelMode::kReplicated;
  // Tensor parallelism of the attention and dense layers (docs/expert_parallel.md): with a
  // communicator of N ranks each rank loads 1 / N of the attention heads and of the dense MLPs'
  // and shared experts' intermediate columns, and the ranks sum their partial outputs after each
  // such block, so every rank holds the whole hidden state. May be the same group as ep_comm.
  // Head or column counts that N does not divide are InvalidInput at load. Null: none.
  Communicator* tp_comm = nullptr;
};

// LoadOptions from the strings a user types ("" = the default): dtype "float32" / "bfloat16"
// (and their aliases), device "cpu" / "cuda" / "cuda:1", experts SPEC as for
// parse_experts_implementation. Throws InvalidInput naming the bad value.
LoadOptions make_load_options(const std::string& dtype, const std::string& device,
                              const std::string& experts_spec);

// Whether generate() runs its decode steps under decode_stage_experts_implementation: kAuto where
// transformers does (on a GPU), kOn on any device, kOff never.
enum class DecodeSwitch : unsigned char { kAuto, kOn, kOff };

struct GenerationOptions {
  int64_t max_new_tokens = 20;
  DecodeSwitch decode_switch = DecodeSwitch::kAuto;
  bool do_sample = false;   // false: greedy (argmax, lowest id on ties)
  float temperature = 1.0f; // sampling only; > 0
  int64_t top_k = 0;        // sampling only; 0 = off
  float top_p = 1.0f;       // sampling only; in (0, 1]; 1 = off
  uint64_t seed = 0;        // sampling only
  // Stop tokens; nullopt = generation_config.json "eos_token_id" (an int or a list), else config.json.
  std::optional<std::vector<int64_t>> eos_token_ids;
  // On a CUDA device, decode steps run as one captured CUDA graph (every layer and the experts
  // backend), replayed once per step; the first decode step runs directly (it warms plans and
  // workspaces) and the capture follows it. A backend whose launches cannot be captured (eager:
  // it reads routing counts on the host) falls back to direct launches, said in
  // GenerationStats::graph_note. Ignored on the host.
  bool cuda_graph = true;
  // Called once per generated position, on the calling thread, as soon as that step's ids are
  // chosen (they are on the host by then on every device, so the call adds no device sync):
  // `ids` holds one id per sequence, a finished sequence repeating its stop token. The first call
  // follows the prefill; there are new_tokens calls in all. Its time counts in the stage's
  // seconds; an exception it throws ends generate() and propagates. Streaming text is built on it.
  std::function<void(std::span<const int64_t> ids)> on_step;
  // Let prompt + max_new_tokens exceed the config's max_position_embeddings (positions past it
  // were never trained; stress tests use them). Off: such a request is an InvalidInput.
  bool allow_beyond_max_positions = false;
};

// Timing of the last generate() call (wall clock, seconds).
struct GenerationStats {
  int64_t batch = 0;
  int64_t prompt_tokens = 0;  // per sequence
  int64_t new_tokens = 0;     // per sequence
  // The prompt's forward and the choice of the first new token (time to first token: on a GPU
  // the choice is what waits for the forward's kernels), then every later step with its choice.
  double prefill_seconds = 0;
  double decode_seconds = 0;
  // One-time experts preparation (weight packing, device workspaces) for the prefill's and the
  // decode stage's backends, done before the prefill clock starts; 0 once everything is cached.
  double prepare_seconds = 0;
  bool graph = false;      // decode steps replayed a captured CUDA graph
  std::string graph_note;  // why not, when a graph was asked for on CUDA and not used
  int64_t graph_replays = 0;           // decode steps run as a replay
  int64_t graph_captures_dropped = 0;  // re-captures after the KV cache grew past its capacity
  bool graph_reused = false;  // the decode graph of an earlier call was replayed (no capture)
  // The experts implementation the decode steps ran: the decode-stage switch's map (GPU:
  // grouped_mm -> batched_mm), or the caller's map when the switch is off, does not apply or its
  // backend cannot serve these experts; decode_switch_note says why in the last case.
  ExpertsImplementation decode_experts_implementation;
  std::string decode_switch_note;
};

// The weights of one module group as held in memory (moex info): one entry per group and storage
// form, e.g. attention's float8_e4m3fn linears and its bfloat16 kv_a_proj_with_mqa apart.
struct WeightGroupInfo {
  std::string group;    // "attention", "dense_mlp", "shared_experts", "routed_experts", "router",
                        // "embeddings", "lm_head"
  std::string storage;  // what the values are held as: "float8_e4m3fn", "fp4_e2m1 (2 per int8)",
                        // or a float dtype name ("bfloat16", "float32", ...)
  std::string block;    // quantized: weight rows x columns per scale ("128x128", "1x32"); else ""
  std::string scale_format;  // quantized: "float32" or "ue8m0"; else ""
  int64_t tensors = 0;  // weights (linears, experts modules) in the entry
  int64_t bytes = 0;    // bytes held: values, packed forms and scales
  // Weight values a prompt's matmuls multiply (out x in per linear, all experts' gate_up and
  // down), whatever they are stored as; scales, biases and second forms of a weight kept for
  // decode (MLA's absorbed kv_b) are not counted.
  int64_t elements = 0;
};

struct ModelInfo {
  std::string model_type;        // config "model_type"
  std::string architecture;      // config "architectures"[0] when present
  DType dtype = DType::kF32;
  Device device = Device::cpu();
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t num_layers = 0;
  // Positions the model was built for (config max_position_embeddings; 0 when absent): logits()
  // and generate() refuse longer sequences.
  int64_t max_position_embeddings = 0;
  std::vector<int64_t> moe_layers;  // indices of layers whose MLP is a MoE block
  int64_t num_experts = 0;          // routed experts per MoE layer
  int64_t experts_per_token = 0;    // k
  int64_t parameter_count = 0;      // elements of every tensor in the checkpoint
  std::vector<std::string> sub_configs;  // e.g. {"text_config", "vision_config"}; {} for plain LMs
  // Load statistics (from_pretrained): bytes of the weights placed on `device` (after dtype
  // conversion; with expert parallelism the rank's share of the routed experts) and the wall time
  // of the whole load, file reads and copies included.
  int64_t weight_bytes = 0;
  double load_seconds = 0;
  // What one step reads and computes, for benchmarks' floors: the experts' share of
  // weight_bytes, the embedding table's (read one row per token; 0 when it is the lm_head too),
  // the bytes the KV cache holds per token of one sequence, and the flops of attention per
  // (query, key) pair summed over the layers (q.k and p.v).
  int64_t experts_weight_bytes = 0;
  int64_t embedding_bytes = 0;
  int64_t kv_bytes_per_token = 0;
  int64_t attention_flops_per_pair = 0;
  // Whether the checkpoint is block-quantized, and what the load made of it: per module group
  // the storage dtype, block and scale format and bytes held (filled by architectures that
  // report their groups; the embeddings, lm_head and routed experts always).
  bool quantized_checkpoint = false;
  bool dequantized = false;
  std::vector<WeightGroupInfo> weight_groups;
  // Checkpoint tensors the load did not use, sorted (as transformers warns of unused weights):
  // e.g. DeepSeek-V3's multi-token-prediction layer past num_hidden_layers, or a bias the
  // config says the model has not. Empty under expert or tensor parallelism, where each rank
  // leaves the others' shares unread by design.
  std::vector<std::string> unused_tensors;
};

namespace detail {
struct KeptDecodeGraph;  // src/model/kept_decode_graph.hpp
}

// A loaded model. Architectures derive from model::DecoderLM (src/model/architecture.hpp).
class CausalLM {
 public:
  virtual ~CausalLM();
  CausalLM(const CausalLM&) = delete;
  CausalLM& operator=(const CausalLM&) = delete;

  const ModelInfo& info() const { return info_; }

  // Run-time backend choice, no reload. Validates every name: UnknownName for an unknown key
  // (lists the valid keys) or backend (lists the registered ones), Unsupported when a backend
  // cannot serve this model's experts (dtype / device). On error nothing changes.
  void set_experts_implementation(const std::string& backend);
  void set_experts_implementation(const ExpertsImplementation& map);
  ExpertsImplementation get_experts_implementation() const { return impl_; }
  // Prepares every experts module for the current map (what generate() does before its clock
  // starts): weight packing, workspaces, and for "auto" the table of its choices (moex/
  // experts_auto.hpp; measured on the device at the first use of a shape).
  void prepare_experts() const { prepare_experts(impl_); }

  // Batches of prompts of different lengths: LEFT padding with an attention mask, as
  // transformers' generate(input_ids, attention_mask=...) with padding_side="left".
  // `attention_mask` is an integer (or bool) tensor of the shape of input_ids holding 0 (padding)
  // and 1 (token); each row must be zeros then ones with at least one 1 (right or interleaved
  // padding is an InvalidInput naming the row). Undefined = every token is real. Padding ids are
  // still ids (any id in [0, vocab); a pad token id is the usual choice). The real tokens of each
  // row compute exactly what that sequence computes alone (rope positions count from its first
  // real token, no query reads a padding key; on the host the logits are bit-identical); outputs
  // keep the padded layout.

  // Full forward over B sequences of T tokens (a fresh cache). int64 [B, T] -> float32
  // [B, T, vocab]. Rows at padding positions are not meaningful (their attention sees no key
  // and gives zeros; transformers' differ). Throws InvalidInput for T == 0, ids outside
  // [0, vocab) or a bad mask.
  Tensor logits(const Tensor& input_ids, const Tensor& attention_mask = Tensor());

  // Greedy or sampled continuation of B prompts (int64 [B, T], T >= 1; left-padded with
  // `attention_mask` as above) -> int64 [B, T + n], the prompts as given (padding included)
  // followed by the new tokens, n <= max_new_tokens (fewer when every sequence has emitted a
  // stop token; finished sequences are padded with their stop token). Decode steps run under
  // decode_stage_experts_implementation (restored afterwards, also when an exception escapes);
  // when a backend of that map cannot serve the experts (Unsupported), decoding keeps the
  // caller's map.
  //   lm->generate(ids, {.max_new_tokens = 12}, mask);   // transformers: generate(ids, attention_mask=mask, ...)
  Tensor generate(const Tensor& input_ids, const GenerationOptions& options = {},
                  const Tensor& attention_mask = Tensor());

  const GenerationStats& last_generation_stats() const { return stats_; }

  // On a CUDA device generate() keeps its captured decode graph, with the KV cache it addresses,
  // for the next call with the same batch size, padding or none, sampling values, stop tokens and
  // decode-stage backends whose prompt + new tokens fit that cache: such a call replays it from
  // its first decode step (no capture; GenerationStats::graph_reused). A call that does not fit
  // replaces it. This frees it (the cache and the graph's memory go back to the allocator).
  void release_decode_graph();

  // Stop tokens from generation_config.json (else config.json); {} when neither names one.
  const std::vector<int64_t>& default_eos_token_ids() const { return eos_; }

 protected:
  CausalLM();  // out of line: KeptDecodeGraph is an incomplete type here
  // For architectures: the backend currently chosen for experts under `key` ("" or a sub-config).
  const std::string& experts_backend(const std::string& key = "") const;
  // Called once by the architecture at load for every experts module it builds, so that a
  // backend change can be validated against every module it affects.
  void register_experts_module(const std::string& key, const Experts* experts);
  // Called last by the architecture's constructor: applies `requested` on top of the defaults.
  void init_experts_implementation(const ExpertsImplementation& requested);
  // Prepares every registered experts module for the backend `map` names for its sub-config; for
  // "auto" also one 1-token call with the model's k, which resolves its table.
  void prepare_experts(const ExpertsImplementation& map) const;

  // Forward of step.ids (B rows of step.tokens ids, row-major) at cache columns step.past..
  // using and extending `cache`. Returns logits [B * step.tokens, V], or [B, V] (the last
  // position of each sequence) when last_only, on the model's device in its activation storage
  // dtype (float32 on the host). Ids are already validated.
  virtual Tensor forward(model::Step& step, model::KVCache& cache, bool last_only) = 0;
  // Called as generate() and logits() finish, their results complete (an expert-parallel GPU
  // model meets its ranks there, see DecoderLM). Throws to fail the call.
  virtual void finish_call() {}
  // Called before each decode step is launched or replayed. Throws to stop the generation.
  virtual void before_step() {}

  ModelInfo info_;
  std::vector<int64_t> eos_;

 private:
  friend class ScopedExpertsImplementation;
  friend std::unique_ptr<CausalLM> from_pretrained(const std::string& dir, const LoadOptions& options);
  ExpertsImplementation resolve(const ExpertsImplementation& requested,
                                const ExpertsImplementation& base) const;
  void validate_ids(const Tensor& input_ids) const;
  // InvalidInput when `positions` exceeds info_.max_position_embeddings (`what` says whose).
  void check_positions(int64_t positions, const std::string& what) const;
  // Error when host float32 `logits` hold a NaN or an infinity (`what` says where).
  void check_finite(const Tensor& logits, const std::string& what) const;
  // Left-padding columns per row from a validated attention mask ({} when undefined or when no
  // row is padded). Throws InvalidInput for a mask that is not left padding of input_ids' shape.
  std::vector<int64_t> left_padding(const Tensor& input_ids, const Tensor& attention_mask) const;

  ExpertsImplementation impl_;
  GenerationStats stats_;
  std::vector<std::pair<std::string, const Experts*>> experts_modules_;
  std::unique_ptr<detail::KeptDecodeGraph> kept_decode_;
};

// Loads config.json + safetensors from `dir` and builds the architecture named by model_type.
// Throws UnknownName "unknown model_type 'x'; supported: ..." and the errors above.
std::unique_ptr<CausalLM> from_pretrained(const std::string& dir, const LoadOptions& options = {});
// model_type values from_pretrained accepts (sorted).
std::vector<std::string> supported_model_types();

// The decode-stage policy, a pure function so that it can be tested and later replaced by a
// measured choice: where the switch applies (`mode` kOn, or kAuto on a CUDA device) every
// "grouped_mm" entry becomes "batched_mm" (small token counts favour batched products on GPUs);
// elsewhere (kAuto on the CPU, kOff) the map is returned unchanged; entries naming other backends
// are never touched.
ExpertsImplementation decode_stage_experts_implementation(const ExpertsImplementation& map,
                                                          Device device,
                                                          DecodeSwitch mode = DecodeSwitch::kAuto);

// Sets a model's map for a scope and restores the previous one on destruction (normal exit or
// exception). The map must be valid (it is applied with set_experts_implementation).
class ScopedExpertsImplementation {
 public:
  ScopedExpertsImplementation(CausalLM& model, const ExpertsImplementation& map);
  ~ScopedExpertsImplementation();
  ScopedExpertsImplementation(const ScopedExpertsImplementation&) = delete;
  ScopedExpertsImplementation& operator=(const ScopedExpertsImplementation&) = delete;

 private:
  CausalLM& model_;
  ExpertsImplementation saved_;
};

}  // namespace moex
