// The experts call and the ExpertsInterface (backend registry).
//
// A MoE layer routes each token to k experts and then calls ONE experts function:
//
//   out[t] = sum_{j < k, id = top_k_index[t, j] < E}  w(t, j) * expert_id(hidden[t])
//   expert_e(x) = down_e( act( gate_up_e(x) ) )            (+ biases when has_bias)
//
// where w(t, j) = top_k_weights[t, j] when top_k_weights is [T, k], or top_k_weights[t, id] when
// it is [T, E] (DeepSeek-V2 style). Ids >= E are expert-parallel sentinels (the expert lives on
// another rank) and contribute nothing; a token may list the same expert twice (both count);
// T may be 0. Negative ids are invalid input.
//
// Which function runs is a run-time choice among registered backends (see ExpertsBackend).
// Every backend computes the same function; they differ in how the matrix products run.
// Numerics contract shared by all backends: products accumulate in float32; the activated
// intermediate is rounded to the activation dtype before the down projection (as transformers
// does, and as tensor-core / AMX kernels must); the k contributions of a token are summed in
// float32 in slot order j = 0..k-1 and rounded once. So the result does not depend on threading
// or on how tokens were grouped.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "moex/context.hpp"
#include "moex/device.hpp"
#include "moex/dtype.hpp"
#include "moex/tensor.hpp"

namespace moex {

enum class Activation : unsigned char {
  kSilu,       // x * sigmoid(x)
  kGelu,       // exact erf GELU
  kGeluTanh,   // tanh approximation ("gelu_pytorch_tanh", "gelu_new")
  kRelu,
  kSwigluOai,  // gpt-oss: g = min(g, limit); u = clamp(u, -limit, limit); (u + 1) * g * sigmoid(alpha g)
};
// Maps a Hugging Face `hidden_act` string ("silu", "swish", "gelu", "gelu_pytorch_tanh",
// "gelu_new", "relu"); throws InvalidInput naming the unknown string.
Activation parse_activation(std::string_view hf_name);
std::string_view activation_name(Activation a);

// Quantized expert weights (FP8 e4m3 / FP4 e2m1 values + block scales). The math (what a stored
// value and scale mean, the fused scale rows, the dynamic 1 x 128 activation quantizer) is defined
// once in moex/quant.hpp; this is the contract of the experts tensors (E experts, H hidden,
// I intermediate, R = gate_up_rows()):
//   FP8 (kind kFp8E4M3, block_n = block_k = 128, scale_dtype kF32 or kF8E8M0):
//     gate_up       kF8E4M3 [E, R, H]      down       kF8E4M3 [E, H, I]
//     gate_up_scale scale_dtype [E, (has_gate ? 2 : 1) * ceil(I/128), ceil(H/128)]
//     down_scale    scale_dtype [E, ceil(H/128), ceil(I/128)]
//     (a gated gate_up keeps gate's and up's scale rows apart: quant::fused_scale_row.)
//   FP4 (kind kFp4E2M1, block_n = 1, block_k = 32, scale_dtype kF8E8M0; H and I multiples of 32):
//     gate_up       kI8 [E, R, H/2]        down       kI8 [E, H, I/2]   (two e2m1 per byte, low
//     gate_up_scale kF8E8M0 [E, R, H/32]   down_scale kF8E8M0 [E, H, I/32]  nibble = even column)
// Quantized specs have no biases, are not transposed and are concatenated ([gate; up]): the
// layouts DeepSeek-style checkpoints ship; anything else is InvalidInput. Weights are held fused
// (not per expert). The activations (hidden, out) are float32, bfloat16 or float16, as for
// unquantized experts, and need not match the weights' storage dtype (ExpertsWeights::dtype() is
// then kF8E4M3 / kI8). Numerics: each hidden row is quantized per 128-wide block (quant.hpp), the
// products accumulate in float32 per block with activation scale x weight scale applied per block;
// the activated intermediate is rounded to the activation dtype, then quantized the same way
// before the down projection. CPU backends accept these weights; others say they do not
// (BackendCaps::quantized_weights).
struct QuantScheme {
  enum class Kind : unsigned char { kNone, kFp8E4M3, kFp4E2M1 } kind = Kind::kNone;
  DType scale_dtype = DType::kF32;  // kF32 or kF8E8M0 (UE8M0, power-of-two)
  int64_t block_n = 128;            // rows of W per scale (FP4: 1)
  int64_t block_k = 128;            // columns of W per scale (FP4: 32)
  // Where the activations' scales come from: computed per row and 128-wide K block at run time
  // ("dynamic", what every moex backend does), or fixed in the checkpoint ("static"). The loader
  // refuses static checkpoints; a hand-built spec that says static is refused by every backend
  // (ExpertsBackend::unsupported_reason) instead of being run with dynamic scales.
  enum class Activations : unsigned char { kDynamic, kStatic } activations = Activations::kDynamic;
  bool quantized() const { return kind != Kind::kNone; }
};

struct ExpertsSpec {
  int64_t num_experts = 0;   // E: experts held locally; ids >= E are sentinels
  int64_t hidden = 0;        // H
  int64_t intermediate = 0;  // I
  bool has_gate = true;          // gate_up holds [gate; up] (2I rows) or only up (I rows)
  bool has_bias = false;         // gate_up_bias [E, 2I or I], down_bias [E, H]
  bool is_transposed = false;    // gate_up [E, H, 2I], down [E, I, H] instead of [E, 2I, H], [E, H, I]
  bool is_concatenated = true;   // [gate; up] halves, or interleaved rows g0, u0, g1, u1, ...
  Activation act = Activation::kSilu;
  float swiglu_limit = 7.0f;     // kSwigluOai only
  float swiglu_alpha = 1.702f;   // kSwigluOai only
  QuantScheme quant;

