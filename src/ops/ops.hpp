// The ops tier: every computation the model code runs on activations, and nothing else.
//
// Tiers (house style): src/model/* decides WHAT to compute (configuration, weights, the order of
// a layer's steps) and calls only these functions; each op here validates nothing (the model API
// and the loader did), dispatches on the device of its tensors in ONE place (src/ops/dispatch.cpp)
// and runs an implementation under src/ops/<device>/. This build has host implementations
// (src/ops/cpu/*) and, in CUDA builds, device implementations (src/ops/cuda/*) that run on the
// calling thread's current stream of the tensors' device, allocate from the caching allocator and
// never synchronise the host (except choose_tokens, which returns host ids).
//
// Conventions shared by every op:
// - Activations are contiguous tensors [rows, width], rows = B sequences x T new tokens,
//   sequence-major (row = b * T + t), holding values of the model's activation dtype `act`: an op
//   rounds its outputs to `act` (round to nearest even; a no-op for float32) exactly where
//   transformers produces a tensor of that dtype, and says so below. Their storage dtype is the
//   device's: float32 on the host (exact for bf16 values), `act` itself on CUDA (what cuBLASLt
//   and the experts read). Outputs the contract calls float32 (router logits of DeepSeek, routing
//   weights) are float32 on every device. Ops accept either storage dtype as input. Sums, statistics and
//   softmaxes accumulate in float32 (some in double where noted), in a fixed order, so results
//   do not depend on the thread count.
// - Weights are tensors of any float dtype, read in place; a linear's weight [out, in] is
//   prepared once for its device instead (LinearWeight, prepare_linear).
// - Ops named with a trailing underscore work in place (torch's convention).
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <vector>

#include "moex/dtype.hpp"
#include "moex/experts.hpp"
#include "moex/tensor.hpp"

namespace moex::cpu {
class DenseLinear;  // src/cpu/dense_linear.hpp
}  // namespace moex::cpu

namespace moex::ops {

// ---- one forward call ----

// `batch` sequences, each with `tokens` new tokens written at cache columns past .. past +
// tokens - 1 (every sequence advances together).
//
// Left padding (transformers' padding_side="left" with an attention mask): the first pad[b]
// cache columns of sequence b hold padding. They are never attended to (a query that sees no
// other key, i.e. a padding row, gets zeros), and the rope position of column c is c - pad[b]
// (transformers' position_ids = cumsum(mask) - 1; padding rows get 1, its masked_fill value).
struct Step {
  int64_t batch = 1;
  int64_t tokens = 1;
  int64_t past = 0;          // cache columns already filled
  std::vector<int64_t> pad;  // [batch] left-padding columns per sequence; empty = none
  std::vector<int64_t> ids;  // [rows] the token ids fed (row-major), read by embedding()
  // CUDA forwards: the same facts on the device, int32 [1 + batch + 2 * rows] =
  // {past, pad[batch], position[rows], id[rows]}: the step's one host->device upload
  // (make_device_step), read by the CUDA ops instead of the host fields above, so that the
  // kernels of a step do not depend on host values (what a captured graph needs). Undefined on
  // the host.
  Tensor device;

