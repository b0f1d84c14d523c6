// CUDA foundation: the one error check, device properties read at run time, a caching allocator,
// the current stream, and the timing / ceiling helpers the benchmarks use.
//
// Design notes.
// - Every CUDA runtime / cuBLAS call goes through MOEX_CUDA_CHECK / MOEX_CUBLAS_CHECK, which throw
//   moex::DeviceError naming the call, file:line and the current device. Library code never aborts.
// - The caching allocator keeps freed blocks per (device, size class) and never returns memory to
//   the driver while a process runs (empty_cache() does, outside graph capture), so a forward pass
//   performs no cudaMalloc/cudaFree once warm and never synchronises the host. Blocks are reused in
//   stream order on the single current stream of a device, which makes reuse safe without events.
// - The current stream is per thread and per device (default: a non-blocking stream created on first
//   use), so work can be captured into a CUDA graph (the legacy default stream cannot be captured).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <utility>
#include <vector>
#include <string>

#include "moex/device.hpp"
#include "moex/dtype.hpp"
#include "moex/error.hpp"
#include "moex/tensor.hpp"

namespace moex::cuda {

// Throws DeviceError "cudaMemcpyAsync(...) failed at file.cu:42 on cuda:0: invalid argument".
[[noreturn]] void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line);
[[noreturn]] void throw_cublas_error(int status, const char* call, const char* file, int line);

