// ops::linear on CUDA through cuBLASLt: y = x W^T + b, float32 accumulation, bias added and the
// result rounded once to act in the GEMM's epilogue (what torch's bf16 addmm does on a GPU).
//
// Why cuBLASLt and not an own kernel: the dense projections of a decoder are plain GEMMs (one
// weight, no grouping), where cuBLASLt's Hopper kernels are at the hardware floor for prefill
// sizes; an own kernel would only repeat them. Decode-sized calls (a few rows, 16-bit weights)
// go to linear_gemv.cu instead, where cuBLASLt's kernels were measured far from the bandwidth. float32 models run with CUBLAS_COMPUTE_32F (no TF32), so float32 logits keep
// matching transformers to 1e-4.
//
// Row-major mapping: cuBLASLt is column-major, so the product is computed as
// y^T [out, rows] = W [out, in] . x^T, i.e. A = W (stored [out, in] row-major = [in, out]
// column-major, transposed), B = x ([rows, in] row-major = [in, rows] column-major), D = y.
//
// Plans (matmul descriptors, layouts and the heuristic's algorithm) are cached per shape and
// dtype, so a warm step makes no heuristic query and no allocation but its output tensor: the
// same launches at every decode step, as graph capture needs. One 32 MiB workspace per device
// (cublaslt.hpp, shared with linear_per_group.cu).
#include <cublasLt.h>

#include <string>

#include <map>
#include <mutex>
#include <tuple>
#include <utility>

#include "cuda/common.cuh"
#include "cuda/runtime.hpp"
#include "ops/cuda/cublaslt.hpp"
#include "ops/cuda/cuda_ops.hpp"

namespace moex::ops::cuda {

using moex::cuda::current_stream;

namespace {
std::mutex& cublaslt_mutex() {
  static std::mutex m;
  return m;
}
}  // namespace

CublasLt& cublaslt(int device) {
  static std::map<int, CublasLt> handles;  // kept for the process's lifetime
  std::lock_guard<std::mutex> lock(cublaslt_mutex());
  CublasLt& h = handles[device];
  if (!h.lt) MOEX_CUBLAS_CHECK(cublasLtCreate(&h.lt));
  return h;
}

void* cublaslt_workspace(int device, cudaStream_t stream) {
  static std::map<std::pair<int, cudaStream_t>, void*> workspaces;  // kept for the process's lifetime
  std::lock_guard<std::mutex> lock(cublaslt_mutex());
  void*& w = workspaces[{device, stream}];
  if (!w) w = moex::cuda::cache_alloc(kCublasLtWorkspaceBytes, device);
  return w;
}

cudaDataType_t cublas_dtype(DType t, const char* op) {
  switch (t) {
    case DType::kF32: return CUDA_R_32F;
    case DType::kBF16: return CUDA_R_16BF;
    case DType::kF16: return CUDA_R_16F;
    default: throw Unsupported(std::string(op) + " on CUDA: dtype " + std::string(dtype_name(t)) + " is not a float dtype");
  }
}

namespace {

cudaDataType_t cuda_type(DType t) { return cublas_dtype(t, "linear"); }

using PlanKey = std::tuple<int, int64_t, int64_t, int64_t, int, int, int, bool>;

struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

const Plan& plan_for(int device, int64_t rows, int64_t in, int64_t out, DType wt, DType dt, bool bias) {
  static std::mutex m;
  static std::map<PlanKey, Plan> plans;
  const PlanKey key{device, rows, in, out, int(wt), int(dt), 0, bias};
  std::lock_guard<std::mutex> lock(m);
  auto it = plans.find(key);
  if (it != plans.end()) return it->second;

  Plan p;
  MOEX_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  MOEX_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  MOEX_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  if (bias) {
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    MOEX_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    const cudaDataType_t bt = cuda_type(dt);
    MOEX_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof(bt)));
  }
  MOEX_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, cuda_type(wt), uint64_t(in), uint64_t(out), in));
  MOEX_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, cuda_type(wt), uint64_t(in), uint64_t(rows), in));
  MOEX_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.d, cuda_type(dt), uint64_t(out), uint64_t(rows), out));

  cublasLtMatmulPreference_t pref = nullptr;
  MOEX_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = kCublasLtWorkspaceBytes;
  MOEX_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(cublaslt(device).lt, p.desc, p.a, p.b, p.d, p.d,
                                                           pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0)
    throw Unsupported("linear on CUDA: cuBLASLt has no algorithm for [" + std::to_string(rows) + ", " +
                      std::to_string(in) + "] x [" + std::to_string(out) + ", " + std::to_string(in) +
                      "]^T with " + std::string(dtype_name(wt)) + " weights and " + std::string(dtype_name(dt)) + " output");
  p.algo = result.algo;
  return plans.emplace(key, p).first->second;
}

template <class S, class D>
__global__ void convert_kernel(const S* __restrict__ src, D* __restrict__ dst, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = moex::cuda::from_float<D>(moex::cuda::to_float<S>(src[i]));
}

template <class S>
void convert_from(const Tensor& x, Tensor& y, cudaStream_t s) {
  const int64_t n = x.numel();
  const int grid = int(std::min<int64_t>((n + 255) / 256, 4096));
  const S* src = static_cast<const S*>(x.raw());
  switch (y.dtype()) {
    case DType::kF32: convert_kernel<<<grid, 256, 0, s>>>(src, y.data<float>(), n); break;
    case DType::kBF16: convert_kernel<<<grid, 256, 0, s>>>(src, static_cast<__nv_bfloat16*>(y.raw()), n); break;
    case DType::kF16: convert_kernel<<<grid, 256, 0, s>>>(src, static_cast<__half*>(y.raw()), n); break;
    default: throw Unsupported("convert: not a float dtype");
  }
  MOEX_CUDA_CHECK_LAUNCH("convert_kernel");
}

}  // namespace

