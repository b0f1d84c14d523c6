// The CUDA attention op (ops.hpp): validates what the kernels rely on, plans, allocates the output
// and the split workspace, and calls the launchers.
//
// Why the project's own kernels rather than a library's fused attention: the contract needs left-
// padding masks read from the device step, gpt-oss sinks joining the denominator, bit-level
// parity with transformers' bf16 eager rounding, DeepSeek MLA's unequal q/k and v head dims
// (192 / 128 expanded; 576 / 512 absorbed, values read from the cached keys) and a decode step whose launches do not depend on the cache length (read on the
// device, grids sized from the capacity) so that it can be captured in a CUDA graph and replayed at
// every length. cuDNN's fused attention covers the plain causal prompt (attention_cudnn.hpp) and
// runs it where it is measured faster; everything else stays on these kernels.
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <set>
#include <string>

#include "cuda/runtime.hpp"
#include "moex/error.hpp"
#include "ops/cuda/attention_cudnn.hpp"
#include "ops/cuda/attention_launchers.hpp"
#include "ops/cuda/attention_plan.hpp"
#include "ops/cuda/cuda_ops.hpp"

namespace moex::ops::cuda {

namespace {

int code_of(DType t, const char* what) {
  switch (t) {
    case DType::kF32: return kAttnF32;
    case DType::kF16: return kAttnF16;
    case DType::kBF16: return kAttnBF16;
    default: throw Unsupported(std::string("attention: ") + what + " of dtype " + std::string(dtype_name(t)));
  }
}

bool aligned16(const Tensor& t) { return (reinterpret_cast<uintptr_t>(t.raw()) & 15) == 0; }

}  // namespace

AttentionShape attention_shape_of(const Tensor& q, const LayerKV& kv, const Step& step, const AttentionSpec& spec,
                                  DType act) {
  AttentionShape s;
  s.cache = kv.k.defined() ? kv.k.dtype() : q.dtype();
  s.act = act;
  s.batch = step.batch;
  s.tokens = step.tokens;
  s.heads = spec.heads;
  s.kv_heads = spec.kv_heads;
  s.head_dim_k = spec.head_dim_k;
  s.head_dim_v = spec.head_dim_v;
  s.capacity = kv.capacity();
  s.eager = spec.eager_rounding;
  s.v_from_k = spec.v_from_k;
  // q of another dtype is converted into a fresh (aligned) tensor first.
  s.aligned16 = kv.k.defined() && aligned16(kv.k) && (spec.v_from_k || aligned16(kv.v)) &&
                (q.dtype() != s.cache || aligned16(q));
  s.sm_count = q.device().is_cuda() ? moex::cuda::device_info(q.device().index).sm_count : 132;
  bool padded = false;
  for (int64_t p : step.pad) padded = padded || p > 0;
  s.plain_causal = !spec.sinks.defined() && spec.sliding_window <= 0 && !padded;
  // cuDNN launches are planned with the host's cached length: never inside a captured graph.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  s.cudnn = q.device().is_cuda() && cudnn_attention_available() &&
            cudaStreamIsCapturing(moex::cuda::current_stream(), &capture) == cudaSuccess &&
            capture == cudaStreamCaptureStatusNone;
  return s;
}

Tensor attention(const Tensor& q, const LayerKV& kv, const Step& step, const AttentionSpec& spec, DType act) {
  return attention_planned(q, kv, step, spec, act, plan_attention(attention_shape_of(q, kv, step, spec, act)));
}

Tensor attention_planned(const Tensor& q, const LayerKV& kv, const Step& step, const AttentionSpec& spec, DType act,
                         const AttentionPlan& plan) {
  const Device dev = q.device();
  moex::cuda::DeviceGuard guard(dev.index);
  const int64_t rows = step.rows();
  Tensor out = Tensor::empty({rows, spec.heads * spec.head_dim_v}, act, dev);
  if (rows == 0 || spec.heads == 0 || spec.head_dim_v == 0) return out;
  if (!step.device.defined())
    throw InvalidInput("attention on CUDA: the step has no device mirror (make_device_step)");
  if (!kv.k.defined()) throw InvalidInput("attention on CUDA: the KV cache is empty (kv_append first)");
  if (spec.v_from_k ? spec.head_dim_v > spec.head_dim_k : !kv.v.defined())
    throw InvalidInput("attention on CUDA: values from keys need head_dim_v <= head_dim_k; otherwise the cache "
                       "needs values");
  // Grid limits: batch and heads index grid.z / grid.y; columns are int32 in the kernels.
  if (step.batch > 65535 || spec.heads > 65535 || kv.capacity() > INT32_MAX || rows * spec.heads > INT32_MAX)
    throw Unsupported("attention on CUDA: batch " + std::to_string(step.batch) + ", heads " +
                      std::to_string(spec.heads) + ", capacity " + std::to_string(kv.capacity()) +
                      " exceed the kernels' grid limits");
  const AttentionShape shape = attention_shape_of(q, kv, step, spec, act);
  check_attention_plan(plan, shape);
  cudaStream_t stream = moex::cuda::current_stream();

  AttentionArgs a;
  a.elem = code_of(kv.k.dtype(), "cache");
  a.act = code_of(act, "act");
  Tensor qc = q;
  if (q.dtype() != kv.k.dtype()) {
    qc = Tensor::empty(q.shape(), kv.k.dtype(), dev);
    launch_convert_floats(q.raw(), code_of(q.dtype(), "q"), qc.raw(), a.elem, q.numel(), stream);
  }
  Tensor sinks = spec.sinks;
  // The model keeps its sinks on the device; a host tensor is uploaded here (a synchronous copy,
  // so such a call cannot be captured in a graph).
  if (sinks.defined() && !sinks.device().is_cuda()) sinks = sinks.to(dev);
  a.q = qc.raw();
  a.k = kv.k.raw();
  // v_from_k: V is K itself, read with K's row stride, head g's values at K's head offset.
  a.v = spec.v_from_k ? kv.k.raw() : kv.v.raw();
  a.v_from_k = spec.v_from_k;
  a.step = step.device.data<int32_t>();
  a.sinks = sinks.defined() ? sinks.raw() : nullptr;
  a.sinks_code = sinks.defined() ? code_of(sinks.dtype(), "sinks") : kAttnF32;
  a.batch = int(step.batch);
  a.tokens = int(step.tokens);
  a.heads = int(spec.heads);
  a.kv_heads = int(spec.kv_heads);
  a.dk = int(spec.head_dim_k);
  a.dv = int(spec.head_dim_v);
  a.capacity = int(kv.capacity());
  a.scale = spec.scale;
  a.window = spec.sliding_window > 0 ? int(std::min<int64_t>(spec.sliding_window, INT32_MAX)) : 0;
  a.eager = spec.eager_rounding;

  AttentionPlan run = plan;
  if (plan.kernel == AttentionKernel::kCudnn) {
    std::string why;
    const CudnnLaunch r = launch_attention_cudnn(a, step.past, dev.index, out.raw(), stream, &why);
    if (r == CudnnLaunch::kRan) return out;
    // The graph is being built (the flash kernel runs meanwhile), or cuDNN has no engine for this
    // shape: then the flash kernel runs it always, said once per head layout.
    if (r == CudnnLaunch::kUnsupported) {
      static std::mutex mu;
      static std::set<std::string> told;
      const std::string key = std::to_string(a.heads) + "/" + std::to_string(a.kv_heads) + " heads of " +
                              std::to_string(a.dk);
      std::lock_guard<std::mutex> lock(mu);
      if (told.insert(key).second)
        std::fprintf(stderr, "moex: cuDNN attention does not run %s (%s); using the flash kernel\n", key.c_str(),
                     why.c_str());
    }
    AttentionShape fallback = shape;
    fallback.cudnn = false;
    run = plan_attention(fallback);
  }
  if (run.kernel == AttentionKernel::kFlashMma) {
    switch (run.flash_block) {
      case FlashBlock::k4x16n64: a.flash_warps = 4, a.flash_warp_mtiles = 1, a.flash_columns = 64; break;
      case FlashBlock::k8x16n64: a.flash_warps = 8, a.flash_warp_mtiles = 1, a.flash_columns = 64; break;
      case FlashBlock::k4x32n64: a.flash_warps = 4, a.flash_warp_mtiles = 2, a.flash_columns = 64; break;
      case FlashBlock::k4x32n32: a.flash_warps = 4, a.flash_warp_mtiles = 2, a.flash_columns = 32; break;
    }
    launch_attention_flash_mma(a, out.raw(), stream);
    return out;
  }
  a.split_vec = run.kernel == AttentionKernel::kSplitVec;
  const int64_t rows_heads = rows * spec.heads;
  const int64_t bytes = SplitWorkspace::bytes(run.splits, rows_heads, spec.head_dim_v);
  Tensor ws = Tensor::empty({(bytes + 3) / 4}, DType::kF32, dev);
  SplitWorkspace w;
  w.splits = run.splits;
  w.l = static_cast<double*>(ws.raw());  // first: 8-byte aligned
  w.m = reinterpret_cast<float*>(w.l + run.splits * rows_heads);
  w.acc = w.m + run.splits * rows_heads;
  launch_attention_split(a, w, out.raw(), stream);
  return out;
}

}  // namespace moex::ops::cuda
