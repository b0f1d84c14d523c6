// moex/bench.hpp: the CPU ceilings (engine_ceilings.cpp) and the dispatch to the CUDA side
// (src/cuda/bench_ceilings.cpp) where the build has it.
#include "moex/bench.hpp"

#include <sys/resource.h>

#include <string>

#include "cpu/engine.hpp"
#include "moex/error.hpp"
#ifdef MOEX_WITH_CUDA
#include "cuda/bench_ceilings.hpp"
#endif

namespace moex {
namespace {

[[maybe_unused, noreturn]] void no_cuda(Device device) {
  throw Unsupported(device.str() + ": this moex was built without CUDA");
}

}  // namespace

Ceilings measure_ceilings(Device device, DType dtype, const CeilingsOptions& options) {
  if (device.is_cuda()) {
#ifdef MOEX_WITH_CUDA
    return cuda::bench_ceilings(device, dtype, options);
#else
    no_cuda(device);
#endif
  }
  if (!device.is_cpu())
    throw Unsupported("ceilings are measured on the CPU and on CUDA devices, not on " +
                      device.str());
  const cpu::KernelPath path = options.cpu_kernel.value_or(cpu::selected_kernel_path());
  if (!cpu::kernel_path_supported(path))
    throw Unsupported("CPU kernel path '" + std::string(cpu::kernel_path_name(path)) +
                      "' cannot run on this CPU; it runs " +
                      std::string(cpu::kernel_path_name(cpu::best_kernel_path())) + " and below");
  Ceilings c;
  c.unit = std::string(cpu::kernel_path_name(path));
  if (options.bandwidth) c.read_gbps = cpu::measure_dram_read_gbs();
  if (options.peak) c.peak_tflops = cpu::measure_kernel_peak_gflops(dtype, path) / 1e3;
  return c;
}

double time_cuda_ms(Device device, const std::function<void()>& fn, bool use_graph, int warmup,
                    int iters) {
  if (!device.is_cuda()) throw Unsupported("time_cuda_ms needs a CUDA device, not " + device.str());
#ifdef MOEX_WITH_CUDA
  return cuda::bench_time_ms(device, fn, use_graph, warmup, iters);
#else
  (void)fn, (void)use_graph, (void)warmup, (void)iters;
  no_cuda(device);
#endif
}

std::string cuda_l2_flush() {
#ifdef MOEX_WITH_CUDA
  return cuda::bench_l2_flush_writes() ? "write" : "read";
#else
  return "read";
#endif
}

double measure_peer_copy_gbps(Device src, Device dst) {
  if (!src.is_cuda() || !dst.is_cuda())
    throw Unsupported("peer copies are between CUDA devices, not " + src.str() + " -> " + dst.str());
  if (src == dst) throw InvalidInput("measure_peer_copy_gbps: two different devices, got " + src.str() + " twice");
#ifdef MOEX_WITH_CUDA
  return cuda::bench_peer_copy_gbps(src, dst);
#else
  no_cuda(src);
#endif
}

int64_t peak_memory_bytes(Device device) {
  if (device.is_cuda()) {
#ifdef MOEX_WITH_CUDA
    return cuda::bench_reserved_bytes(device);
#else
    no_cuda(device);
#endif
  }
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return int64_t(ru.ru_maxrss) * 1024;  // Linux reports kilobytes
}

Tensor graph_replay_output(Device device, const std::function<Tensor()>& fn) {
  if (!device.is_cuda())
    throw Unsupported("graph_replay_output needs a CUDA device, not " + device.str());
#ifdef MOEX_WITH_CUDA
  return cuda::bench_graph_replay_output(device, fn);
#else
  (void)fn;
  no_cuda(device);
#endif
}

}  // namespace moex
