// The one place where an op picks its implementation by the device of its tensors: host tensors
// run src/ops/cpu/*, CUDA tensors src/ops/cuda/* (CUDA builds).
#include <cmath>
#include <string>

#include "moex/error.hpp"
#include "ops/cpu/cpu_ops.hpp"
#if MOEX_WITH_CUDA
#include "ops/cuda/cuda_ops.hpp"
#endif
#include "ops/ops.hpp"

namespace moex::ops {

namespace {

// Runs `host` for host-accessible tensors and `device` for CUDA tensors. A CPU-only build has
// no device implementations; a CUDA tensor cannot exist there (allocation says "built without
// CUDA"), so that branch only guards against misuse.
template <class Host, class Dev>
decltype(auto) dispatch([[maybe_unused]] const char* op, Device device, Host&& host, [[maybe_unused]] Dev&& dev) {
  if (device.is_cuda()) {
#if MOEX_WITH_CUDA
    return dev();
#else
    throw Unsupported(std::string("op '") + op + "' on a CUDA tensor in a build without CUDA");
#endif
  }
  return host();
}

}  // namespace

#if MOEX_WITH_CUDA
#define MOEX_OPS_DEVICE(...) [&] { return cuda::__VA_ARGS__; }
#else
#define MOEX_OPS_DEVICE(...) [&] { throw Unsupported("no CUDA in this build"); }
#endif

void make_device_step(Step& step, Device device) {
  if (!device.is_cuda()) {
    step.device = Tensor();
    return;
  }
  dispatch("make_device_step", device, [] {}, MOEX_OPS_DEVICE(make_device_step(step, device)));
}

void finish_background_work() {
#if MOEX_WITH_CUDA
  cuda::finish_background_work();
#endif
}

void kv_append(LayerKV& kv, const Tensor& k, const Tensor& v, const Step& step) {
  dispatch("kv_append", k.device(), [&] { cpu::kv_append(kv, k, v, step); }, MOEX_OPS_DEVICE(kv_append(kv, k, v, step)));
}

Tensor kv_columns(const Tensor& cache, int64_t n) {
  return dispatch("kv_columns", cache.device(), [&] { return cpu::kv_columns(cache, n); }, MOEX_OPS_DEVICE(kv_columns(cache, n)));
}

void round_(Tensor& x, DType act) {
  dispatch("round", x.device(), [&] { cpu::round_(x, act); }, MOEX_OPS_DEVICE(round_(x, act)));
}
void add_(Tensor& a, const Tensor& b, DType act) {
  dispatch("add", a.device(), [&] { cpu::add_(a, b, act); }, MOEX_OPS_DEVICE(add_(a, b, act)));
}
void clamp_(Tensor& x, float limit) {
  dispatch("clamp", x.device(), [&] { cpu::clamp_(x, limit); }, MOEX_OPS_DEVICE(clamp_(x, limit)));
}
void gated_activation_(Tensor& gate, const Tensor& up, Activation act_fn, DType act) {
  dispatch("gated_activation", gate.device(), [&] { cpu::gated_activation_(gate, up, act_fn, act); }, MOEX_OPS_DEVICE(gated_activation_(gate, up, act_fn, act)));
}
void add_gated_(Tensor& y, const Tensor& shared, const Tensor& gate_logit, DType act) {
  dispatch("add_gated", y.device(), [&] { cpu::add_gated_(y, shared, gate_logit, act); }, MOEX_OPS_DEVICE(add_gated_(y, shared, gate_logit, act)));
}
void add_gated_residual_(Tensor& residual, Tensor& y, const Tensor& shared, const Tensor& gate_logit, DType act) {
  dispatch(
      "add_gated", y.device(),
      [&] {
        cpu::add_gated_(y, shared, gate_logit, act);
        cpu::add_(residual, y, act);
      },
      MOEX_OPS_DEVICE(add_gated_residual_(residual, y, shared, gate_logit, act)));
}
Tensor embedding(const Tensor& table, const Step& step, DType act) {
  return dispatch("embedding", table.device(), [&] { return cpu::embedding(table, step, act); },
                  MOEX_OPS_DEVICE(embedding(table, step, act)));
}
Tensor slice_columns(const Tensor& x, int64_t groups, int64_t begin, int64_t width) {
  return dispatch("slice_columns", x.device(), [&] { return cpu::slice_columns(x, groups, begin, width); }, MOEX_OPS_DEVICE(slice_columns(x, groups, begin, width)));
}
Tensor concat_columns(const Tensor& a, const Tensor& b, int64_t groups, bool b_shared) {
  return dispatch("concat_columns", a.device(), [&] { return cpu::concat_columns(a, b, groups, b_shared); }, MOEX_OPS_DEVICE(concat_columns(a, b, groups, b_shared)));
}
Tensor last_rows(const Tensor& x, const Step& step) {
  return dispatch("last_rows", x.device(), [&] { return cpu::last_rows(x, step); }, MOEX_OPS_DEVICE(last_rows(x, step)));
}

void rms_norm_(Tensor& x, const Tensor& weight, float eps, DType act, int64_t group, RmsNormStyle style) {
  dispatch("rms_norm", x.device(), [&] { cpu::rms_norm_(x, weight, eps, act, group, style); }, MOEX_OPS_DEVICE(rms_norm_(x, weight, eps, act, group, style)));
}
Tensor rms_norm(const Tensor& x, const Tensor& weight, float eps, DType act, int64_t group, RmsNormStyle style) {
  return dispatch(
      "rms_norm", x.device(),
      [&] {
        Tensor y = x.clone();
        cpu::rms_norm_(y, weight, eps, act, group, style);
        return y;
      },
      MOEX_OPS_DEVICE(rms_norm(x, weight, eps, act, group, style)));
}
Tensor add_rms_norm(Tensor& h, const Tensor& delta, const Tensor& weight, float eps, DType act, RmsNormStyle style) {
  return dispatch(
      "add_rms_norm", h.device(),
      [&] {
        cpu::add_(h, delta, act);
        Tensor y = h.clone();
        cpu::rms_norm_(y, weight, eps, act, 0, style);
        return y;
      },
      MOEX_OPS_DEVICE(add_rms_norm(h, delta, weight, eps, act, style)));
}

void rope_(Tensor& x, int64_t heads, int64_t head_stride, int64_t offset, const Rope& rope,
           RopeLayout layout, const Step& step, DType act) {
  dispatch("rope", x.device(), [&] { cpu::rope_(x, heads, head_stride, offset, rope, layout, step, act); }, MOEX_OPS_DEVICE(rope_(x, heads, head_stride, offset, rope, layout, step, act)));
}

void rope2_(Tensor& a, int64_t heads_a, Tensor& b, int64_t heads_b, int64_t head_stride, int64_t offset,
            const Rope& rope, RopeLayout layout, const Step& step, DType act) {
  dispatch(
      "rope", a.device(),
      [&] {
        cpu::rope_(a, heads_a, head_stride, offset, rope, layout, step, act);
        cpu::rope_(b, heads_b, head_stride, offset, rope, layout, step, act);
      },
      MOEX_OPS_DEVICE(rope2_(a, heads_a, b, heads_b, head_stride, offset, rope, layout, step, act)));
}

void rope_kv_append_(Tensor& q, int64_t heads_q, Tensor& k, int64_t heads_k, const Tensor& v, LayerKV& kv,
                     int64_t head_dim, const Rope& rope, RopeLayout layout, const Step& step, DType act) {
  dispatch(
      "rope_kv_append", q.device(),
      [&] {
        rope2_(q, heads_q, k, heads_k, head_dim, 0, rope, layout, step, act);
        kv_append(kv, k, v, step);
      },
      MOEX_OPS_DEVICE(rope_kv_append_(q, heads_q, k, heads_k, v, kv, head_dim, rope, layout, step, act)));
}

LinearWeight prepare_linear(const Tensor& weight, bool keep_tensor) {
  if (weight.device().is_cuda()) {
    LinearWeight w;
    w.tensor = weight;
    w.out = weight.size(0);
    w.in = weight.size(1);
    w.dtype = weight.dtype();
    return w;
  }
  return cpu::prepare_linear(weight, keep_tensor);
}

LinearWeight prepare_quantized_linear(const Tensor& codes, const Tensor& scale, const QuantScheme& quant,
                                      int64_t out, int64_t in) {
  // Both devices run quantized linears in place (host: src/cpu/quant_linear.cpp; CUDA:
  // src/ops/cuda/linear_quant.cu): nothing is converted. The host keeps its codes on huge pages
  // (cpu::prepare_quantized_codes).
  LinearWeight w;
  w.tensor = codes.defined() && codes.device().is_cpu() ? cpu::prepare_quantized_codes(codes) : codes;
  w.scale = scale;
  w.quant = quant;
  w.out = out;
  w.in = in;
  w.dtype = codes.dtype();
  return w;
}

Tensor linear(const Tensor& x, const LinearWeight& weight, const Tensor& bias, DType act) {
  if (weight.quantized())
    return dispatch("linear", x.device(), [&] { return cpu::linear(x, weight, bias, act); },
                    MOEX_OPS_DEVICE(linear_quantized(x, weight, bias, act)));
  return dispatch("linear", x.device(), [&] { return cpu::linear(x, weight, bias, act); },
                  MOEX_OPS_DEVICE(linear(x, weight.tensor, bias, act)));
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias, DType act) {
  return dispatch("linear", x.device(), [&] { return cpu::linear(x, weight, bias, act); }, MOEX_OPS_DEVICE(linear(x, weight, bias, act)));
}

std::vector<Tensor> linears(const Tensor& x, std::span<const LinearOf> ls, DType act) {
  auto each = [&] {
    std::vector<Tensor> ys;
    ys.reserve(ls.size());
    for (const LinearOf& l : ls) ys.push_back(linear(x, *l.weight, l.bias ? *l.bias : Tensor(), act));
    return ys;
  };
  return dispatch("linears", x.device(), each, MOEX_OPS_DEVICE(linears(x, ls, act)));
}

std::vector<Tensor> norm_linears(Tensor& h, const Tensor* delta, const NormOf& norm, std::span<const LinearOf> ls,
                                 DType act, Tensor* x_out) {
  auto each = [&] {
    Tensor x = delta ? add_rms_norm(h, *delta, *norm.weight, norm.eps, act, norm.style)
                     : rms_norm(h, *norm.weight, norm.eps, act, 0, norm.style);
    std::vector<Tensor> ys = linears(x, ls, act);
    if (x_out) *x_out = std::move(x);
    return ys;
  };
  return dispatch("norm_linears", h.device(), each, MOEX_OPS_DEVICE(norm_linears(h, delta, norm, ls, act, x_out)));
}

Tensor linear_per_group(const Tensor& x, const GroupedWeight& w, bool transpose_weight, DType act) {
  return dispatch("linear_per_group", x.device(), [&] { return cpu::linear_per_group(x, w, transpose_weight, act); },
                  MOEX_OPS_DEVICE(linear_per_group(x, w, transpose_weight, act)));
}

Tensor attention(const Tensor& q, const LayerKV& kv, const Step& step, const AttentionSpec& spec, DType act) {
  return dispatch("attention", q.device(), [&] { return cpu::attention(q, kv, step, spec, act); }, MOEX_OPS_DEVICE(attention(q, kv, step, spec, act)));
}

Routing softmax_topk(const Tensor& logits, int64_t k, bool normalize, DType weights_dtype) {
  return dispatch("softmax_topk", logits.device(), [&] { return cpu::softmax_topk(logits, k, normalize, weights_dtype); }, MOEX_OPS_DEVICE(softmax_topk(logits, k, normalize, weights_dtype)));
}
Routing topk_softmax(const Tensor& logits, int64_t k, DType act) {
  return dispatch("topk_softmax", logits.device(), [&] { return cpu::topk_softmax(logits, k, act); }, MOEX_OPS_DEVICE(topk_softmax(logits, k, act)));
}
Routing sigmoid_group_topk(const Tensor& logits, const Tensor& correction, const GroupLimitedTopk& spec) {
  return dispatch("sigmoid_group_topk", logits.device(), [&] { return cpu::sigmoid_group_topk(logits, correction, spec); }, MOEX_OPS_DEVICE(sigmoid_group_topk(logits, correction, spec)));
}

// Host helpers of choose_tokens (tests call them on host logits).
int64_t argmax_row(const Tensor& logits, int64_t row) {
  if (!logits.device().host_accessible()) throw Unsupported("argmax_row needs host logits; use choose_tokens");
  return cpu::argmax_row(logits, row);
}
int64_t sample_row(const Tensor& logits, int64_t row, const SamplingSpec& spec, std::mt19937_64& rng) {
  if (!logits.device().host_accessible()) throw Unsupported("sample_row needs host logits; use choose_tokens");
  return cpu::sample_row(logits, row, spec, rng);
}

std::vector<int64_t> choose_tokens(const Tensor& logits, const SamplingSpec* sampling, std::mt19937_64& rng) {
  return choose_tokens(logits, sampling, rng, nullptr);
}

std::vector<int64_t> choose_tokens(const Tensor& logits, const SamplingSpec* sampling, std::mt19937_64& rng,
                                   std::vector<int64_t>* nonfinite) {
  return dispatch(
      "choose_tokens", logits.device(),
      [&] {
        const int64_t B = logits.size(0);
        std::vector<int64_t> ids(static_cast<size_t>(B));
        for (int64_t b = 0; b < B; ++b)
          ids[size_t(b)] = sampling ? cpu::sample_row(logits, b, *sampling, rng) : cpu::argmax_row(logits, b);
        if (nonfinite) {
          nonfinite->assign(size_t(B), 0);
          const Tensor f = logits.dtype() == DType::kF32 ? logits.contiguous() : logits.to(DType::kF32);
          const float* p = f.data<float>();
          const int64_t V = f.size(1);
          for (int64_t i = 0; i < B * V; ++i) (*nonfinite)[size_t(i / V)] += !std::isfinite(p[i]);
        }
        return ids;
      },
      MOEX_OPS_DEVICE(choose_tokens(logits, sampling, rng, nonfinite)));
}

// (The host branches throw: a CPU-only build uses no argument.)
void make_device_feed([[maybe_unused]] DeviceFeed& feed, [[maybe_unused]] const std::vector<int64_t>& stop_token,
                      [[maybe_unused]] const std::vector<int64_t>& eos,
                      [[maybe_unused]] const std::vector<uint64_t>& seeds, Device device) {
  dispatch(
      "make_device_feed", device,
      [] { throw Unsupported("make_device_feed: the host chooses tokens on the host (choose_tokens)"); },
      MOEX_OPS_DEVICE(make_device_feed(feed, stop_token, eos, seeds, device)));
}

void choose_and_feed(const Tensor& logits, [[maybe_unused]] const SamplingSpec* sampling, [[maybe_unused]] Step& step,
                     [[maybe_unused]] DeviceFeed& feed) {
  dispatch(
      "choose_and_feed", logits.device(),
      [] { throw Unsupported("choose_and_feed: the host chooses tokens on the host (choose_tokens)"); },
      MOEX_OPS_DEVICE(choose_and_feed(logits, sampling, step, feed)));
}

}  // namespace moex::ops