  Step() = default;
  Step(int64_t b, int64_t t, int64_t p) : batch(b), tokens(t), past(p) {}
  int64_t rows() const { return batch * tokens; }
  int64_t column(int64_t row) const { return past + row % tokens; }
  int64_t pad_of(int64_t b) const { return pad.empty() ? 0 : pad[size_t(b)]; }
  // The rope position of a row (see above).
  int64_t position(int64_t row) const {
    const int64_t c = column(row), p = pad_of(row / tokens);
    return c < p ? 1 : c - p;
  }
};

// Fills step.device on `device` from the host fields (one upload), in place when the step already
// has a mirror of the same size there (a captured step reads a fixed address). Offsets:
inline int64_t device_step_pad_offset() { return 1; }
inline int64_t device_step_position_offset(const Step& s) { return 1 + s.batch; }
inline int64_t device_step_id_offset(const Step& s) { return 1 + s.batch + s.rows(); }
void make_device_step(Step& step, Device device);

// Waits for what the ops run on threads of their own beside the caller's (today: cuDNN attention
// graphs still being planned, src/ops/cuda/attention_cudnn.cpp). A model calls it when it is
// destroyed, so that a process exiting right after its last call does not tear libraries down
// under that work.
void finish_background_work();

// ---- KV cache ----

// Keys and values of one layer: k [batch, capacity, k_dim], v [batch, capacity, v_dim]
// (k_dim = kv_heads * head_dim_k) in the activation storage dtype of their device (float32
// holding act values on the host, act on CUDA); columns [0, length) are filled. Fixed shapes per
// capacity, so that a step's kernels see fixed shapes (and can be captured).
// Allocated by the first kv_append with max(capacity_hint, what that append needs) columns;
// an append past the capacity doubles it (copying what is cached).
// A layer whose values are part of its keys (AttentionSpec::v_from_k: DeepSeek MLA's latent)
// keeps v undefined: its appends pass an undefined v and write k only.
struct LayerKV {
  Tensor k, v;
  int64_t filled = 0;
  int64_t capacity_hint = 0;
  int64_t length() const { return filled; }
  int64_t capacity() const { return k.defined() ? k.size(1) : 0; }
};

struct KVCache {
  // `capacity`: positions to preallocate per layer (prompt + max_new_tokens when known; 0 =
  // exactly what the first forward needs, doubling afterwards).
  KVCache(int64_t batch, int64_t layers, int64_t capacity = 0);
  int64_t batch;
  std::vector<LayerKV> layers;
  int64_t length() const;  // positions cached (layer 0)
};

// Appends k [rows, k_dim] and v [rows, v_dim] (row b * T + t -> sequence b, column past + t;
// step.past == kv.length(): every sequence advances together). v undefined: k only (kv.v stays
// undefined; every append of that layer must do the same).
void kv_append(LayerKV& kv, const Tensor& k, const Tensor& v, const Step& step);

// Columns [0, n) of every sequence of a cache tensor (kv.k or kv.v) [batch, capacity, dim] ->
// [batch * n, dim], row b * n + j = column j of sequence b, in the cache's storage dtype.
// (DeepSeek MLA's prefill re-expands the cached latents.) n <= capacity.
Tensor kv_columns(const Tensor& cache, int64_t n);

// ---- element-wise ----

// x = round(x) to act (no-op for float32).
void round_(Tensor& x, DType act);
// a = round(a + b): the residual connection. Same shapes.
void add_(Tensor& a, const Tensor& b, DType act);
// x = clamp(x, -limit, limit) (OLMoE clip_qkv). No rounding (clamping keeps act values).
void clamp_(Tensor& x, float limit);
// The gated MLP's middle: gate = round(round(act_fn(gate)) * up), as torch's bf16
// `act_fn(gate_proj(x)) * up_proj(x)`. kSwigluOai is not a plain activation: Unsupported.
void gated_activation_(Tensor& gate, const Tensor& up, Activation act_fn, DType act);
// qwen2_moe's shared expert: y = round(y + round(round(sigmoid(gate_logit)) * shared)),
// gate_logit [rows, 1], y and shared [rows, H].
void add_gated_(Tensor& y, const Tensor& shared, const Tensor& gate_logit, DType act);
// add_gated_(y, ...) and then add_(residual, y, act): exactly those two ops (one launch on a device).
void add_gated_residual_(Tensor& residual, Tensor& y, const Tensor& shared, const Tensor& gate_logit, DType act);

// Rows step.ids of table [V, H] (any float dtype) -> [step.rows(), H] on the table's device,
// rounded to act. (Ids were validated by the model.)
Tensor embedding(const Tensor& table, const Step& step, DType act);
// Columns [begin, begin + width) of each of the `groups` equal column groups of x
// [rows, groups * g] -> [rows, groups * width]. groups = 1: a plain column slice.
// (DeepSeek MLA: the latent / rope parts of kv_a_proj, and k_nope / v of each kv_b_proj head.)
Tensor slice_columns(const Tensor& x, int64_t groups, int64_t begin, int64_t width);
// Per group concatenation: out[r, g] = [a[r, g], b[r, g]] with a [rows, groups * wa] and b
// [rows, groups * wb], or, when b_shared, b [rows, wb] shared by every group (MLA's one rope key
// of all heads).
Tensor concat_columns(const Tensor& a, const Tensor& b, int64_t groups, bool b_shared = false);
// The last of each sequence's `step.tokens` rows: x [step.rows(), W] -> [step.batch, W].
Tensor last_rows(const Tensor& x, const Step& step);

// ---- normalisation ----

enum class RmsNormStyle : unsigned char {
  kLlama,   // y = round(w * round(x * r)): LlamaRMSNorm, casts to the input dtype first
  kGptOss,  // y = round(w * (x * r)): GptOssRMSNorm, product in float32, cast once
};
// RMSNorm of every `group`-wide slice of each row (group = 0: the whole row; head_dim: per-head
// q/k norms), r = 1 / sqrt(mean(x^2) + eps) with the sum of squares in double (transformers'
// float32 mean without summation-order noise). w [group] of any float dtype.
void rms_norm_(Tensor& x, const Tensor& weight, float eps, DType act, int64_t group = 0,
               RmsNormStyle style = RmsNormStyle::kLlama);
Tensor rms_norm(const Tensor& x, const Tensor& weight, float eps, DType act, int64_t group = 0,
                RmsNormStyle style = RmsNormStyle::kLlama);
// The residual step between sub-layers: add_(h, delta, act), then rms_norm(h) over whole rows,
// exactly those two ops (one launch on a device).
Tensor add_rms_norm(Tensor& h, const Tensor& delta, const Tensor& weight, float eps, DType act,
                    RmsNormStyle style = RmsNormStyle::kLlama);

// ---- rotary position embedding ----

enum class RopeLayout : unsigned char {
  kHalf,         // rotate_half: pairs (x[i], x[i + d/2]) (Llama, Qwen, Mixtral, OLMoE, gpt-oss)
  kInterleaved,  // DeepSeek rope_interleave: pairs (x[2i], x[2i+1]); the output is written in
                 // rotate_half order (x[2i] -> slot i, x[2i+1] -> slot i + d/2), exactly as
                 // transformers' apply_rotary_pos_emb_interleave does.
};

// The frequencies of a rope (built from a config by model::make_rope).
struct Rope {
  int64_t rotary_dim = 0;
  std::vector<double> inv_freq;    // rotary_dim / 2 entries, float32 values
  double attention_scaling = 1.0;  // multiplies cos and sin (yarn)
  // cos/sin for one position in float32 as transformers computes them (freqs = inv_freq *
  // position in float32), scaled, rounded to act: out[rotary_dim/2] each.
  void cos_sin(int64_t position, DType act, float* cos_out, float* sin_out) const;
};

// Rotates dims [offset, offset + rotary_dim) of each head's head_stride-wide slice of
// x [rows, heads * head_stride] in place at the positions of `step`: (x * cos) +
// (rotate_half(x) * sin), each product and the sum rounded to act (torch's bf16 ops).
void rope_(Tensor& x, int64_t heads, int64_t head_stride, int64_t offset, const Rope& rope,
           RopeLayout layout, const Step& step, DType act);
// rope_(a, heads_a, ...) and rope_(b, heads_b, ...) (q and k; one launch on a device).
void rope2_(Tensor& a, int64_t heads_a, Tensor& b, int64_t heads_b, int64_t head_stride, int64_t offset,
            const Rope& rope, RopeLayout layout, const Step& step, DType act);
// rope2_(q, heads_q, k, heads_k, head_dim, 0, ...) over whole heads, then kv_append(kv, k, v,
// step), with the same results; on a device one launch where q, k, v and the cache share a
// dtype (the rotated k goes to its cache row as it is written), else the two ops.
void rope_kv_append_(Tensor& q, int64_t heads_q, Tensor& k, int64_t heads_k, const Tensor& v, LayerKV& kv,
                     int64_t head_dim, const Rope& rope, RopeLayout layout, const Step& step, DType act);

// ---- linear ----

// A linear's weight [out, in] prepared for its device once, at load time (prepare_linear):
// - host: packed for the CPU engine's micro-kernels (src/cpu/dense_linear.hpp: bf16 in the
//   pair layout, fp32 and fp16 in fp32 panels); `tensor` is kept only when it is a view of the
//   file mapping (its pages released: read back from the file if something touches it, e.g.
//   the embedding lookup of a tied lm_head) or when the caller asks to keep it;
// - CUDA: the tensor itself (cuBLASLt reads it in place), nothing packed.
// - quantized (block-scaled FP8 / FP4 as include/moex/quant.hpp defines them; `quant` set):
//   `tensor` holds the stored codes as they are (FP8: kF8E4M3 [out, in], one byte per weight;
//   FP4: kI8 [out, in / 2] as stored, two e2m1 codes per byte, low nibble = even column), `scale` the
//   block scales [ceil(out / quant.block_n), ceil(in / quant.block_k)] (kF32 or kF8E8M0),
//   `dtype` the codes' dtype; nothing packed and no full-precision copy. The host runs it with
//   src/cpu/quant_linear.hpp, a CUDA device with src/ops/cuda/linear_quant.cu.
struct LinearWeight {
  Tensor tensor;  // [out, in] as loaded, or undefined (host, packed and not kept)
  std::shared_ptr<const ::moex::cpu::DenseLinear> packed;  // host only; null: `tensor` is read in place
  int64_t out = 0, in = 0;
  DType dtype = DType::kF32;  // the loaded tensor's dtype
  Tensor scale;               // quantized only: block scales (see above)
  QuantScheme quant;          // kind kNone: a plain float weight
  int64_t out_features() const { return out; }
  int64_t in_features() const { return in; }
  bool quantized() const { return quant.quantized(); }
  // Bytes held for this weight: the packed form or the tensor (+ scales when quantized).
  int64_t nbytes() const;
};
// Prepares `weight` [out, in] (any float dtype) on its own device. keep_tensor: the result keeps
// the tensor even when it is an owned host copy (callers that also read it, e.g. DeepSeek's
// per-group kv_b_proj). Host weights of a dtype the engine does not pack keep their tensor.
LinearWeight prepare_linear(const Tensor& weight, bool keep_tensor = false);
// A quantized weight (codes + block scales, both on the same device, shapes as LinearWeight
// documents; the loader validated them) kept as it is stored, on either device.
LinearWeight prepare_quantized_linear(const Tensor& codes, const Tensor& scale, const QuantScheme& quant,
                                      int64_t out, int64_t in);

// y = x W^T + b: x [rows, in] float32, W [out, in] any float dtype, b [out] float32 or
// undefined; float32 accumulation, rounded once to act. -> [rows, out]. Also the lm_head (no
// bias; logits hold act values). Each row's result depends on that row only (not on the other
// rows of the call, nor on the thread count).
// A quantized weight computes quant.hpp's product instead: each row of x quantized per 128-wide
// K block (dynamic e4m3 activations), fp32 sums per weight block with both scales applied per
// block, then bias and rounding as above.
Tensor linear(const Tensor& x, const LinearWeight& weight, const Tensor& bias, DType act);
// The same with an unprepared weight, read in place (tests, one-off calls; slower on the host).
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias, DType act);

