// Programmatic dependent launch (Hopper): a kernel launched with launch_pdl may be scheduled
// while the kernel before it in the stream is still running, and does its independent work
// (streaming weights that no kernel writes) before pdl_wait(), which returns once that kernel has
// completed and its writes are visible.
//
// Why: a batch-1 decode step is ~400 small kernels; measured on the H200 (docs/gpu_model.md) a
// 8-25 MB GEMV spends ~2 us of its ~5-10 us ramping its DRAM stream up and down, and every kernel
// pays a launch gap. With PDL the GEMV's weight loads overlap the norm / attention combine /
// activation kernel before it.
//
// Rules that keep it correct:
// - A kernel launched with launch_pdl reads nothing another kernel writes, and writes nothing,
//   before pdl_wait() (weights, biases and shapes only), with one exception: what is written two
//   or more launches before it on its stream (the step's rope positions: the upload or the last
//   step's feed, then at least the embedding) is complete when it starts, by the next rule.
// - pdl_trigger() (let the next PDL kernel be scheduled) may come anywhere in a kernel; kernels
//   here call it after their own pdl_wait(), so a dependent that passes its wait knows every
//   earlier kernel of the stream has completed, not only its immediate predecessor.
// - Both are no-ops for a kernel launched normally, and launches without PDL (MOEX_PDL=0, for
//   measuring) give the same results.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "cuda/runtime.hpp"

namespace moex::cuda {

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// The start of a kernel launched with launch_pdl that has no independent work to do first: wait
// for the kernels before it, then let the next one be scheduled (its launch and block start-up
// overlap this kernel instead of following it). Most decode-step kernels (norms, rope, cache
// append, attention, routing, element-wise ops, sampling) begin with it: a batch-1 step is ~400
// launches whose gaps the graph alone does not remove.
__device__ __forceinline__ void pdl_enter() {
  pdl_wait();
  pdl_trigger();
}

// Whether launches use PDL: devices of compute capability 9.0 and later, unless MOEX_PDL=0.
bool pdl_enabled(int device);

template <class... KArgs, class... Args>
void launch_pdl(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                int device, Args&&... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = pdl_enabled(device) ? 1 : 0;
  MOEX_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

// launch_pdl on the current device.
template <class... KArgs, class... Args>
void launch_pdl_here(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                     Args&&... args) {
  launch_pdl(kernel, grid, block, smem, stream, current_device(), std::forward<Args>(args)...);
}

}  // namespace moex::cuda
