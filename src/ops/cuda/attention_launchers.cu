// Launchers of the attention kernels: the run-time -> compile-time dispatch (element type, head
// dim classes, eager passes) happens here and only here.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <utility>

#include "cuda/runtime.hpp"
#include "moex/error.hpp"
#include "ops/cuda/attention_decode.cuh"
#include "ops/cuda/attention_flash.cuh"
#include "ops/cuda/attention_launchers.hpp"
#include "ops/cuda/attention_split.cuh"

namespace moex::ops::cuda {

using moex::cuda::aligned16;

namespace {

// Opts `kernel` in to the device's whole dynamic shared memory, once per kernel and device (`opted`
// is a static of the kernel's own launcher: kernels of one signature share a function-pointer
// type, so the flag cannot live here), so that any size the launcher asks for (up to that) is
// accepted. Not a stream operation: safe while a stream is being captured.
template <class Kernel>
void opt_in_smem(Kernel kernel, int64_t bytes, std::atomic<uint64_t>& opted) {
  const int dev = moex::cuda::current_device();
  const size_t limit = moex::cuda::device_info(dev).smem_per_block_optin;
  if (size_t(bytes) > limit)
    throw Unsupported("attention: a block needs " + std::to_string(bytes) + " bytes of shared memory, the device " +
                      "allows " + std::to_string(limit) + " (head dims too large)");
  const uint64_t bit = uint64_t(1) << (dev & 63);
  if (!(opted.load() & bit)) {
    MOEX_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(limit)));
    opted.fetch_or(bit);
  }
}

int dim_class(int d) { return d <= 64 ? 64 : d <= 128 ? 128 : 256; }

template <class T, int kDk, int kDv, int kWarps, int kMT, int kN>
void launch_flash_instance(const FlashParams& fp, int batch, cudaStream_t stream) {
  auto kernel = attention_flash_mma_kernel<T, kDk, kDv, kWarps, kMT, kN>;
  constexpr int rows = 16 * kMT * kWarps;
  const size_t smem = flash_smem_bytes_for<kDk, kDv>(sizeof(T), rows, kN);
  static std::atomic<uint64_t> opted{0};
  opt_in_smem(kernel, int64_t(smem), opted);
  const int64_t qblocks = (int64_t(fp.tokens) + rows - 1) / rows;
  if (qblocks > 65535) throw Unsupported("attention: a prompt of " + std::to_string(fp.tokens) + " tokens exceeds " +
                                         "the flash kernel's grid (65535 blocks of " + std::to_string(rows) + ")");
  const dim3 grid(unsigned(fp.heads), unsigned(qblocks), unsigned(batch));
  kernel<<<grid, 32 * kWarps, smem, stream>>>(fp);
  MOEX_CUDA_CHECK_LAUNCH(attention_flash_mma_kernel);
}

// The block shapes of attention_plan.hpp's FlashBlock (the plan validated the combination).
template <class T, int kDk, int kDv>
void launch_flash_block(const FlashParams& fp, int batch, const AttentionArgs& a, cudaStream_t stream) {
  if constexpr (kDk <= 128 && kDv <= 128) {
    if (a.flash_warps == 8 && a.flash_warp_mtiles == 1 && a.flash_columns == 64)
      return launch_flash_instance<T, kDk, kDv, 8, 1, 64>(fp, batch, stream);
    if (a.flash_warps == 4 && a.flash_warp_mtiles == 2 && a.flash_columns == 64)
      return launch_flash_instance<T, kDk, kDv, 4, 2, 64>(fp, batch, stream);
    if (a.flash_warps == 4 && a.flash_warp_mtiles == 2 && a.flash_columns == 32)
      return launch_flash_instance<T, kDk, kDv, 4, 2, 32>(fp, batch, stream);
  }
  if (a.flash_warps == 4 && a.flash_warp_mtiles == 1 && a.flash_columns == 64)
    return launch_flash_instance<T, kDk, kDv, 4, 1, 64>(fp, batch, stream);
  throw Unsupported("attention: the flash kernel has no instance of " + std::to_string(a.flash_warps) + " warps x " +
                    std::to_string(16 * a.flash_warp_mtiles) + " rows, " + std::to_string(a.flash_columns) +
                    "-column tiles for head dims " + std::to_string(fp.dk) + " / " + std::to_string(fp.dv));
}