#define MOEX_CUDA_CHECK(call)                                                          \
  do {                                                                                 \
    cudaError_t moex_err_ = (call);                                                    \
    if (moex_err_ != cudaSuccess)                                                      \
      ::moex::cuda::throw_cuda_error(moex_err_, #call, __FILE__, __LINE__);            \
  } while (0)
// After a kernel launch: reports launch-configuration errors without synchronising.
#define MOEX_CUDA_CHECK_LAUNCH(name) MOEX_CUDA_CHECK(cudaPeekAtLastError())
#define MOEX_CUBLAS_CHECK(call)                                                        \
  do {                                                                                 \
    int moex_st_ = int(call);                                                          \
    if (moex_st_ != 0) ::moex::cuda::throw_cublas_error(moex_st_, #call, __FILE__, __LINE__); \
  } while (0)

// ---- devices ----
int device_count();  // 0 when there is no GPU or no driver; never throws
struct DeviceInfo {
  std::string name;
  int major = 0, minor = 0;
  int sm_count = 0;
  size_t l2_bytes = 0;
  size_t smem_per_block_optin = 0;  // dynamic shared memory a block may opt in to
  size_t total_mem = 0;
};
const DeviceInfo& device_info(int device);  // read once per device with cudaGetDeviceProperties
int current_device();
// RAII: makes `device` current for the scope (only calls cudaSetDevice when it differs).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_;
};

// ---- streams ----
cudaStream_t current_stream();           // of the current device, this thread
void set_current_stream(cudaStream_t s);  // for the current device, this thread (nullptr: default)
void synchronize();                       // the current stream
// A second stream of the current device for this thread (non-blocking, created on first use), for
// work that runs beside the current stream's (stream_branch.cpp forks and joins it).
cudaStream_t side_stream();
// Whether current_stream() is made at the device's greatest priority (side_stream() at its least);
// MOEX_STREAM_PRIORITIES=0 makes both the default, for measuring.
bool stream_priorities();
// Work on a stream branch's side (device_hooks.cpp enters and leaves it) runs beside another
// chain of kernels. A kernel that sizes a persistent grid (a few resident blocks per SM, each
// looping over its share: the one-row GEMV) takes at most side_blocks_per_sm() blocks per SM
// there, so that the other chain's next kernel finds room to become resident instead of waiting
// for the persistent grid to retire. 0: no cap (outside a side). MOEX_SIDE_BLOCKS_PER_SM sets the
// cap, for measuring.
int side_blocks_per_sm();
void set_on_side(bool on);  // this thread's launches are on a branch's side
// A measuring switch: the integer value of the environment variable `name` (one of the table in
// src/core/env_switches.cpp), or `fallback` when it is unset; a value the table does not accept
// throws InvalidInput naming it. Read once per name by the caller (static).
int env_int(const char* name, int fallback);

// ---- memory ----
// Caching allocator: 256-byte aligned device memory; the release returns the block to the cache.
std::shared_ptr<Storage> alloc_storage(size_t bytes, int device);
// Raw form for workspaces: returns a block of at least `bytes`; give it back with cache_free.
void* cache_alloc(size_t bytes, int device, size_t* capacity = nullptr);
void cache_free(void* p, int device);
void empty_cache();  // returns cached blocks to the driver (not while a stream is capturing)

// A private memory pool for a captured graph. While a PrivatePoolScope names it on a thread,
// that thread's allocations on the pool's device come from the pool (new blocks are taken from
// the global cache and stay the pool's) and their frees return there. A graph bakes the
// addresses of every tensor its captured work touched, the scratch tensors freed during capture
// included: kept in the pool, those blocks are never handed to other work while the graph may be
// replayed. Destroying the pool (after the graph) returns its blocks to the global cache.
class PrivatePool {
 public:
  explicit PrivatePool(int device);
  ~PrivatePool();
  PrivatePool(const PrivatePool&) = delete;
  PrivatePool& operator=(const PrivatePool&) = delete;
  int device_;
  std::multimap<size_t, void*> free_;                // free blocks of the pool: capacity -> ptr
  std::vector<std::pair<void*, size_t>> blocks_;     // every block the pool owns
};
class PrivatePoolScope {
 public:
  explicit PrivatePoolScope(PrivatePool* pool);
  ~PrivatePoolScope();
  PrivatePoolScope(const PrivatePoolScope&) = delete;
  PrivatePoolScope& operator=(const PrivatePoolScope&) = delete;

 private:
  PrivatePool* prev_;
};
// Frees deferred while a stream branch is open. The cache hands a block to the next allocation in
// host order, which is safe on one stream (its work is ordered) but not across two: a block freed
// while work of the other stream may still read it could be handed to this one. While a
// DeferFreesScope is open on a thread, that thread's frees of `device` blocks are held and made at
// its end (the join, after which both streams' earlier work is ordered before anything new).
class DeferFreesScope {
 public:
  explicit DeferFreesScope(int device);
  ~DeferFreesScope();  // frees what was held
  DeferFreesScope(const DeferFreesScope&) = delete;
  DeferFreesScope& operator=(const DeferFreesScope&) = delete;

 private:
  int device_;
  std::vector<void*> held_;
  DeferFreesScope* prev_;
  friend void cache_free(void* p, int device);
};
struct AllocatorStats {
  size_t cuda_mallocs = 0;   // cudaMalloc calls so far (a warm forward adds none)
  size_t bytes_reserved = 0;
};
AllocatorStats allocator_stats();

// Copies between any two devices (host <-> CUDA, CUDA <-> CUDA) and waits for completion.
void copy_bytes(void* dst, Device dst_dev, const void* src, Device src_dev, size_t bytes);

// ---- timing and ceilings ----
// Median milliseconds of `iters` event-timed runs of fn on the current stream after `warmup`
// untimed runs. With use_graph, fn is captured once into a CUDA graph and its replays are timed.
// The L2 cache is flushed before every timed run (a read of 256 MiB, untimed: clean lines, as a
// model step leaves it; MOEX_BENCH_L2_FLUSH=write zeroes them instead, as
// triton.testing.do_bench does), so that weights are read from HBM as in a real model.
double time_ms(const std::function<void()>& fn, bool use_graph, int warmup, int iters);
// Whether time_ms flushes by writing (MOEX_BENCH_L2_FLUSH=write) rather than reading.
bool l2_flush_writes();

struct Ceilings {
  double bandwidth_gbs = 0;  // device-to-device copy, bytes read + written per second / 1e9
  double peak_tflops = 0;    // cuBLAS GEMM 8192^3 in the dtype (fp32: plain fp32, no tf32)
};
Ceilings measure_ceilings(DType dtype);

}  // namespace moex::cuda
