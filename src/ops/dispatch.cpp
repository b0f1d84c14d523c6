// The one place where an op picks its implementation by the device of its tensors. Host tensors
// run src/ops/cpu/*; CUDA tensors have no implementations in this build and get an Unsupported
// naming the op.
#include <string>

#include "moex/error.hpp"
#include "ops/cpu/cpu_ops.hpp"
#include "ops/ops.hpp"

namespace moex::ops {

namespace {

[[noreturn]] void no_cuda_implementation(const char* op) {
  throw Unsupported(std::string("op '") + op + "' has no CUDA implementation yet; the model ops run "
                    "on host tensors (only the experts run on the GPU)");
}

// Runs `host` for host-accessible tensors; the CUDA branch goes here when CUDA ops exist.
template <class Host>
decltype(auto) dispatch(const char* op, Device device, Host&& host) {
  if (device.is_cuda()) no_cuda_implementation(op);
  return host();
}

}  // namespace

void kv_append(LayerKV& kv, const Tensor& k, const Tensor& v, const Step& step) {
  dispatch("kv_append", k.device(), [&] { cpu::kv_append(kv, k, v, step); });
}

void round_(Tensor& x, DType act) {
  dispatch("round", x.device(), [&] { cpu::round_(x, act); });
}
void add_(Tensor& a, const Tensor& b, DType act) {
  dispatch("add", a.device(), [&] { cpu::add_(a, b, act); });
}
void clamp_(Tensor& x, float limit) {
  dispatch("clamp", x.device(), [&] { cpu::clamp_(x, limit); });
}
void gated_activation_(Tensor& gate, const Tensor& up, Activation act_fn, DType act) {
  dispatch("gated_activation", gate.device(), [&] { cpu::gated_activation_(gate, up, act_fn, act); });
}
void add_gated_(Tensor& y, const Tensor& shared, const Tensor& gate_logit, DType act) {
  dispatch("add_gated", y.device(), [&] { cpu::add_gated_(y, shared, gate_logit, act); });
}
Tensor embedding(const Tensor& table, const std::vector<int64_t>& ids, DType act) {
  return dispatch("embedding", table.device(), [&] { return cpu::embedding(table, ids, act); });
}
Tensor slice_columns(const Tensor& x, int64_t groups, int64_t begin, int64_t width) {
  return dispatch("slice_columns", x.device(), [&] { return cpu::slice_columns(x, groups, begin, width); });
}
Tensor concat_columns(const Tensor& a, const Tensor& b, int64_t groups, bool b_shared) {
  return dispatch("concat_columns", a.device(), [&] { return cpu::concat_columns(a, b, groups, b_shared); });
}
Tensor last_rows(const Tensor& x, const Step& step) {
  return dispatch("last_rows", x.device(), [&] { return cpu::last_rows(x, step); });
}

void rms_norm_(Tensor& x, const Tensor& weight, float eps, DType act, int64_t group, RmsNormStyle style) {
  dispatch("rms_norm", x.device(), [&] { cpu::rms_norm_(x, weight, eps, act, group, style); });
}
Tensor rms_norm(const Tensor& x, const Tensor& weight, float eps, DType act, int64_t group, RmsNormStyle style) {
  Tensor y = x.clone();
  rms_norm_(y, weight, eps, act, group, style);
  return y;
}

void rope_(Tensor& x, int64_t heads, int64_t head_stride, int64_t offset, const Rope& rope,
           RopeLayout layout, const Step& step, DType act) {
  dispatch("rope", x.device(), [&] { cpu::rope_(x, heads, head_stride, offset, rope, layout, step, act); });
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias, DType act) {
  return dispatch("linear", x.device(), [&] { return cpu::linear(x, weight, bias, act); });
}

Tensor attention(const Tensor& q, const LayerKV& kv, const Step& step, const AttentionSpec& spec, DType act) {
  return dispatch("attention", q.device(), [&] { return cpu::attention(q, kv, step, spec, act); });
}

Routing softmax_topk(const Tensor& logits, int64_t k, bool normalize, DType weights_dtype) {
  return dispatch("softmax_topk", logits.device(), [&] { return cpu::softmax_topk(logits, k, normalize, weights_dtype); });
}
Routing topk_softmax(const Tensor& logits, int64_t k, DType act) {
  return dispatch("topk_softmax", logits.device(), [&] { return cpu::topk_softmax(logits, k, act); });
}
Routing sigmoid_group_topk(const Tensor& logits, const Tensor& correction, const GroupLimitedTopk& spec) {
  return dispatch("sigmoid_group_topk", logits.device(), [&] { return cpu::sigmoid_group_topk(logits, correction, spec); });
}

int64_t argmax_row(const Tensor& logits, int64_t row) {
  return dispatch("argmax", logits.device(), [&] { return cpu::argmax_row(logits, row); });
}
int64_t sample_row(const Tensor& logits, int64_t row, const SamplingSpec& spec, std::mt19937_64& rng) {
  return dispatch("sample", logits.device(), [&] { return cpu::sample_row(logits, row, spec, rng); });
}

}  // namespace moex::ops