template <class T, int kDk>
void launch_flash_dv(const FlashParams& fp, int batch, const AttentionArgs& a, cudaStream_t stream) {
  switch (dim_class(fp.dv)) {
    case 64: return launch_flash_block<T, kDk, 64>(fp, batch, a, stream);
    case 128: return launch_flash_block<T, kDk, 128>(fp, batch, a, stream);
    default: return launch_flash_block<T, kDk, 256>(fp, batch, a, stream);
  }
}

template <class T>
void launch_flash_typed(const FlashParams& fp, int batch, const AttentionArgs& a, cudaStream_t stream) {
  switch (dim_class(fp.dk)) {
    case 64: return launch_flash_dv<T, 64>(fp, batch, a, stream);
    case 128: return launch_flash_dv<T, 128>(fp, batch, a, stream);
    default: return launch_flash_dv<T, 256>(fp, batch, a, stream);
  }
}

template <class T, int kMode>
void launch_split_pass(const SplitParams& sp, int batch, int kv_heads, int qblocks, cudaStream_t stream) {
  auto kernel = attention_split_kernel<T, kMode>;
  const int64_t smem = split_smem_bytes(sp.dk, sp.dv, sp.v_in_k);
  static std::atomic<uint64_t> opted{0};
  opt_in_smem(kernel, smem, opted);
  const dim3 grid(unsigned(qblocks * sp.splits), unsigned(kv_heads), unsigned(batch));
  moex::cuda::launch_pdl_here(kernel, grid, dim3(kSplitThreads), size_t(smem), stream, sp);
  MOEX_CUDA_CHECK_LAUNCH(attention_split_kernel);
}

template <class T>
void launch_split_typed(const SplitParams& sp, bool eager, int batch, int kv_heads, int qblocks, cudaStream_t stream) {
  if (!eager) return launch_split_pass<T, 0>(sp, batch, kv_heads, qblocks, stream);
  launch_split_pass<T, 1>(sp, batch, kv_heads, qblocks, stream);
  launch_split_pass<T, 2>(sp, batch, kv_heads, qblocks, stream);
  launch_split_pass<T, 3>(sp, batch, kv_heads, qblocks, stream);
}

// At least n zeroed arrival counters for the vector kernel's in-kernel combine on `stream`, or
// null when the stream's buffer would have to grow during a graph capture (the combine kernel
// runs then). Kept for the process (a captured graph may hold any buffer handed out; retired
// ones are never freed); every call leaves its counters at zero again. Growing (a cudaMalloc) is
// left to the first call of a size, which a capture's warm-up run makes.
unsigned* arrival_counters(cudaStream_t stream, int64_t n) {
  static std::mutex mu;
  static std::map<std::pair<int, cudaStream_t>, std::pair<unsigned*, int64_t>> buffers;
  std::lock_guard<std::mutex> lock(mu);
  auto& b = buffers[{moex::cuda::current_device(), stream}];
  if (b.second >= n) return b.first;
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  MOEX_CUDA_CHECK(cudaStreamIsCapturing(stream, &st));
  if (st != cudaStreamCaptureStatusNone) return nullptr;
  const int64_t want = std::max<int64_t>(4096, n);
  unsigned* p = nullptr;
  MOEX_CUDA_CHECK(cudaMalloc(&p, size_t(want) * sizeof(unsigned)));
  MOEX_CUDA_CHECK(cudaMemsetAsync(p, 0, size_t(want) * sizeof(unsigned), stream));
  b = {p, want};
  return p;
}

