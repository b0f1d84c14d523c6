// Experts spec helpers, boundary validation, the model-independent call and the Experts module.
#include "moex/experts.hpp"

#include <cstring>
#include <mutex>
#include <sstream>
#include <unordered_map>

#include "moex/env_switches.hpp"
#include "moex/error.hpp"
#include "moex/quant.hpp"

namespace moex {

Activation parse_activation(std::string_view n) {
  if (n == "silu" || n == "swish") return Activation::kSilu;
  if (n == "gelu") return Activation::kGelu;
  if (n == "gelu_pytorch_tanh" || n == "gelu_new" || n == "gelu_fast") return Activation::kGeluTanh;
  if (n == "relu") return Activation::kRelu;
  if (n == "swiglu_oai") return Activation::kSwigluOai;
  throw InvalidInput("unknown activation '" + std::string(n) +
                     "'; supported: silu, swish, gelu, gelu_pytorch_tanh, gelu_new, relu");
}

std::string_view activation_name(Activation a) {
  switch (a) {
    case Activation::kSilu: return "silu";
    case Activation::kGelu: return "gelu";
    case Activation::kGeluTanh: return "gelu_pytorch_tanh";
    case Activation::kRelu: return "relu";
    case Activation::kSwigluOai: return "swiglu_oai";
  }
  return "?";
}

Shape ExpertsSpec::gate_up_shape() const {
  return is_transposed ? Shape{num_experts, hidden, gate_up_rows()}
                       : Shape{num_experts, gate_up_rows(), hidden};
}
Shape ExpertsSpec::down_shape() const {
  return is_transposed ? Shape{num_experts, intermediate, hidden}
                       : Shape{num_experts, hidden, intermediate};
}

std::string ExpertsSpec::str() const {
  std::ostringstream o;
  o << "E=" << num_experts << " H=" << hidden << " I=" << intermediate
    << (has_gate ? (is_concatenated ? " gated(concat)" : " gated(interleaved)") : " ungated")
    << (has_bias ? " bias" : "") << (is_transposed ? " transposed" : "") << " act="
    << activation_name(act);
  if (quant.quantized()) o << " quantized";
  return o.str();
}

static void expect_tensor(const Tensor& t, const std::string& name, const Shape& shape, DType dtype,
                          Device device) {
  if (!t.defined()) throw InvalidInput("experts weight '" + name + "' is missing");
  if (t.shape() != shape)
    throw InvalidInput("experts weight '" + name + "' has shape " + shape_str(t.shape()) +
                       ", expected " + shape_str(shape));
  if (t.dtype() != dtype)
    throw InvalidInput("experts weight '" + name + "' has dtype " +
                       std::string(dtype_name(t.dtype())) + ", expected " +
                       std::string(dtype_name(dtype)));
  if (t.device() != device)
    throw InvalidInput("experts weight '" + name + "' is on " + t.device().str() +
                       ", the other experts weights are on " + device.str());
  if (!t.is_contiguous())
    throw InvalidInput("experts weight '" + name + "' must be contiguous");
}

DType ExpertsWeights::dtype() const {
  if (gate_up.defined()) return gate_up.dtype();
  if (per_expert && !per_expert->gate.empty()) return per_expert->gate[0].dtype();
  return DType::kF32;
}

Device ExpertsWeights::device() const {
  if (gate_up.defined()) return gate_up.device();
  if (per_expert && !per_expert->gate.empty()) return per_expert->gate[0].device();
  return Device::cpu();
}

int64_t ExpertsWeights::nbytes() const {
  int64_t n = 0;
  for (const Tensor* t : {&gate_up, &down, &gate_up_bias, &down_bias, &gate_up_scale, &down_scale})
    if (t->defined()) n += int64_t(t->nbytes());
  if (per_expert)
    for (const auto* v : {&per_expert->gate, &per_expert->up, &per_expert->down})
      for (const Tensor& t : *v)
        if (t.defined()) n += int64_t(t.nbytes());
  return n;
}

static void validate_per_expert(const ExpertsSpec& s, const PerExpertWeights& pe, DType dt,
                                Device dev) {
  if (!s.has_gate || !s.is_concatenated || s.is_transposed || s.has_bias)
    throw InvalidInput("per-expert weights hold gated, concatenated, untransposed experts "
                       "without biases, not " + s.str());
  if (!dev.host_accessible())
    throw InvalidInput("per-expert weights are held on the host, not on " + dev.str());
  const size_t E = size_t(s.num_experts);
  if (pe.gate.size() != E || pe.up.size() != E || pe.down.size() != E)
    throw InvalidInput("per-expert weights need " + std::to_string(E) +
                       " gate, up and down tensors, got " + std::to_string(pe.gate.size()) + ", " +
                       std::to_string(pe.up.size()) + " and " + std::to_string(pe.down.size()));
  const int64_t H = s.hidden, I = s.intermediate;
  for (size_t e = 0; e < E; ++e) {
    const std::string i = "[" + std::to_string(e) + "]";
    expect_tensor(pe.gate[e], "gate_proj" + i, {I, H}, dt, dev);
    expect_tensor(pe.up[e], "up_proj" + i, {I, H}, dt, dev);
    expect_tensor(pe.down[e], "down_proj" + i, {H, I}, dt, dev);
  }
}

static void expect_float_dtype(DType dt) {
  if (dt != DType::kF32 && dt != DType::kBF16 && dt != DType::kF16)
    throw InvalidInput("experts weights must be float32, bfloat16 or float16, got " +
                       std::string(dtype_name(dt)));
}

// The QuantScheme contract of experts.hpp, checked tensor by tensor.
static void validate_quantized(const ExpertsSpec& s, const ExpertsWeights& w) {
  const QuantScheme& q = s.quant;
  const bool fp4 = q.kind == QuantScheme::Kind::kFp4E2M1;
  const char* what = fp4 ? "FP4 (e2m1)" : "FP8 (e4m3)";
  // DeepSeek-style checkpoints store quantized experts this one way; other layouts would need
  // their own scale-row mapping, and none is known to exist.
  if (s.has_bias || s.is_transposed || (s.has_gate && !s.is_concatenated))
    throw InvalidInput(std::string(what) + " experts must be untransposed, concatenated " +
                       "[gate; up] and without biases (the DeepSeek-style checkpoint layout), not " +
                       s.str());
  const int64_t E = s.num_experts, H = s.hidden, I = s.intermediate, R = s.gate_up_rows();
  // The spec's own limits first, then the tensors.
  auto expect_fused = [&] {
    if (w.per_expert)
      throw InvalidInput(std::string(what) + " experts weights are held fused (gate_up_proj, " +
                         "down_proj and their scales), not per expert");
    if (!w.gate_up.defined()) throw InvalidInput("experts weight 'gate_up_proj' is missing");
    if (w.gate_up_bias.defined() || w.down_bias.defined())
      throw InvalidInput("quantized experts take no biases, but biases were given");
  };
  if (fp4) {
    if (q.block_n != 1 || q.block_k != quant::kFp4BlockK)
      throw InvalidInput("FP4 experts use 1 x 32 scale blocks, got " + std::to_string(q.block_n) +
                         " x " + std::to_string(q.block_k));
    if (q.scale_dtype != DType::kF8E8M0)
      throw InvalidInput("FP4 experts scales must be float8_e8m0fnu (UE8M0), got " +
                         std::string(dtype_name(q.scale_dtype)));
    if (H % quant::kFp4BlockK != 0 || I % quant::kFp4BlockK != 0)
      throw InvalidInput("FP4 experts need hidden and intermediate sizes that are multiples of 32 "
                         "(one scale per 32 values), got H=" + std::to_string(H) + " I=" +
                         std::to_string(I));
    expect_fused();
    const Device dev = w.gate_up.device();
    expect_tensor(w.gate_up, "gate_up_proj", {E, R, H / 2}, DType::kI8, dev);
    expect_tensor(w.down, "down_proj", {E, H, I / 2}, DType::kI8, dev);
    expect_tensor(w.gate_up_scale, "gate_up_scale", {E, R, H / quant::kFp4BlockK}, q.scale_dtype,
                  dev);
    expect_tensor(w.down_scale, "down_scale", {E, H, I / quant::kFp4BlockK}, q.scale_dtype, dev);
    return;
  }
  if (q.block_n != quant::kFp8Block || q.block_k != quant::kFp8Block)
    throw InvalidInput("FP8 experts use 128 x 128 scale blocks, got " + std::to_string(q.block_n) +
                       " x " + std::to_string(q.block_k));
  if (q.scale_dtype != DType::kF32 && q.scale_dtype != DType::kF8E8M0)
    throw InvalidInput("FP8 experts scales must be float32 or float8_e8m0fnu (UE8M0), got " +
                       std::string(dtype_name(q.scale_dtype)));
  const int64_t b = quant::kFp8Block;
  expect_fused();
  const Device dev = w.gate_up.device();
  expect_tensor(w.gate_up, "gate_up_proj", {E, R, H}, DType::kF8E4M3, dev);
  expect_tensor(w.down, "down_proj", {E, H, I}, DType::kF8E4M3, dev);
  expect_tensor(w.gate_up_scale, "gate_up_scale",
                {E, quant::scale_rows(R, b, s.has_gate), quant::scale_cols(H, b)}, q.scale_dtype,
                dev);
  expect_tensor(w.down_scale, "down_scale",
                {E, quant::scale_rows(H, b, false), quant::scale_cols(I, b)}, q.scale_dtype, dev);
}

void validate_experts_weights(const ExpertsSpec& s, const ExpertsWeights& w) {
  if (s.num_experts <= 0 || s.hidden <= 0 || s.intermediate <= 0)
    throw InvalidInput("experts spec needs positive sizes, got " + s.str());
  if (s.quant.quantized()) return validate_quantized(s, w);
  if (w.gate_up_scale.defined() || w.down_scale.defined())
    throw InvalidInput("experts weight scales given but the spec is not quantized (spec.quant)");
  if (!w.gate_up.defined() && !w.per_expert)
    throw InvalidInput("experts weight 'gate_up_proj' is missing");
  const DType dt = w.dtype();
  const Device dev = w.device();
  if (w.per_expert) {
    if (w.per_expert->gate.empty()) throw InvalidInput("experts weight 'gate_proj[0]' is missing");
    expect_float_dtype(w.per_expert->gate[0].dtype());
    validate_per_expert(s, *w.per_expert, dt, dev);
  }
  if (!w.gate_up.defined()) {
    if (w.down.defined()) throw InvalidInput("experts weight 'gate_up_proj' is missing");
    return;
  }
  expect_float_dtype(dt);
  expect_tensor(w.gate_up, "gate_up_proj", s.gate_up_shape(), dt, dev);
  expect_tensor(w.down, "down_proj", s.down_shape(), dt, dev);
  if (s.has_bias) {
    expect_tensor(w.gate_up_bias, "gate_up_proj_bias", {s.num_experts, s.gate_up_rows()}, dt, dev);
    expect_tensor(w.down_bias, "down_proj_bias", {s.num_experts, s.hidden}, dt, dev);
  } else if (w.gate_up_bias.defined() || w.down_bias.defined()) {
    throw InvalidInput("experts biases given but the spec says has_bias=false");
  }
}

ExpertsWeights fuse_experts_weights(const ExpertsSpec& s, const ExpertsWeights& w) {
  if (w.fused()) return w;
  const PerExpertWeights& pe = *w.per_expert;
  const int64_t E = s.num_experts, H = s.hidden, I = s.intermediate;
  ExpertsWeights f = w;
  f.gate_up = Tensor::empty({E, 2 * I, H}, w.dtype(), w.device());
  f.down = Tensor::empty({E, H, I}, w.dtype(), w.device());
  const size_t es = dtype_size(w.dtype()), block = size_t(I * H) * es;
  char* gu = static_cast<char*>(f.gate_up.raw());
  char* dn = static_cast<char*>(f.down.raw());
  for (int64_t e = 0; e < E; ++e) {
    std::memcpy(gu + size_t(2 * e) * block, pe.gate[size_t(e)].raw(), block);
    std::memcpy(gu + size_t(2 * e + 1) * block, pe.up[size_t(e)].raw(), block);
    std::memcpy(dn + size_t(e) * block, pe.down[size_t(e)].raw(), block);
  }
  return f;
}

std::string ExpertsBackend::unsupported_reason(const ExpertsSpec& spec, DType dtype,
                                               Device device) const {
  BackendCaps c = caps();
  bool dev_ok = false;
  for (auto k : c.devices) dev_ok |= (k == device.kind);
  if (!dev_ok) {
    std::string list;
    for (auto k : c.devices) list += (list.empty() ? "" : ", ") + Device{k, 0}.str();
    return "runs on " + list + ", not on " + device.str();
  }
  bool dt_ok = false;
  for (auto d : c.dtypes) dt_ok |= (d == dtype);
  if (!dt_ok) {
    std::string list;
    for (auto d : c.dtypes) list += (list.empty() ? "" : ", ") + std::string(dtype_name(d));
    return "supports dtypes " + list + ", not " + std::string(dtype_name(dtype));
  }
  if (spec.quant.quantized() && !c.quantized_weights)
    return "does not accept quantized (FP8 / FP4) expert weights in this build";
  if (spec.quant.quantized() && spec.quant.activations == QuantScheme::Activations::kStatic)
    return "quantizes activations at run time (activation_scheme 'dynamic'); static activation "
           "scales are not supported";
  return {};
}

void validate_experts_inputs(const ExpertsSpec& spec, const Tensor& hidden, const Tensor& idx, const Tensor& tw) {
  if (!hidden.defined() || hidden.dim() != 2 || hidden.size(1) != spec.hidden)
    throw InvalidInput("hidden must be [T, " + std::to_string(spec.hidden) + "], got " +
                       (hidden.defined() ? shape_str(hidden.shape()) : std::string("nothing")));
  if (!is_floating(hidden.dtype()) || hidden.dtype() == DType::kFP4x2 || hidden.dtype() == DType::kF8E4M3 ||
      hidden.dtype() == DType::kF8E8M0)
    throw InvalidInput("hidden must be a float tensor, got " + std::string(dtype_name(hidden.dtype())));
  const int64_t T = hidden.size(0);
  if (!idx.defined() || idx.dim() != 2 || idx.size(0) != T)
    throw InvalidInput("top_k_index must be [" + std::to_string(T) + ", k], got " +
                       (idx.defined() ? shape_str(idx.shape()) : std::string("nothing")));
  if (idx.dtype() != DType::kI64 && idx.dtype() != DType::kI32)
    throw InvalidInput("top_k_index must be int64 or int32, got " +
                       std::string(dtype_name(idx.dtype())));
  const int64_t k = idx.size(1), E = spec.num_experts;
  if (!tw.defined() || tw.dim() != 2 || tw.size(0) != T ||
      (tw.size(1) != k && tw.size(1) != E))
    throw InvalidInput("top_k_weights must be [T, k] = [" + std::to_string(T) + ", " +
                       std::to_string(k) + "] or [T, E] = [" + std::to_string(T) + ", " +
                       std::to_string(E) + "], got " +
                       (tw.defined() ? shape_str(tw.shape()) : std::string("nothing")));
  if (tw.dtype() != DType::kF32 && tw.dtype() != DType::kBF16 && tw.dtype() != DType::kF16)
    throw InvalidInput("top_k_weights must be a float tensor, got " +
                       std::string(dtype_name(tw.dtype())));
}

namespace {

// Validates the call at the library boundary and returns the problem a backend computes on.
ExpertsProblem make_problem(const ExpertsBackend& b, std::string_view name, const ExpertsSpec& spec,
                            const ExpertsWeights& weights, const Tensor& hidden,
                            const Tensor& idx, const Tensor& tw) {
  validate_experts_inputs(spec, hidden, idx, tw);
  const int64_t T = hidden.size(0), k = idx.size(1);
  if (spec.quant.quantized()) {
    // Quantized weights: the activations are any float dtype the backend computes in.
    if (hidden.dtype() != DType::kF32 && hidden.dtype() != DType::kBF16 &&
        hidden.dtype() != DType::kF16)
      throw InvalidInput("hidden must be float32, bfloat16 or float16 with quantized experts, got " +
                         std::string(dtype_name(hidden.dtype())));
  } else if (hidden.dtype() != weights.dtype())
    throw InvalidInput("hidden is " + std::string(dtype_name(hidden.dtype())) +
                       " but the expert weights are " + std::string(dtype_name(weights.dtype())));
  Device dev = weights.device();
  for (const Tensor* t : {&hidden, &idx, &tw})
    if (t->device() != dev)
      throw InvalidInput("experts inputs must be on the weights' device " + dev.str() + ", got " +
                         t->str());
  if (std::string why = b.unsupported_reason(spec, hidden.dtype(), dev); !why.empty())
    throw Unsupported("experts backend '" + std::string(name) + "' cannot run " + spec.str() +
                      " in " + std::string(dtype_name(hidden.dtype())) + " on " + dev.str() +
                      ": it " + why);
  ExpertsProblem p;
  p.spec = &spec;
  p.weights = &weights;
  p.hidden = hidden.contiguous();
  p.top_k_index = idx.contiguous();
  p.top_k_weights = tw.contiguous();
  // When k == E a [T, k] and a [T, E] tensor look alike; they mean the same only if read as
  // [T, k], which is what transformers does (it checks the shape against k first).
  p.weights_per_expert = tw.size(1) != k;
  // Ids are checked here when they are host-visible; device ids cannot be read without a sync,
  // so device kernels treat negative ids like sentinels (docs/design.md, "The experts call").
  if (dev.host_accessible()) {
    int64_t n = T * k;
    for (int64_t i = 0; i < n; ++i) {
      int64_t id = p.top_k_index.dtype() == DType::kI64 ? p.top_k_index.data<int64_t>()[i]
                                                       : p.top_k_index.data<int32_t>()[i];
      if (id < 0)
        throw InvalidInput("top_k_index[" + std::to_string(i / std::max<int64_t>(k, 1)) + ", " +
                           std::to_string(i % std::max<int64_t>(k, 1)) + "] = " +
                           std::to_string(id) + " is negative");
    }
  }
  return p;
}

}  // namespace

namespace {

// Whether the implementation of `name` that serves `device` takes the per-expert form.
bool reads_per_expert(std::string_view name, Device device) {
  for (const auto& impl : experts_backend_implementations(name)) {
    const BackendCaps c = impl->caps();
    for (DeviceKind k : c.devices)
      if (k == device.kind) return c.reads_per_expert;
  }
  return false;
}

}  // namespace

Tensor experts_forward(std::string_view backend, const ExpertsSpec& spec,
                       const ExpertsWeights& weights, const Tensor& hidden,
                       const Tensor& top_k_index, const Tensor& top_k_weights) {
  validate_experts_weights(spec, weights);
  auto b = get_experts_backend(backend);
  ExpertsProblem p = make_problem(*b, backend, spec, weights, hidden, top_k_index, top_k_weights);
  // A one-off call: a backend that needs the fused form gets a temporary fused copy.
  const ExpertsWeights given = weights.fused() || reads_per_expert(backend, weights.device())
                                   ? weights
                                   : fuse_experts_weights(spec, weights);
  p.weights = &given;
  auto prepared = b->prepare(spec, given);
  p.prepared = prepared.get();
  Tensor out = Tensor::empty({p.tokens(), spec.hidden}, hidden.dtype(), hidden.device());
  b->forward(p, out, ExecContext::on(hidden.device()));
  return out;
}

struct PreparedCache {
  std::mutex mu;
  struct Entry {
    std::shared_ptr<const ExpertsBackend> backend;
    std::shared_ptr<PreparedExperts> prepared;
    // The fused copy when this backend needs it, else null: the module's stored weights (not a
    // pointer to them: modules sharing this cache may move or die).
    const ExpertsWeights* fused;
  };
  // Keyed by backend instance: re-registering a name gives a new instance and a fresh prepare.
  std::unordered_map<const ExpertsBackend*, Entry> entries;
  // The fused form of per-expert weights, made at the first need and never changed after.
  std::unique_ptr<const ExpertsWeights> fused;
};

Experts::Experts(ExpertsSpec spec, ExpertsWeights weights)
    : spec_(std::move(spec)), weights_(std::move(weights)),
      cache_(std::make_shared<PreparedCache>()) {
  check_env_switches();
  validate_experts_weights(spec_, weights_);
}

namespace {

// With cache.mu held.
const ExpertsWeights& fused_locked(PreparedCache& cache, const ExpertsSpec& spec,
                                   const ExpertsWeights& stored) {
  if (stored.fused()) return stored;
  if (!cache.fused)
    cache.fused = std::make_unique<const ExpertsWeights>(fuse_experts_weights(spec, stored));
  return *cache.fused;
}

const PreparedCache::Entry& cached_prepare(PreparedCache& cache, std::string_view name,
                                           const std::shared_ptr<const ExpertsBackend>& b,
                                           const ExpertsSpec& spec, const ExpertsWeights& stored) {
  std::lock_guard<std::mutex> lock(cache.mu);
  auto it = cache.entries.find(b.get());
  if (it == cache.entries.end()) {
    const ExpertsWeights* fused = stored.fused() || reads_per_expert(name, stored.device())
                                      ? nullptr
                                      : &fused_locked(cache, spec, stored);
    std::shared_ptr<PreparedExperts> prepared(b->prepare(spec, fused ? *fused : stored));
    it = cache.entries.emplace(b.get(), PreparedCache::Entry{b, std::move(prepared), fused}).first;
  }
  return it->second;  // entries are never erased: the reference stays valid
}

}  // namespace

const ExpertsWeights& Experts::weights() const {
  if (weights_.fused()) return weights_;
  std::lock_guard<std::mutex> lock(cache_->mu);
  return fused_locked(*cache_, spec_, weights_);
}

void Experts::prepare(std::string_view backend) const {
  if (!spec_.quant.quantized()) return prepare(backend, weights_.dtype());
  // Quantized weights: the activations are the caller's, not known here. Refused only when no
  // activation dtype is served (the first dtype's reason names it); forward checks the real one.
  auto b = get_experts_backend(backend);
  std::string first_why;
  for (DType act : {DType::kBF16, DType::kF16, DType::kF32}) {
    std::string why = b->unsupported_reason(spec_, act, weights_.device());
    if (why.empty()) return (void)cached_prepare(*cache_, backend, b, spec_, weights_);
    if (first_why.empty()) first_why = std::move(why);
  }
  throw Unsupported("experts backend '" + std::string(backend) + "' cannot prepare " + spec_.str() + ": it " +
                    first_why);
}

void Experts::prepare(std::string_view backend, DType activation_dtype) const {
  auto b = get_experts_backend(backend);
  if (std::string why = b->unsupported_reason(spec_, activation_dtype, weights_.device()); !why.empty())
    throw Unsupported("experts backend '" + std::string(backend) + "' cannot prepare " + spec_.str() + ": it " +
                      why);
  (void)cached_prepare(*cache_, backend, b, spec_, weights_);
}

Tensor Experts::forward(std::string_view backend, const Tensor& hidden, const Tensor& idx,
                        const Tensor& tw) const {
  Tensor out = Tensor::empty({hidden.defined() && hidden.dim() == 2 ? hidden.size(0) : 0, spec_.hidden},
                             hidden.defined() ? hidden.dtype() : weights_.dtype(),
                             hidden.defined() ? hidden.device() : weights_.device());
  forward(backend, hidden, idx, tw, out, ExecContext::on(out.device()));
  return out;
}

void Experts::forward(std::string_view backend, const Tensor& hidden, const Tensor& idx,
                      const Tensor& tw, Tensor& out, const ExecContext& ctx) const {
  auto b = get_experts_backend(backend);
  ExpertsProblem p = make_problem(*b, backend, spec_, weights_, hidden, idx, tw);
  if (!out.defined() || out.shape() != Shape{p.tokens(), spec_.hidden} ||
      out.dtype() != hidden.dtype() || out.device() != hidden.device() || !out.is_contiguous())
    throw InvalidInput("experts output must be a contiguous " +
                       std::string(dtype_name(hidden.dtype())) + " tensor of shape " +
                       shape_str({p.tokens(), spec_.hidden}) + " on " + hidden.device().str() +
                       ", got " + (out.defined() ? out.str() : std::string("nothing")));
  if (ctx.device != hidden.device())
    throw InvalidInput("execution context is on " + ctx.device.str() + " but the experts inputs are on " +
                       hidden.device().str());
  const PreparedCache::Entry& entry = cached_prepare(*cache_, backend, b, spec_, weights_);
  if (entry.fused) p.weights = entry.fused;
  p.prepared = entry.prepared.get();
  b->forward(p, out, ctx.resolved());
}

}  // namespace moex