// A contiguous copy of x in `dtype` on x's device (float <-> float, round to nearest even).
Tensor convert(const Tensor& x, DType dtype) {
  if (x.dtype() == dtype) return x;
  Tensor y = Tensor::empty(x.shape(), dtype, x.device());
  if (x.numel() == 0) return y;
  cudaStream_t s = current_stream();
  switch (x.dtype()) {
    case DType::kF32: convert_from<float>(x, y, s); break;
    case DType::kBF16: convert_from<__nv_bfloat16>(x, y, s); break;
    case DType::kF16: convert_from<__half>(x, y, s); break;
    default: throw Unsupported("convert: not a float dtype");
  }
  return y;
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias, DType act) {
  const int device = x.device().index;
  moex::cuda::DeviceGuard guard(device);
  const int64_t rows = x.size(0), in = x.size(1), out = weight.size(0);
  if (gemv_serves(x, weight, bias, act)) return linear_gemv(x, weight, bias);
  // The product runs in the wider of the two dtypes: float32 activations meet 16-bit weights only
  // outside models (tests of the op; a model stores its activations in the weights' dtype), and
  // narrowing them would round x, so the weights are widened for that call instead.
  const bool widen = x.dtype() == DType::kF32 && weight.dtype() != DType::kF32;
  const Tensor w = widen ? convert(weight, DType::kF32) : weight;
  const DType wt = w.dtype();
  // The output dtype: act, except that narrower weights than act are not a cuBLASLt combination
  // (float32 weights always give float32 results: DeepSeek's router).
  const DType dt = wt == DType::kF32 ? DType::kF32 : act;
  Tensor y = Tensor::empty({rows, out}, dt, x.device());
  if (rows == 0 || out == 0) return y;
  // Activations in the weights' dtype (widening is exact; models store activations in act,
  // which equals the weights' dtype but for float32 routers).
  Tensor xa = convert(x.contiguous(), wt);
  Tensor b = bias.defined() ? convert(bias, dt) : Tensor();
  const Plan& p = plan_for(device, rows, in, out, wt, dt, b.defined());
  if (b.defined()) {
    const void* bp = b.raw();
    MOEX_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof(bp)));
  }
  const float alpha = 1.0f, beta = 0.0f;
  CublasLt& h = cublaslt(device);
  cudaStream_t s = current_stream();
  MOEX_CUBLAS_CHECK(cublasLtMatmul(h.lt, p.desc, &alpha, w.raw(), p.a, xa.raw(), p.b, &beta, y.raw(), p.d,
                                   y.raw(), p.d, &p.algo, cublaslt_workspace(device, s), kCublasLtWorkspaceBytes, s));
  if (dt != act) return convert(y, act);
  return y;
}

namespace {
// Whether linears of x run as one GEMV launch (every weight unquantized, gemv_serves, one
// in_features, x's width); fills the launch's weight and bias lists either way.
bool one_gemv_launch(const Tensor& x, std::span<const LinearOf> ls, DType act, std::vector<const Tensor*>& ws,
                     std::vector<const Tensor*>& bs) {
  const Tensor none;
  bool one = !ls.empty() && ls.size() <= size_t(kGemvMaxSegments);
  for (const LinearOf& l : ls) {
    ws.push_back(&l.weight->tensor);
    bs.push_back(l.bias);
    one = one && !l.weight->quantized() && gemv_serves(x, l.weight->tensor, l.bias ? *l.bias : none, act) &&
          l.weight->tensor.size(1) == x.size(1);
  }
  return one;
}
}  // namespace

std::vector<Tensor> linears(const Tensor& x, std::span<const LinearOf> ls, DType act) {
  moex::cuda::DeviceGuard guard(x.device().index);
  std::vector<const Tensor*> ws, bs;
  if (one_gemv_launch(x, ls, act, ws, bs)) return linear_gemv_segments(x, ws, bs);
  const Tensor none;
  std::vector<Tensor> ys;
  for (const LinearOf& l : ls)
    ys.push_back(l.weight->quantized() ? linear_quantized(x, *l.weight, l.bias ? *l.bias : none, act)
                                       : linear(x, l.weight->tensor, l.bias ? *l.bias : none, act));
  return ys;
}

std::vector<Tensor> norm_linears(Tensor& h, const Tensor* delta, const NormOf& norm, std::span<const LinearOf> ls,
                                 DType act, Tensor* x_out) {
  moex::cuda::DeviceGuard guard(h.device().index);
  static const bool enabled = moex::cuda::env_int("MOEX_NORM_GEMV", 1) != 0;  // 0: measuring
  std::vector<const Tensor*> ws, bs;
  if (enabled && norm_gemv_serves(h, delta, *norm.weight, act) && one_gemv_launch(h, ls, act, ws, bs))
    return norm_linear_gemv_segments(h, delta, *norm.weight, norm.eps, norm.style, ws, bs, x_out);
  Tensor x = delta ? cuda::add_rms_norm(h, *delta, *norm.weight, norm.eps, act, norm.style)
                   : cuda::rms_norm(h, *norm.weight, norm.eps, act, 0, norm.style);
  std::vector<Tensor> ys = cuda::linears(x, ls, act);
  if (x_out) *x_out = std::move(x);
  return ys;
}

}  // namespace moex::ops::cuda