// Returns whether the kernel combined the splits itself (sp.out written).
template <class T, int kD, int kQ>
bool launch_vec_instance(SplitParams sp, int batch, int kv_heads, cudaStream_t stream) {
  const int qblocks = (sp.tokens * sp.group + kQ - 1) / kQ;
  if (int64_t(qblocks) * sp.splits > INT32_MAX) throw Unsupported("attention: too many query blocks x splits for one grid");
  // The in-kernel combine keeps the splits' maxima and weights in shared memory.
  sp.counters = sp.splits <= kCombineMaxSplits ? arrival_counters(stream, int64_t(qblocks) * kv_heads * batch) : nullptr;
  const dim3 grid(unsigned(qblocks * sp.splits), unsigned(kv_heads), unsigned(batch));
  moex::cuda::launch_pdl_here(attention_decode_vec_kernel<T, kD, kQ>, grid, dim3(kDecodeWarps * 32), 0, stream, sp);
  MOEX_CUDA_CHECK_LAUNCH(attention_decode_vec_kernel);
  return sp.counters != nullptr;
}

template <class T, int kD>
bool launch_vec_queries(const SplitParams& sp, int batch, int kv_heads, cudaStream_t stream) {
  switch (split_vec_queries(int64_t(sp.tokens) * sp.group)) {
    case 1: return launch_vec_instance<T, kD, 1>(sp, batch, kv_heads, stream);
    case 2: return launch_vec_instance<T, kD, 2>(sp, batch, kv_heads, stream);
    case 4: return launch_vec_instance<T, kD, 4>(sp, batch, kv_heads, stream);
    default: return launch_vec_instance<T, kD, 8>(sp, batch, kv_heads, stream);
  }
}

template <class T>
bool launch_vec_typed(const SplitParams& sp, int batch, int kv_heads, cudaStream_t stream) {
  if (sp.dk != sp.dv || sp.v_in_k || (sp.dk != 64 && sp.dk != 128))
    throw Unsupported("attention: the vector split kernel runs head dims 64 / 64 or 128 / 128 with separate values "
                      "(got " + std::to_string(sp.dk) + " / " + std::to_string(sp.dv) + ")");
  if (sp.dk == 64) return launch_vec_queries<T, 64>(sp, batch, kv_heads, stream);
  return launch_vec_queries<T, 128>(sp, batch, kv_heads, stream);
}

__global__ void convert_floats_kernel(const void* src, int src_code, void* dst, int dst_code, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    store_code(dst, dst_code, i, moex::cuda::load_float(src, src_code, i));
}

}  // namespace

void launch_attention_flash_mma(const AttentionArgs& a, void* out, cudaStream_t stream) {
  FlashParams fp{};
  fp.q = a.q;
  fp.k = a.k;
  fp.v = a.v;
  fp.out = out;
  fp.step = a.step;
  fp.tokens = a.tokens;
  fp.heads = a.heads;
  fp.group = a.heads / a.kv_heads;
  fp.dk = a.dk;
  fp.dv = a.dv;
  fp.capacity = a.capacity;
  fp.q_dim = int64_t(a.heads) * a.dk;
  fp.k_dim = int64_t(a.kv_heads) * a.dk;
  fp.v_dim = a.v_from_k ? fp.k_dim : int64_t(a.kv_heads) * a.dv;
  fp.v_head = a.v_from_k ? a.dk : a.dv;
  fp.out_dim = int64_t(a.heads) * a.dv;
  fp.scale = a.scale;
  fp.window = a.window;
  fp.sinks = a.sinks;
  fp.sinks_code = a.sinks_code;
  if (a.elem == kAttnBF16) launch_flash_typed<__nv_bfloat16>(fp, a.batch, a, stream);
  else if (a.elem == kAttnF16) launch_flash_typed<__half>(fp, a.batch, a, stream);
  else throw Unsupported("attention: the flash mma kernel runs bf16 / f16 only");
}

