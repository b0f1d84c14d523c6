// The CUDA side of moex/bench.hpp (dispatched to from src/cpu/engine_bench.cpp): ceilings, timing
// and the graph replay check, built only from the helpers of runtime.hpp.
#pragma once

#include <functional>

#include "moex/bench.hpp"

namespace moex::cuda {

::moex::Ceilings bench_ceilings(Device device, DType dtype, const CeilingsOptions& options);
double bench_time_ms(Device device, const std::function<void()>& fn, bool use_graph, int warmup,
                     int iters);
Tensor bench_graph_replay_output(Device device, const std::function<Tensor()>& fn);
int64_t bench_reserved_bytes(Device device);
double bench_peer_copy_gbps(Device src, Device dst);
bool bench_l2_flush_writes();

}  // namespace moex::cuda
