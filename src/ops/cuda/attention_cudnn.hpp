// Prompt attention through cuDNN's fused flash attention (its SDPA graph), loaded at run time.
//
// Why: on the H200 a 4096-token causal prompt (16 heads of 128) takes 0.40 ms in the project's
// mma.sync flash kernel and ~0.15 ms in cuDNN's Hopper kernel (wgmma, TMA, warp specialisation);
// DeepSeek's expanded MLA prompt (128 heads, 192 / 128) 8.5 against 1.1 ms; attention is the
// largest single cost of a long prompt. cuDNN covers the plain case only: bf16 / f16, sdpa
// semantics, causal, no sinks, no sliding window, no left padding, separate keys and values; the
// plan (attention_plan.hpp) sends everything else to the project's kernels.
//
// How: the header-only cuDNN frontend (pip package nvidia-cudnn-frontend) builds one SDPA graph per
// shape (batch, heads, kv heads, prompt length, cached length, head dim, cache capacity when
// batched, dtype, scale), on a builder thread, kept for the life of the process: until a shape's
// graph is ready its calls run the project's flash kernel (a graph costs ~50 ms to plan, more than
// one prompt saves). libcudnn.so.9 is opened with dlopen at the first use,
// so neither the build nor a machine without cuDNN needs it (the library is looked up as
// $MOEX_CUDNN_LIBRARY, then libcudnn.so.9 on the loader's path). The host knows the cached length
// of a prompt step (prompts are launched directly, never captured into a graph), so the graph is
// built with exact lengths and bottom-right causal alignment. MOEX_CUDNN=0 turns it off.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "ops/cuda/attention_launchers.hpp"

namespace moex::ops::cuda {

// Whether cuDNN attention can be used in this process: built with the frontend, not disabled by
// MOEX_CUDNN=0, and libcudnn loaded (tried once). Never throws.
bool cudnn_attention_available();
// One line for `moex info` and the benches: "cuDNN 9.x.y (libcudnn.so.9)" or why it is not used.
std::string cudnn_attention_status();

// Calls executed through cuDNN so far in this process (tests: that a forced plan really ran there).
int64_t cudnn_attention_calls();
// Build each shape's graph on the calling thread at its first call instead of on the builder
// thread (tests and benchmarks that need a given call to run cuDNN).
void cudnn_attention_synchronous_builds(bool on);

enum class CudnnLaunch {
  kRan,          // out is written (stream-ordered)
  kBuilding,     // the shape's graph is being built on the builder thread; run another kernel now
  kUnsupported,  // cuDNN has no engine for the shape (or is not loaded); *why says why
};
// Runs attention for a prompt step over `past` cached columns plus a.tokens new ones (queries
// [batch * tokens, heads * dk], cache [batch, capacity, kv_heads * d]), writing out [rows, heads * dv].
// Throws DeviceError when a built graph fails to execute.
CudnnLaunch launch_attention_cudnn(const AttentionArgs& a, int64_t past, int device, void* out, cudaStream_t stream,
                                   std::string* why);

}  // namespace moex::ops::cuda