void launch_attention_split(const AttentionArgs& a, const SplitWorkspace& ws, void* out, cudaStream_t stream) {
  SplitParams sp{};
  sp.q = a.q;
  sp.k = a.k;
  sp.v = a.v;
  sp.step = a.step;
  sp.sinks = a.sinks;
  sp.sinks_code = a.sinks_code;
  sp.act = a.act;
  sp.tokens = a.tokens;
  sp.heads = a.heads;
  sp.group = a.heads / a.kv_heads;
  sp.dk = a.dk;
  sp.dv = a.dv;
  sp.capacity = a.capacity;
  sp.q_dim = int64_t(a.heads) * a.dk;
  sp.k_dim = int64_t(a.kv_heads) * a.dk;
  sp.v_dim = a.v_from_k ? sp.k_dim : int64_t(a.kv_heads) * a.dv;
  sp.v_head = a.v_from_k ? a.dk : a.dv;
  sp.v_in_k = a.v_from_k;
  sp.rows_heads = int64_t(a.batch) * a.tokens * a.heads;
  sp.splits = ws.splits;
  sp.chunk = int((int64_t(a.capacity) + ws.splits - 1) / ws.splits);
  sp.scale = a.scale;
  sp.window = a.window;
  const int es = a.elem == kAttnF32 ? 4 : 2;
  sp.vec_k = (a.dk * es) % 16 == 0 && aligned16(a.k);
  sp.vec_v = (a.dv * es) % 16 == 0 && aligned16(a.v);
  sp.ws_l = ws.l;
  sp.ws_m = ws.m;
  sp.ws_acc = ws.acc;
  const int qblocks = (a.tokens * sp.group + kSplitQueries - 1) / kSplitQueries;
  if (int64_t(qblocks) * ws.splits > INT32_MAX)
    throw Unsupported("attention: too many query blocks x splits for one grid");
  if (a.split_vec) {
    if (a.eager || a.act != a.elem || a.elem == kAttnF32 || !sp.vec_k || !sp.vec_v)
      throw Unsupported("attention: the vector split kernel runs bf16 / f16 sdpa with act equal to the cache dtype "
                        "and 16-byte aligned rows");
    sp.out = out;
    const bool combined = a.elem == kAttnBF16 ? launch_vec_typed<__nv_bfloat16>(sp, a.batch, a.kv_heads, stream)
                                              : launch_vec_typed<__half>(sp, a.batch, a.kv_heads, stream);
    if (combined) return;
  } else if (a.elem == kAttnBF16) launch_split_typed<__nv_bfloat16>(sp, a.eager, a.batch, a.kv_heads, qblocks, stream);
  else if (a.elem == kAttnF16) launch_split_typed<__half>(sp, a.eager, a.batch, a.kv_heads, qblocks, stream);
  else launch_split_typed<float>(sp, a.eager, a.batch, a.kv_heads, qblocks, stream);

  CombineParams cp{};
  cp.sinks = a.sinks;
  cp.sinks_code = a.sinks_code;
  cp.act = a.act;
  cp.heads = a.heads;
  cp.dv = a.dv;
  cp.splits = ws.splits;
  cp.rows_heads = sp.rows_heads;
  cp.eager = a.eager;
  cp.ws_l = ws.l;
  cp.ws_m = ws.m;
  cp.ws_acc = ws.acc;
  cp.out = out;
  constexpr int kPerBlock = kCombineThreads / 32;
  const int64_t blocks = (sp.rows_heads + kPerBlock - 1) / kPerBlock;
  if (blocks > INT32_MAX) throw Unsupported("attention: too many (row, head) pairs for one grid");
  moex::cuda::launch_pdl_here(attention_combine_kernel, dim3(unsigned(blocks)), dim3(kCombineThreads), 0, stream, cp);
  MOEX_CUDA_CHECK_LAUNCH(attention_combine_kernel);
}

void launch_convert_floats(const void* src, int src_code, void* dst, int dst_code, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  const int64_t blocks = std::min<int64_t>((n + 255) / 256, 4096);
  convert_floats_kernel<<<unsigned(blocks), 256, 0, stream>>>(src, src_code, dst, dst_code, n);
  MOEX_CUDA_CHECK_LAUNCH(convert_floats_kernel);
}

}  // namespace moex::ops::cuda
