// CudaExpertsBackend: see experts_backend.hpp.
#include "cuda/experts_backend.hpp"

#include <algorithm>
#include <mutex>
#include <unordered_map>

#include "cuda/runtime.hpp"

namespace moex::cuda {

namespace {

// Per-weights state: one grow-only Workspace per stream (moex/context.hpp: old blocks stay
// allocated until this object dies, because a captured graph may still point into them).
struct CudaPrepared : PreparedExperts {
  int device = 0;
  std::mutex mu;
  std::unordered_map<cudaStream_t, Workspace> per_stream;

  void* workspace(cudaStream_t s, size_t bytes, bool capturing) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = per_stream.try_emplace(s, Device::cuda(device)).first;
    return it->second.get(bytes, capturing);
  }
};

Elem to_elem(DType t) {
  switch (t) {
    case DType::kF32: return Elem::kF32;
    case DType::kF16: return Elem::kF16;
    case DType::kBF16: return Elem::kBF16;
    default: throw Unsupported("CUDA experts backends take float32, float16 or bfloat16, not " +
                               std::string(dtype_name(t)));
  }
}


// route_by_expert keeps three ints per expert in one block's shared memory (192 KB at 16384).
constexpr int64_t kMaxExperts = 16384;

}  // namespace

ExpertsArgs args_of(const ExpertsProblem& pr, Tensor& out) {
  const ExpertsSpec& s = *pr.spec;
  const ExpertsWeights& w = *pr.weights;
  ExpertsArgs a;
  a.elem = to_elem(pr.hidden.dtype());
  a.tokens = pr.tokens();
  a.top_k = int(pr.top_k());
  a.experts = int(s.num_experts);
  a.hidden = int(s.hidden);
  a.intermediate = int(s.intermediate);
  a.gated = s.has_gate;
  a.has_bias = s.has_bias;
  a.transposed = s.is_transposed;
  a.concatenated = s.is_concatenated;
  a.act = s.act;
  a.limit = s.swiglu_limit;
  a.alpha = s.swiglu_alpha;
  a.hidden_states = pr.hidden.raw();
  a.top_k_index = pr.top_k_index.raw();
  a.index_i64 = pr.top_k_index.dtype() == DType::kI64;
  a.top_k_weights = pr.top_k_weights.raw();
  a.weights_elem = to_elem(pr.top_k_weights.dtype());  // (validated float at the boundary)
  a.weights_per_expert = pr.weights_per_expert;
  a.gate_up = w.gate_up.raw();
  a.down = w.down.raw();
  a.gate_up_bias = s.has_bias ? w.gate_up_bias.raw() : nullptr;
  a.down_bias = s.has_bias ? w.down_bias.raw() : nullptr;
  a.out = out.raw();
  if (s.quant.quantized()) {
    a.quantized = true;
    const bool fp4 = s.quant.kind == QuantScheme::Kind::kFp4E2M1;
    const bool e8m0 = s.quant.scale_dtype == DType::kF8E8M0;
    const int64_t bn = s.quant.block_n;
    auto weight_args = [&](const Tensor& scale) {
      QuantWeightArgs q;
      q.fp4 = fp4;
      q.scale_e8m0 = e8m0;
      q.scale = scale.raw();
      q.scale_expert_stride = scale.numel() / std::max<int64_t>(s.num_experts, 1);
      q.block_n = int(bn);
      return q;
    };
    a.gate_up_q = weight_args(w.gate_up_scale);
    a.down_q = weight_args(w.down_scale);
  }
  return a;
}

DeviceDescription describe_cuda_device(int device) {
  const DeviceInfo& i = device_info(device);
  DeviceDescription d;
  d.cuda = true;
  d.cc_major = i.major;
  d.cc_minor = i.minor;
  d.name = i.name;
  return d;
}

BackendCaps CudaExpertsBackend::caps() const {
  BackendCaps c;
  c.devices = {DeviceKind::kCUDA};
  c.dtypes = {DType::kBF16, DType::kF16, DType::kF32};
  c.graph_capturable = capturable();
  c.quantized_weights = true;  // FP8 / FP4 experts run the quantized CUDA-core GEMMs
  c.description = "CUDA: " + description();
  return c;
}

std::string CudaExpertsBackend::unsupported_reason(const ExpertsSpec& spec, DType dtype,
                                                   Device device) const {
  std::string why = ExpertsBackend::unsupported_reason(spec, dtype, device);
  if (!why.empty()) return why;
  if (spec.hidden > (int64_t(1) << 30) || spec.intermediate > (int64_t(1) << 30))
    return "supports hidden and intermediate sizes below 2^30";
  if (spec.num_experts > kMaxExperts)
    return "supports at most " + std::to_string(kMaxExperts) + " local experts";
  return {};
}

std::unique_ptr<PreparedExperts> CudaExpertsBackend::prepare(const ExpertsSpec&,
                                                             const ExpertsWeights& weights) const {
  auto p = std::make_unique<CudaPrepared>();
  p->device = weights.gate_up.device().index;
  return p;
}

void CudaExpertsBackend::forward(const ExpertsProblem& pr, Tensor& out,
                                 const ExecContext& ctx) const {
  const int dev = pr.hidden.device().index;
  DeviceGuard guard(dev);
  // (A context built by hand and passed straight to the backend may hold no stream.)
  cudaStream_t stream = ctx.stream ? static_cast<cudaStream_t>(ctx.stream) : current_stream();
  if (pr.tokens() == 0) return;
  if (pr.top_k() == 0) {  // every output is an empty sum
    if (out.nbytes()) MOEX_CUDA_CHECK(cudaMemsetAsync(out.raw(), 0, out.nbytes(), stream));
    return;
  }
  // Sorted positions and tile rows are int32 on the device.
  if (pr.tokens() * pr.top_k() >= (int64_t(1) << 31))
    throw Unsupported("CUDA experts backends take at most 2^31 - 1 (token, slot) pairs per call, "
                      "got " +
                      std::to_string(pr.tokens() * pr.top_k()));
  const ExpertsArgs a = args_of(pr, out);
  const ExpertsPlan p = plan(a, traits_of(dev));
  const size_t bytes = workspace_bytes(a, p);
  if (ctx.workspace) {
    run(a, p, ctx.workspace->get(bytes, ctx.capturing), stream);
  } else if (auto* prepared = dynamic_cast<const CudaPrepared*>(pr.prepared)) {
    run(a, p, const_cast<CudaPrepared*>(prepared)->workspace(stream, bytes, ctx.capturing), stream);
  } else {
    // No prepared state: a call-scoped workspace, returned to the cache in stream order.
    void* ws = cache_alloc(bytes, dev);
    try {
      run(a, p, ws, stream);
    } catch (...) {
      cache_free(ws, dev);
      throw;
    }
    cache_free(ws, dev);
  }
}

}  // namespace moex::cuda
