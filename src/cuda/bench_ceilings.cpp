// The CUDA side of moex/bench.hpp: device checks and the current-device guard around the timing
// and ceiling helpers of runtime.hpp, plus the graph replay check of `moex bench experts`.
#include "cuda/bench_ceilings.hpp"

#include <string>

#include "cuda/runtime.hpp"
#include "moex/error.hpp"

namespace moex::cuda {
namespace {

void require_gpu(Device device) {
  const int n = device_count();
  if (n == 0) throw Unsupported(device.str() + ": no CUDA GPU is visible");
  if (device.index < 0 || device.index >= n)
    throw Unsupported(device.str() + ": only " + std::to_string(n) + " CUDA GPU(s) are visible");
}

// Destroys what a capture made, on every exit path.
struct GraphHolder {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ~GraphHolder() {
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
  }
};

}  // namespace

::moex::Ceilings bench_ceilings(Device device, DType dtype, const CeilingsOptions& options) {
  require_gpu(device);
  DeviceGuard guard(device.index);
  ::moex::Ceilings c;
  c.unit = device_info(device.index).name;
  if (options.bandwidth || options.peak) {
    const Ceilings m = measure_ceilings(dtype);  // both: one call measures the two
    if (options.bandwidth) c.copy_gbps = m.bandwidth_gbs;
    if (options.peak) c.peak_tflops = m.peak_tflops;
  }
  return c;
}

double bench_time_ms(Device device, const std::function<void()>& fn, bool use_graph, int warmup,
                     int iters) {
  require_gpu(device);
  DeviceGuard guard(device.index);
  return time_ms(fn, use_graph, warmup, iters);
}

bool bench_l2_flush_writes() { return l2_flush_writes(); }

double bench_peer_copy_gbps(Device src, Device dst) {
  require_gpu(src);
  require_gpu(dst);
  const size_t bytes = size_t(1) << 30;
  void* b = nullptr;
  {
    DeviceGuard guard(dst.index);
    b = cache_alloc(bytes, dst.index);
  }
  DeviceGuard guard(src.index);
  void* a = cache_alloc(bytes, src.index);
  cudaStream_t s = current_stream();
  MOEX_CUDA_CHECK(cudaMemsetAsync(a, 1, bytes, s));
  const double ms = time_ms(
      [&] { MOEX_CUDA_CHECK(cudaMemcpyPeerAsync(b, dst.index, a, src.index, bytes, s)); }, false, 3, 10);
  cache_free(a, src.index);
  {
    DeviceGuard g(dst.index);
    cache_free(b, dst.index);
  }
  return double(bytes) / (ms * 1e-3) / 1e9;
}

int64_t bench_reserved_bytes(Device device) {
  require_gpu(device);
  return int64_t(allocator_stats().bytes_reserved);
}

Tensor bench_graph_replay_output(Device device, const std::function<Tensor()>& fn) {
  require_gpu(device);
  DeviceGuard guard(device.index);
  cudaStream_t s = current_stream();
  (void)fn();  // outside capture: lazy setup; its output returns to the cache for the capture
  MOEX_CUDA_CHECK(cudaStreamSynchronize(s));
  GraphHolder g;
  Tensor out;
  MOEX_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  try {
    out = fn();
  } catch (...) {
    cudaGraph_t partial = nullptr;
    cudaStreamEndCapture(s, &partial);
    if (partial) cudaGraphDestroy(partial);
    throw;
  }
  MOEX_CUDA_CHECK(cudaStreamEndCapture(s, &g.graph));
  MOEX_CUDA_CHECK(cudaGraphInstantiate(&g.exec, g.graph, 0));
  // All-ones bytes are NaN in fp32, fp16 and bf16: an element the replay leaves unwritten fails
  // any check, and so does a stale result of the direct launch that the capture's output block
  // might otherwise still hold.
  MOEX_CUDA_CHECK(cudaMemsetAsync(out.raw(), 0xff, out.nbytes(), s));
  MOEX_CUDA_CHECK(cudaGraphLaunch(g.exec, s));
  MOEX_CUDA_CHECK(cudaStreamSynchronize(s));
  return out;
}

}  // namespace moex::cuda
