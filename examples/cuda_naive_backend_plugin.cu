// A CUDA-only experts backend, registered from outside the library: one class and one
// registration line (see reference_backend_plugin.cpp for the host-side twin).
//
// Build it as a shared library linked against libmoex (CMakeLists.txt builds it as
// moex_cuda_example_plugin when CUDA is on); `moex --plugin libX.so ...` or dlopen loads it and
// "cuda_naive" serves calls whose tensors live on a CUDA device. On other devices the registry
// answers Unsupported ("it runs on cuda:0, not on cpu"), never a silent fallback.
//
// The kernel is deliberately naive (one block per token, fp32 CUDA-core dot products, the k
// activated intermediates in shared memory) and follows the numerics contract of
// moex/experts.hpp: fp32 accumulation, the intermediate rounded to the activation dtype before the
// down projection, the k contributions summed in fp32 in slot order and rounded once. It serves
// gated, concatenated, non-transposed SiLU experts without biases (the Mixtral / Qwen / DeepSeek
// layout) with k * I <= 12288; unsupported_reason says so for anything else.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <memory>
#include <string>

#include "moex/error.hpp"
#include "moex/experts.hpp"

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxSharedFloats = 12288;  // 48 KB of activated intermediates per block

__device__ float load(const float* p, int64_t i) { return p[i]; }
__device__ float load(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }
__device__ float round_to(float v, const float*) { return v; }
__device__ float round_to(float v, const __nv_bfloat16*) {
  return __bfloat162float(__float2bfloat16(v));
}
__device__ void store(float* p, int64_t i, float v) { p[i] = v; }
__device__ void store(__nv_bfloat16* p, int64_t i, float v) { p[i] = __float2bfloat16(v); }

// out[t] = sum_j w(t, j) * down_e(silu(gate_e x) * up_e x), e = idx[t, j] < E.
template <class T, class I, class W>
__global__ void naive_experts_kernel(const T* x, const I* idx, const W* tw, bool per_expert,
                                     const T* gate_up, const T* down, int k, int E, int H,
                                     int inter, T* out) {
  extern __shared__ float h[];  // [k, inter]
  const int64_t t = blockIdx.x;
  const T* xt = x + t * H;
  for (int j = 0; j < k; ++j) {
    const int64_t e = int64_t(idx[t * k + j]);
    if (e < 0 || e >= E) continue;  // expert-parallel sentinel
    for (int i = threadIdx.x; i < inter; i += blockDim.x) {
      const T* g = gate_up + (e * 2 * inter + i) * int64_t(H);
      const T* u = g + int64_t(inter) * H;
      float gs = 0.f, us = 0.f;
      for (int c = 0; c < H; ++c) {
        const float xv = load(xt, c);
        gs += load(g, c) * xv;
        us += load(u, c) * xv;
      }
      // One rounding, of the activated intermediate, as the library's kernels do.
      h[j * inter + i] = round_to(gs / (1.f + expf(-gs)) * us, x);
    }
  }
  __syncthreads();
  for (int o = threadIdx.x; o < H; o += blockDim.x) {
    float acc = 0.f;
    for (int j = 0; j < k; ++j) {
      const int64_t e = int64_t(idx[t * k + j]);
      if (e < 0 || e >= E) continue;
      const T* d = down + (e * H + o) * int64_t(inter);
      float y = 0.f;
      for (int i = 0; i < inter; ++i) y += load(d, i) * h[j * inter + i];
      acc += load(tw, per_expert ? t * E + e : t * k + j) * y;
    }
    store(out, t * H + o, acc);
  }
}

template <class T, class I, class W>
void launch(const moex::ExpertsProblem& p, moex::Tensor& out, cudaStream_t s) {
  const moex::ExpertsSpec& sp = *p.spec;
  const int k = int(p.top_k());
  const size_t smem = sizeof(float) * size_t(k) * size_t(sp.intermediate);
  naive_experts_kernel<T, I, W><<<unsigned(p.tokens()), kThreads, smem, s>>>(
      p.hidden.data<T>(), p.top_k_index.data<I>(), p.top_k_weights.data<W>(), p.weights_per_expert,
      p.weights->gate_up.data<T>(), p.weights->down.data<T>(), k, int(sp.num_experts),
      int(sp.hidden), int(sp.intermediate), out.data<T>());
  if (cudaError_t e = cudaPeekAtLastError(); e != cudaSuccess)
    throw moex::DeviceError(std::string("cuda_naive: launch failed: ") + cudaGetErrorString(e));
}

template <class T, class I>
void launch_weights(const moex::ExpertsProblem& p, moex::Tensor& out, cudaStream_t s) {
  if (p.top_k_weights.dtype() == moex::DType::kF32) launch<T, I, float>(p, out, s);
  else launch<T, I, __nv_bfloat16>(p, out, s);
}

template <class T>
void launch_index(const moex::ExpertsProblem& p, moex::Tensor& out, cudaStream_t s) {
  if (p.top_k_index.dtype() == moex::DType::kI64) launch_weights<T, int64_t>(p, out, s);
  else launch_weights<T, int32_t>(p, out, s);
}

class CudaNaiveBackend final : public moex::ExpertsBackend {
 public:
  moex::BackendCaps caps() const override {
    moex::BackendCaps c;
    c.devices = {moex::DeviceKind::kCUDA};
    c.dtypes = {moex::DType::kF32, moex::DType::kBF16};
    c.graph_capturable = true;  // one launch, no allocation, no synchronisation
    c.description = "naive CUDA kernel, one block per token (example plugin)";
    return c;
  }
  std::string unsupported_reason(const moex::ExpertsSpec& s, moex::DType dtype,
                                 moex::Device device) const override {
    if (std::string why = ExpertsBackend::unsupported_reason(s, dtype, device); !why.empty())
      return why;
    if (!s.has_gate || !s.is_concatenated || s.is_transposed || s.has_bias ||
        s.act != moex::Activation::kSilu)
      return "serves gated, concatenated, non-transposed SiLU experts without biases only";
    return {};
  }
  void forward(const moex::ExpertsProblem& p, moex::Tensor& out,
               const moex::ExecContext& ctx) const override {
    if (p.tokens() == 0) return;
    if (p.top_k() * p.spec->intermediate > kMaxSharedFloats)
      throw moex::Unsupported("cuda_naive: k * intermediate must be at most " +
                              std::to_string(kMaxSharedFloats));
    if (p.top_k_weights.dtype() != moex::DType::kF32 && p.top_k_weights.dtype() != moex::DType::kBF16)
      throw moex::Unsupported("cuda_naive: top_k_weights must be float32 or bfloat16");
    if (cudaSetDevice(p.hidden.device().index) != cudaSuccess)
      throw moex::DeviceError("cuda_naive: cannot select " + p.hidden.device().str());
    // The library hands backends a concrete stream (ExecContext::resolved): enqueue there, in
    // order with whatever wrote the inputs.
    auto s = static_cast<cudaStream_t>(ctx.stream);
    if (p.hidden.dtype() == moex::DType::kF32) launch_index<float>(p, out, s);
    else launch_index<__nv_bfloat16>(p, out, s);
  }
};

MOEX_REGISTER_EXPERTS_BACKEND("cuda_naive", CudaNaiveBackend);

}  // namespace