// Several linears of the same x: out[i] is exactly linear(x, *ls[i].weight, *ls[i].bias, act)
// (bias may be null). On a device, decode-sized calls run as one launch (src/ops/cuda/
// linear_gemv.cu): q / k / v, or a router beside a shared expert's projections, stream their
// weights in one grid instead of paying a launch's start and drain each.
struct LinearOf {
  const LinearWeight* weight;
  const Tensor* bias;
};
std::vector<Tensor> linears(const Tensor& x, std::span<const LinearOf> ls, DType act);

// An RMSNorm followed by linears of its output, the values of the ops one after another:
// x = rms_norm(h), or with delta x = add_rms_norm(h, *delta) (h updated as that op does), then
// linears(x, ls). *x_out, when given, receives x. On a device, decode-sized calls whose linears
// all take the one-launch GEMV run as that launch alone: its blocks form x themselves (src/ops/
// cuda/linear_gemv.cu), and with delta h is then made to refer to a new tensor holding the sum.
struct NormOf {
  const Tensor* weight;
  float eps;
  RmsNormStyle style = RmsNormStyle::kLlama;
};
std::vector<Tensor> norm_linears(Tensor& h, const Tensor* delta, const NormOf& norm, std::span<const LinearOf> ls,
                                 DType act, Tensor* x_out);