  int64_t gate_up_rows() const { return has_gate ? 2 * intermediate : intermediate; }
  Shape gate_up_shape() const;  // as stored, honouring is_transposed
  Shape down_shape() const;
  std::string str() const;      // one line for error messages and logs
};

// The hub's own layout of plain gated experts: one tensor per expert and projection, typically
// views into a checkpoint's memory map. Why it exists: fusing them into gate_up / down copies
// every expert weight into anonymous memory, and a backend that packs the weights (the CPU
// grouped_mm) then holds a second copy; packing straight from these views keeps one copy in
// memory (the packed one; the mapped pages are given back after packing).
struct PerExpertWeights {
  std::vector<Tensor> gate;  // E tensors [I, H]: rows 0 .. I-1 of gate_up[e]
  std::vector<Tensor> up;    // E tensors [I, H]: rows I .. 2I-1 of gate_up[e]
  std::vector<Tensor> down;  // E tensors [H, I]: down[e]
};

// The weights of E experts, in one of two forms:
// - fused: gate_up / down (every backend reads these);
// - per expert: `per_expert` set and gate_up / down undefined, for specs that are gated,
//   concatenated, not transposed, without biases and not quantized (the hub's per-expert
//   checkpoints). Only backends whose caps() say reads_per_expert receive this form; an Experts
//   module hands every other backend fused tensors, built from the per-expert ones once, at that
//   backend's first use (fuse_experts_weights).
// Both may be set (then they hold the same values).
struct ExpertsWeights {
  Tensor gate_up;       // [E, R, H] or transposed [E, H, R], R = spec.gate_up_rows()
  Tensor down;          // [E, H, I] or transposed [E, I, H]
  Tensor gate_up_bias;  // [E, R] when spec.has_bias (same row order as gate_up)
  Tensor down_bias;     // [E, H] when spec.has_bias
  Tensor gate_up_scale; // quantized only: block scales (shapes in the QuantScheme contract)
  Tensor down_scale;
  std::shared_ptr<const PerExpertWeights> per_expert;  // shared: copies of the weights share it

