// ops::linear_per_group on CUDA: one cuBLASLt strided-batched matmul, one batch per group, float32
// accumulation, the result rounded once to act in the epilogue (DeepSeek MLA's absorbed
// projections q_lat[h] = W_UK[h]^T q_nope[h] and W_UV[h] o_lat[h]).
//
// Why strided batched: every group's block sits at a fixed stride in the one weight tensor
// (kv_b_proj's rows of head h) and every group's slice of x / y at a fixed column stride, so the
// whole layer is one call reading the blocks in place: no per-step copies, no per-head launches.
//
// Row-major mapping (as in linear.cu, cuBLASLt being column-major). A block W_g [rows, in]
// row-major is [in, rows] column-major with ld = in; group g starts at element
// (g * group_rows + offset) * in (batch stride group_rows * in). x [R, G * a] row-major is, per
// group, [a, R] column-major with ld = G * a and batch stride a; likewise y.
// - transpose_weight false: y_g^T [rows, R] = W_g . x_g^T: A = W_g transposed (m = rows, k = in).
// - transpose_weight true:  y_g^T [in, R] = W_g^T . x_g^T: A = W_g as stored (m = in, k = rows).
//
// The heuristic is told the real alignment of the pointers and strides (column slices of one
// head can be 64 bytes apart), so it never picks a kernel that needs more. Plans are cached per
// shape, dtype and alignment like linear's: a warm step makes no heuristic query.
#include <cublasLt.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "cuda/common.cuh"
#include "cuda/runtime.hpp"
#include "moex/error.hpp"
#include "ops/cuda/cublaslt.hpp"
#include "ops/cuda/cuda_ops.hpp"

namespace moex::ops::cuda {

namespace {

struct GroupPlanKey {
  int device;
  int64_t rows, groups, in, block_rows, group_rows;
  bool transpose;
  DType wt, dt;
  uint32_t align_a, align_b, align_d;
  auto tie() const {
    return std::tie(device, rows, groups, in, block_rows, group_rows, transpose, wt, dt, align_a, align_b, align_d);
  }
  bool operator<(const GroupPlanKey& o) const { return tie() < o.tie(); }
};

struct GroupPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

// The largest power of two up to 256 dividing every value (byte addresses, byte strides).
uint32_t alignment_of(std::initializer_list<uint64_t> values) {
  uint32_t a = 256;
  for (uint64_t v : values)
    while (a > 1 && v % a != 0) a >>= 1;
  return a;
}

cublasLtMatrixLayout_t batched_layout(DType t, int64_t rows, int64_t cols, int64_t ld, int32_t batch, int64_t stride) {
  cublasLtMatrixLayout_t l = nullptr;
  MOEX_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l, cublas_dtype(t, "linear_per_group"), uint64_t(rows), uint64_t(cols), ld));
  MOEX_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof(batch)));
  MOEX_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
  return l;
}

const GroupPlan& group_plan_for(const GroupPlanKey& k) {
  static std::mutex m;
  static std::map<GroupPlanKey, GroupPlan> plans;
  std::lock_guard<std::mutex> lock(m);
  auto it = plans.find(k);
  if (it != plans.end()) return it->second;

  const int32_t G = int32_t(k.groups);
  // x's group width a and y's group width b (see the top of the file).
  const int64_t a = k.transpose ? k.block_rows : k.in, b = k.transpose ? k.in : k.block_rows;
  GroupPlan p;
  MOEX_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = k.transpose ? CUBLAS_OP_N : CUBLAS_OP_T, tb = CUBLAS_OP_N;
  MOEX_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  MOEX_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  p.a = batched_layout(k.wt, k.in, k.block_rows, k.in, G, k.group_rows * k.in);
  p.b = batched_layout(k.wt, a, k.rows, G * a, G, a);
  p.d = batched_layout(k.dt, b, k.rows, G * b, G, b);

  cublasLtMatmulPreference_t pref = nullptr;
  MOEX_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = kCublasLtWorkspaceBytes;
  MOEX_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  MOEX_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &k.align_a, sizeof(uint32_t)));
  MOEX_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &k.align_b, sizeof(uint32_t)));
  MOEX_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &k.align_d, sizeof(uint32_t)));
  MOEX_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &k.align_d, sizeof(uint32_t)));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(cublaslt(k.device).lt, p.desc, p.a, p.b, p.d, p.d, pref, 1,
                                                           &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0)
    throw Unsupported("linear_per_group on CUDA: cuBLASLt has no algorithm for " + std::to_string(G) + " groups of [" +
                      std::to_string(k.rows) + ", " + std::to_string(a) + "] -> [" + std::to_string(k.rows) + ", " +
                      std::to_string(b) + "] with " + std::string(dtype_name(k.wt)) + " weights");
  p.algo = result.algo;
  return plans.emplace(k, p).first->second;
}

}  // namespace

Tensor linear_per_group(const Tensor& x, const GroupedWeight& w, bool transpose_weight, DType act) {
  const int device = x.device().index;
  moex::cuda::DeviceGuard guard(device);
  const int64_t rows = x.size(0), G = w.groups, in = w.in(), br = w.rows;
  const int64_t b = transpose_weight ? in : br;
  // As linear(): float32 activations with 16-bit weights widen the weights for the call (only
  // tests of the op do that), float32 weights give float32 results, converted to act afterwards.
  const Tensor weight = x.dtype() == DType::kF32 && w.weight.dtype() != DType::kF32 ? convert(w.weight, DType::kF32)
                                                                                   : w.weight;
  const DType wt = weight.dtype();
  const DType dt = wt == DType::kF32 ? DType::kF32 : act;
  Tensor y = Tensor::empty({rows, G * b}, dt, x.device());
  if (rows == 0 || G == 0 || b == 0) return y;
  if (G > INT32_MAX) throw Unsupported("linear_per_group on CUDA: too many groups");
  Tensor xa = convert(x.contiguous(), wt);
  const size_t ws = dtype_size(wt), ds = dtype_size(dt);
  const char* wp = static_cast<const char*>(weight.raw()) + size_t(w.offset * in) * ws;
  const int64_t a = transpose_weight ? br : in;
  GroupPlanKey key{device, rows, G, in, br, w.group_rows, transpose_weight, wt, dt, 0, 0, 0};
  key.align_a = alignment_of({uint64_t(reinterpret_cast<uintptr_t>(wp)), uint64_t(in) * ws, uint64_t(w.group_rows * in) * ws});
  key.align_b = alignment_of({uint64_t(reinterpret_cast<uintptr_t>(xa.raw())), uint64_t(G * a) * ws, uint64_t(a) * ws});
  key.align_d = alignment_of({uint64_t(reinterpret_cast<uintptr_t>(y.raw())), uint64_t(G * b) * ds, uint64_t(b) * ds});
  const GroupPlan& p = group_plan_for(key);
  const float alpha = 1.0f, beta = 0.0f;
  CublasLt& h = cublaslt(device);
  cudaStream_t s = moex::cuda::current_stream();
  MOEX_CUBLAS_CHECK(cublasLtMatmul(h.lt, p.desc, &alpha, wp, p.a, xa.raw(), p.b, &beta, y.raw(), p.d, y.raw(), p.d,
                                   &p.algo, cublaslt_workspace(device, s), kCublasLtWorkspaceBytes, s));
  if (dt != act) return convert(y, act);
  return y;
}

}  // namespace moex::ops::cuda