// Per-group weight blocks read in place from one weight tensor [groups * group_rows, in]: group
// g's block W_g is rows [g * group_rows + offset, g * group_rows + offset + rows), [rows, in].
// (DeepSeek MLA: kv_b_proj [heads * (nope + v), kv_lora] holds W_UK[h] at offset 0, nope rows,
// and W_UV[h] at offset nope, v rows.)
struct GroupedWeight {
  Tensor weight;           // any float dtype, contiguous
  int64_t groups = 1;
  int64_t group_rows = 0;  // rows per group (the stride between blocks)
  int64_t offset = 0;      // first row of a block within its group
  int64_t rows = 0;        // rows per block
  int64_t in() const { return weight.size(1); }
};
// One linear per group, x [rows, groups * a] -> y [rows, groups * b], y_g from x_g only:
// transpose_weight false: y_g = x_g W_g^T (a = w.in(), b = w.rows), like linear();
// transpose_weight true:  y_g = x_g W_g   (a = w.rows, b = w.in()).
// float32 accumulation in a fixed order, rounded once to act.
Tensor linear_per_group(const Tensor& x, const GroupedWeight& w, bool transpose_weight, DType act);

// ---- attention ----

struct AttentionSpec {
  int64_t heads = 0;       // query heads
  int64_t kv_heads = 0;    // key/value heads (GQA: heads % kv_heads == 0; head h reads h / (heads / kv_heads))
  int64_t head_dim_k = 0;  // q and k per-head width
  int64_t head_dim_v = 0;  // v and output per-head width
  float scale = 0.0f;      // softmax scale (usually 1/sqrt(head_dim_k))
  int64_t sliding_window = 0;  // > 0: the query at p sees keys at j with p - j < sliding_window
  Tensor sinks;                // [heads] float32 per-head sink logits (gpt-oss), or undefined
  // Off: torch's CPU sdpa (flash) kernel, what transformers runs by default: scores and
  // softmax in float32, the unnormalised e = exp(s - max) rounded to act for the product with v,
  // the float32 sum of e dividing the result. On: transformers' eager attention (gpt-oss, which
  // has no sdpa): q.k, the scaled score, the sink and the score minus the row maximum rounded to
  // act, then the normalised probabilities e / sum rounded to act. (No-ops in float32 but for
  // where the division happens.)
  bool eager_rounding = false;
  // On: the values of kv head g are the first head_dim_v columns of its key (head_dim_v <=
  // head_dim_k) and kv.v is not read (may be undefined). DeepSeek MLA's absorbed form: one
  // cached [latent; rope key] per token is the key of every head and its latent the value.
  bool v_from_k = false;
};