  bool fused() const { return gate_up.defined(); }
  // Of gate_up, or of the per-expert tensors when not fused (kF32 / cpu when neither is set).
  DType dtype() const;
  Device device() const;
  // Bytes of every tensor held (both forms when both are set).
  int64_t nbytes() const;
};

// Throws InvalidInput naming the tensor, expected and actual shape / dtype / device; for the
// per-expert form also when the spec is not one it can hold, or a tensor is missing.
void validate_experts_weights(const ExpertsSpec& spec, const ExpertsWeights& w);
// The call's inputs against the spec, as every entry point takes them (backends through
// Experts::forward, the float64 references): hidden [T, H] float; top_k_index [T, k] int64 /
// int32; top_k_weights [T, k] or [T, E] float. Throws InvalidInput naming the tensor. Devices and
// the hidden dtype against the weights are the caller's to check (the references take any).
void validate_experts_inputs(const ExpertsSpec& spec, const Tensor& hidden, const Tensor& top_k_index,
                             const Tensor& top_k_weights);

// The fused form of `w`: `w` itself when fused, else gate_up [E, 2I, H] = [gate_e; up_e] and
// down [E, H, I] copied from the per-expert tensors into new memory on their device (the result
// also keeps `per_expert`). Expects validated weights.
ExpertsWeights fuse_experts_weights(const ExpertsSpec& spec, const ExpertsWeights& w);

// What a backend computes on, after validation: hidden is contiguous [T, H]; top_k_index is
// contiguous int32 or int64 [T, k] with ids in [0, inf) (>= E are sentinels); top_k_weights is
// contiguous [T, k] or [T, E] (weights_per_expert) of a float dtype; out is contiguous [T, H]
// of hidden's dtype, allocated by the caller and fully written by the backend.
struct ExpertsProblem {
  const ExpertsSpec* spec = nullptr;
  const ExpertsWeights* weights = nullptr;  // fused unless the backend reads_per_expert
  const struct PreparedExperts* prepared = nullptr;  // from this backend's prepare(), may be null
  Tensor hidden;
  Tensor top_k_index;
  Tensor top_k_weights;
  bool weights_per_expert = false;
  int64_t tokens() const { return hidden.size(0); }
  int64_t top_k() const { return top_k_index.size(1); }
};

// Backend-owned state derived once from the weights (packed tiles, device copies, ...).
struct PreparedExperts {
  virtual ~PreparedExperts() = default;
};

struct BackendCaps {
  std::vector<DeviceKind> devices;  // where it runs
  std::vector<DType> dtypes;        // activation/weight dtypes it accepts
  bool graph_capturable = false;    // may be recorded into a CUDA graph (no host sync, no alloc)
  bool quantized_weights = false;   // accepts spec.quant.quantized()
  // prepare() and forward() accept weights in the per-expert form (ExpertsWeights: gate_up and
  // down then undefined). Otherwise an Experts module fuses per-expert weights for this backend
  // at its first use.
  bool reads_per_expert = false;
  std::string description;          // one line for `moex backends`
};

// The ExpertsInterface. Implementations are stateless with respect to calls (all per-weights state
// lives in PreparedExperts), so one instance serves every layer and thread. An implementation
// serves the devices its caps() list; one registered name may have one implementation per device
// (the CPU and the CUDA grouped_mm are two classes registered under one name).
class ExpertsBackend {
 public:
  virtual ~ExpertsBackend() = default;
  virtual BackendCaps caps() const = 0;
  // Empty when (spec, dtype, device) is served; otherwise the reason, in words a user can act on.
  // The default checks caps(); backends add their own limits.
  virtual std::string unsupported_reason(const ExpertsSpec& spec, DType dtype, Device device) const;
  // Called once per (layer, backend) before the first forward; the result is cached by Experts.
  virtual std::unique_ptr<PreparedExperts> prepare(const ExpertsSpec& spec,
                                                   const ExpertsWeights& weights) const {
    (void)spec;
    (void)weights;
    return nullptr;
  }
  // Computes `out` on ctx.device, enqueued on ctx.stream, scratch from ctx.workspace (or the
  // prepared state's); never synchronises or allocates beyond that unless caps() says it is not
  // graph-capturable.
  virtual void forward(const ExpertsProblem& problem, Tensor& out, const ExecContext& ctx) const = 0;
};

// ---- registry ----
// Every backend, built-in or not, registers itself: its own file plus one line,
//   MOEX_REGISTER_EXPERTS_BACKEND("grouped_mm", GroupedMmCuda);
// or a call of register_experts_backend. A registration sets the implementation of `name` for the
// devices b->caps() lists; implementations of that name for other devices stay (a later
// registration for the same device replaces the earlier one). get_experts_backend(name) returns
// one backend that dispatches each call to the implementation for the device of its tensors.
void register_experts_backend(const std::string& name, std::shared_ptr<const ExpertsBackend> b);
// The per-device implementations registered under `name` (for `moex backends`); {} when unknown.
std::vector<std::shared_ptr<const ExpertsBackend>> experts_backend_implementations(
    std::string_view name);
// Throws UnknownName: "unknown experts backend 'x'; registered: auto, batched_mm, eager, grouped_mm".
std::shared_ptr<const ExpertsBackend> get_experts_backend(std::string_view name);
bool has_experts_backend(std::string_view name);
std::vector<std::string> experts_backend_names();  // sorted

#define MOEX_REGISTRATION_CONCAT2(a, b) a##b
#define MOEX_REGISTRATION_CONCAT(a, b) MOEX_REGISTRATION_CONCAT2(a, b)
// Registers a default-constructible ExpertsBackend subclass under `name` when the library (or the
// plugin holding it) is loaded.
#define MOEX_REGISTER_EXPERTS_BACKEND(name, Type)                                      \
  static const bool MOEX_REGISTRATION_CONCAT(moex_registered_backend_, __LINE__) = [] { \
    ::moex::register_experts_backend(name, std::make_shared<Type>());                  \
    return true;                                                                       \
  }()

// ---- calls ----
// Model-independent call: validates everything at this boundary, prepares (uncached) and runs.
// Throws InvalidInput (shapes, dtypes, ids < 0), UnknownName (backend), Unsupported (backend
// cannot serve this spec/dtype/device).
Tensor experts_forward(std::string_view backend, const ExpertsSpec& spec,
                       const ExpertsWeights& weights, const Tensor& hidden,
                       const Tensor& top_k_index, const Tensor& top_k_weights);

// An experts module of a model: spec + weights + a per-backend cache of prepared state. The
// backend is chosen per call, so a model can switch backends at run time without reloading.
// Weights held in the per-expert form are given as they are to backends that read it
// (reads_per_expert) and fused, once, for the first backend that does not; the fused copy is
// then shared by every such backend and by weights(). Thread-safe: calls may come from several
// threads; preparation and fusing happen once.
class Experts {
 public:
  Experts(ExpertsSpec spec, ExpertsWeights weights);  // validates
  const ExpertsSpec& spec() const { return spec_; }
  // The fused weights (gate_up / down always defined). For weights held per expert this makes
  // the fused copy on the first call (the cost of a second copy of every expert weight): code
  // that only needs the dtype, the device or the size uses stored_weights() or the accessors.
  const ExpertsWeights& weights() const;
  // The weights as held: fused, per expert, or both.
  const ExpertsWeights& stored_weights() const { return weights_; }
  DType dtype() const { return weights_.dtype(); }
  Device device() const { return weights_.device(); }
  // Allocates the output on hidden's device and runs on that device's default context.
  Tensor forward(std::string_view backend, const Tensor& hidden, const Tensor& top_k_index,
                 const Tensor& top_k_weights) const;
  // Writes into the caller's `out` ([T, H], hidden's dtype and device) within `ctx`: the form a
  // model uses so that a step allocates nothing and stays capturable.
  void forward(std::string_view backend, const Tensor& hidden, const Tensor& top_k_index,
               const Tensor& top_k_weights, Tensor& out, const ExecContext& ctx) const;
  // Runs the backend's one-time preparation (weight packing, workspaces) now instead of at the
  // first forward; a no-op when it is cached already. Models call it before timing a generate,
  // with their activation dtype: quantized weights run with the caller's activations, which the
  // backend checks (deepgemm takes bfloat16 only). Without it, quantized weights are refused only
  // when no activation dtype (bfloat16, float16, float32) would be served; the forward checks the
  // one given.
  void prepare(std::string_view backend) const;
  void prepare(std::string_view backend, DType activation_dtype) const;

