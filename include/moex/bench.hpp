// What `moex bench experts` measures besides the experts call itself: the ceilings its floor
// divides by, and CUDA timing with and without graphs. Public so that any tool (the CLI is one)
// bounds and times the experts call the same way, without reaching into the library's internals.
//
// The floor of a call is max(bytes / bandwidth, flops / peak): the time it would take if it only
// moved its bytes at the measured bandwidth, or only did its flops at the measured peak.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "moex/cpu_kernels.hpp"
#include "moex/device.hpp"
#include "moex/dtype.hpp"
#include "moex/experts.hpp"
#include "moex/tensor.hpp"

namespace moex {

struct Ceilings {
  // CPU: DRAM read bandwidth, GB/s = bytes / seconds / 1e9, of a 1 GiB buffer on 2 MiB pages (like
  // the engine's packed weights) read by all OpenMP threads with 512-bit loads (64-bit where
  // AVX-512 is missing); best of 3 passes. 0 on CUDA (not measured).
  double read_gbps = 0;
  // CUDA: device-to-device copy bandwidth, GB/s = 2 * bytes / seconds / 1e9 (each byte read and
  // written), cudaMemcpyAsync of 2 GiB, median of 10 timed runs. 0 on the CPU (not measured).
  double copy_gbps = 0;
  // Peak of the unit the experts kernels use for the dtype, TFLOP/s = flops / seconds / 1e12:
  //   CPU: a register-resident loop of the kernel path's family, all OpenMP threads, best of 3
  //        (bf16: AMX TDPBF16PS tiles, VDPBF16PS, or FMA on widened values; fp32: FMA; the
  //        portable path: its own GEMM on a cache-resident block);
  //   CUDA: cuBLAS GEMM M = N = K = 8192 in the dtype (fp32: plain fp32, no TF32), 2 * 8192^3
  //        flops, median of 10 timed runs.
  double peak_tflops = 0;
  // What the peak was measured for: the CPU kernel path ("avx512bf16") or the GPU's name.
  std::string unit;
  // The bandwidth the memory floor divides by: read on the CPU (the experts stream their weights
  // in), copy on CUDA.
  double bandwidth_gbps() const { return read_gbps > 0 ? read_gbps : copy_gbps; }
};

struct CeilingsOptions {
  // Measure the bandwidth / the peak (each takes about a second); a field not measured stays 0.
  bool bandwidth = true;
  bool peak = true;
  // CPU: the kernel path whose peak is measured; unset: default_cpu_kernel_path().
  std::optional<CpuKernelPath> cpu_kernel;
};

// Measures the ceilings of `device` for experts of `dtype` (kBF16, kF16, kF32; the CPU measures
// kF16 like kBF16). Throws Unsupported for a CUDA device in a build without CUDA or when no GPU
// is visible, for a forced CPU kernel path this CPU cannot run, and for other device kinds;
// DeviceError when a CUDA call fails.
Ceilings measure_ceilings(Device device, DType dtype, const CeilingsOptions& options = {});

// Median milliseconds of `iters` event-timed runs of fn on the current stream of CUDA `device`,
// after `warmup` untimed runs; the L2 is flushed before every timed run (weights come from HBM,
// as in a model). With use_graph, fn is captured once into a CUDA graph and its replays are
// timed. Throws Unsupported without CUDA, DeviceError when a CUDA call fails.
double time_cuda_ms(Device device, const std::function<void()>& fn, bool use_graph, int warmup,
                    int iters);
// How time_cuda_ms flushes the L2: "read" (a read of 256 MiB, leaving clean lines as a model step
// does; the default) or "write" (MOEX_BENCH_L2_FLUSH=write: a memset, as triton's do_bench).
std::string cuda_l2_flush();

// What a replay of `fn` captured in a CUDA graph computes: runs fn once outside capture (lazy
// setup), captures a second call into a graph, fills the tensor that call returned with NaN,
// replays the graph once and waits. The returned tensor (on `device`) then holds what the replay
// wrote, so a benchmark that times replays can check them and not only a direct launch. Throws
// Unsupported without CUDA, DeviceError when a CUDA call fails (for instance when fn synchronises
// or allocates while captured).
Tensor graph_replay_output(Device device, const std::function<Tensor()>& fn);

// Synthetic block-scaled experts weights on the host for spec.quant (FP8 or FP4; the layout of
// the QuantScheme contract in moex/experts.hpp), from `seed`: codes spread over the whole e4m3 /
// e2m1 range and random block scales (float32 in [0.5, 2) x, or UE8M0 2^{-1, 0, 1} x, a base
// chosen so that the dequantized weights are ~ 1 / sqrt(K), like the bf16 synthetic ones).
// Throws InvalidInput when the spec is not a valid quantized one.
ExpertsWeights random_quantized_experts_weights(const ExpertsSpec& spec, uint64_t seed);

// Peer copy bandwidth from CUDA device `src` to `dst` (NVLink or PCIe, whichever the driver
// uses), GB/s = bytes / seconds / 1e9: cudaMemcpyPeerAsync of 1 GiB, median of 10 timed runs.
// The ceiling `moex bench comm` divides the collectives' bytes by. Throws Unsupported without
// CUDA or when a device is not visible, InvalidInput when src == dst.
double measure_peer_copy_gbps(Device src, Device dst);
// Peak memory of this process on `device`, bytes. CUDA: what moex's caching allocator holds (it
// returns nothing to the driver while a process runs, so this is its peak; cuBLAS' own handles
// and the CUDA context are not counted). CPU: the peak resident set (getrusage).
int64_t peak_memory_bytes(Device device);

}  // namespace moex