// Causal attention of q [rows, heads * head_dim_k] over every position cached in `kv` up to
// each query's own (kv_append first): scores = q.k * scale, softmax over the visible keys with
// the sinks joining the denominator (then dropped; such rows sum to < 1), denominator in double,
// p.v accumulated in float32, output rounded to act; exp (float32 for sdpa, double for eager) and
// the other rounding points follow AttentionSpec::eager_rounding. -> [rows, heads * head_dim_v].
Tensor attention(const Tensor& q, const LayerKV& kv, const Step& step, const AttentionSpec& spec,
                 DType act);

// ---- routing ----

// Routing result handed to the experts: top_k_index int64 [rows, k], top_k_weights float32
// [rows, k].
struct Routing {
  Tensor top_k_index;
  Tensor top_k_weights;
};

// torch.topk(largest=True) of one row exactly as torch's CPU kernel picks it, ties included:
// (value, index) pairs in index order, std::partial_sort when k * 64 <= n, else std::nth_element
// at k - 1 (then std::sort of the first k - 1 when `sorted`), comparing values only (NaN counts
// as largest). bf16 router logits tie often, and the chosen expert decides the output, so every
// router uses it. val_out may be null.
void torch_topk(const float* values, int64_t n, int64_t k, bool sorted, int64_t* idx_out,
                float* val_out);

// Softmax router (Mixtral / Qwen-MoE / OLMoE): p = softmax(logits) in float32, torch.topk(p, k)
// (sorted), optionally renormalised to sum 1, weights rounded to `weights_dtype` (the hidden
// dtype; Mixtral keeps float32). logits float32 [rows, E].
Routing softmax_topk(const Tensor& logits, int64_t k, bool normalize, DType weights_dtype);
// gpt-oss router after its linear: torch.topk(logits, k) (sorted), softmax over the k chosen
// values in float32, rounded to act.
Routing topk_softmax(const Tensor& logits, int64_t k, DType act);