 private:
  ExpertsSpec spec_;
  ExpertsWeights weights_;
  mutable std::shared_ptr<struct PreparedCache> cache_;
};

// Float64 reference of the formula above: the inputs' values (any float dtype, any device) are
// used exactly and everything after is computed in double, with no intermediate rounding; the
// result is float64 [T, H] on the host. Backends are compared with it at a tolerance derived from
// the dtype and the reduction length (moex/check.hpp), which covers the contract's roundings.
Tensor experts_reference_f64(const ExpertsSpec& spec, const ExpertsWeights& weights,
                             const Tensor& hidden, const Tensor& top_k_index,
                             const Tensor& top_k_weights);

// The reference of quantized experts with a bound on its one discontinuity. The activation
// quantizer rounds to e4m3; the float64 reference quantizes the intermediate it computed in
// double (rounded to float32, then to the activation dtype), a backend the one it computed in
// float32. An element whose float32 error bound (float32 accumulation of the gate_up product,
// propagated through the activation, plus the rounding to the activation dtype) reaches an e4m3
// rounding midpoint may round to a neighbouring e4m3 value in a backend: each such element is
// counted, and the change it can cause in the output (one e4m3 step x its block scale x |routing
// weight| x the L2 norm of its down column) is summed into `crossing_bound`, an absolute L2 bound.
// A backend is right when ||out - ref.out|| <= tolerance x ||ref.out|| + crossing_bound; with no
// element near a midpoint the bound is 0 and the comparison is the plain one. For unquantized
// specs the bound is always 0.
// `accumulation_unit_roundoff`: the unit roundoff of the backend's sums inside one scale block
// (0: float32's 2^-24). FP8 tensor cores sum a 128-wide block with fewer bits (DeepGEMM's reason
// to promote per block): a coarser sum widens every element's error interval (more crossings)
// and adds `accumulation_bound`, the same error model applied to the down projection's sums.
// Such a backend is right when ||out - ref.out|| <= tolerance x ||ref.out|| + crossing_bound +
// accumulation_bound.
struct QuantizedReference {
  Tensor out;                  // float64 [T, H], as experts_reference_f64
  int64_t near_midpoints = 0;  // intermediate elements whose error interval holds a midpoint
  int64_t elements = 0;        // intermediate elements quantized (T x valid slots x I)
  double crossing_bound = 0;   // absolute L2 bound of what those elements can change
  double accumulation_bound = 0;  // absolute L2 bound of the down sums' coarser rounding (or 0)
};
QuantizedReference experts_reference_f64_bounded(const ExpertsSpec& spec,
                                                 const ExpertsWeights& weights,
                                                 const Tensor& hidden, const Tensor& top_k_index,
                                                 const Tensor& top_k_weights,
                                                 double accumulation_unit_roundoff = 0);

}  // namespace moex