// DeepSeek-V3's router (DeepseekV3TopkRouter), float32 throughout:
//   s = sigmoid(logits); c = s + correction (used to CHOOSE only)
//   group score = sum of the two largest c of each of n_group contiguous groups (one when a
//   group has one expert); keep the topk_group best groups (torch.topk sorted=False), c = -inf
//   elsewhere; idx = torch.topk(c, k, sorted=False) (slot order = torch's nth_element order)
//   w = s[idx]; if norm_topk_prob: w /= (sum w + 1e-20); w *= routed_scaling_factor. Weights stay float32.
struct GroupLimitedTopk {
  int64_t num_experts = 0;  // E
  int64_t top_k = 1;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  bool norm_topk_prob = true;
  float routed_scaling_factor = 1.0f;
};
// logits float32 [rows, E], correction float32 [E].
Routing sigmoid_group_topk(const Tensor& logits, const Tensor& correction, const GroupLimitedTopk& spec);

// ---- token choice ----

// argmax of row `row` of logits [rows, V] (the lowest id on ties).
int64_t argmax_row(const Tensor& logits, int64_t row);
// transformers' warper order: temperature, top-k, top-p (the least likely tokens whose
// cumulative probability is <= 1 - top_p are removed, the most likely always stays), then a
// draw from the softmax with `rng`, in double.
struct SamplingSpec {
  float temperature = 1.0f;  // > 0
  int64_t top_k = 0;         // 0 = off
  float top_p = 1.0f;        // in (0, 1]; 1 = off
};
int64_t sample_row(const Tensor& logits, int64_t row, const SamplingSpec& spec, std::mt19937_64& rng);

// The next token of every row of logits [B, V] -> B host ids: argmax when `sampling` is null,
// else a draw. Host: argmax_row / sample_row with `rng`. CUDA: one kernel over all rows and one
// device->host copy of the ids (the step's one download); each draw takes a 64-bit seed from
// `rng` and derives its uniform number from (seed, row) with a counter-based hash, so a seed
// reproduces a run on the same device (the streams of the host and the device differ).
std::vector<int64_t> choose_tokens(const Tensor& logits, const SamplingSpec* sampling, std::mt19937_64& rng);
// The same, also counting each row's non-finite logits (NaN, +-inf) into `nonfinite` (B entries)
// in the same pass: on CUDA the counts come back with the ids, in the same download, so checking
// them costs a generation step no extra synchronisation.
std::vector<int64_t> choose_tokens(const Tensor& logits, const SamplingSpec* sampling, std::mt19937_64& rng,
                                   std::vector<int64_t>* nonfinite);

// ---- the token choice inside a captured decode step ----
// A decode loop whose steps choose their tokens on the device and feed them to the next step
// there, so that the host can enqueue step n + 1 before it reads step n's ids (generate's CUDA
// graph pipeline). The device holds what the host loop would otherwise apply between steps:
// which rows stopped (and with which token), the stop tokens, and the seeds of the draws (draw i
// takes seeds[i], drawn in order from the caller's generator, so the tokens equal those of
// choose_tokens step by step).
struct DeviceFeed {
  Tensor state;  // int64 [2 + 2B]: {draws made, completion ticket, stop token per row (-1 =
                 // running), the greedy choice's ticket per row}
  Tensor eos;    // int64 [n] stop tokens (undefined when none)
  Tensor seeds;  // int64 [n] the draws' seeds as bits (undefined when greedy)
  Tensor out;    // int64 [2B]: each row's fed id, then its count of non-finite logits
  Tensor work;   // the greedy choice's partial results per row
};
// Writes `feed` on `device` (in place when its tensors already have these sizes there: a captured
// step reads fixed addresses), with the uploads on the current stream. stop_token: B entries.
void make_device_feed(DeviceFeed& feed, const std::vector<int64_t>& stop_token, const std::vector<int64_t>& eos,
                      const std::vector<uint64_t>& seeds, Device device);
// choose_tokens' choice (argmax, or a draw with `sampling` and the feed's next seed) of every row
// of logits [B, V] for a step of one token per row, enqueued without a download: a row that
// stopped feeds its stop token, a row whose choice is a stop token stops; the fed ids and the
// non-finite counts go to feed.out, the ids to step.device, and the step moves one column on
// (past + 1 and the positions with it). CUDA only (the host loop chooses on the host).
void choose_and_feed(const Tensor& logits, const SamplingSpec* sampling, Step& step, DeviceFeed& feed);

}  // namespace moex::ops
