// CUDA foundation: see runtime.hpp for the design notes.
#include "cuda/runtime.hpp"
#include "cuda/pdl.cuh"
#include "core/env_switch_read.hpp"

#include <cublas_v2.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace moex::cuda {

namespace {
int device_for_message() {
  int d = -1;
  if (cudaGetDevice(&d) != cudaSuccess) d = -1;
  return d;
}
}  // namespace

void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line) {
  cudaGetLastError();  // clear a non-sticky error so the next call starts clean
  throw DeviceError(std::string(call) + " failed at " + file + ":" + std::to_string(line) +
                    " on cuda:" + std::to_string(device_for_message()) + ": " +
                    cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
}

void throw_cublas_error(int status, const char* call, const char* file, int line) {
  throw DeviceError(std::string(call) + " failed at " + file + ":" + std::to_string(line) +
                    " on cuda:" + std::to_string(device_for_message()) + ": cuBLAS status " +
                    std::to_string(status));
}

// ---------------------------------------------------------------- devices

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

const DeviceInfo& device_info(int device) {
  static std::mutex mu;
  static std::map<int, DeviceInfo> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(device);
  if (it != cache.end()) return it->second;
  cudaDeviceProp p{};
  MOEX_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
  DeviceInfo d;
  d.name = p.name;
  d.major = p.major;
  d.minor = p.minor;
  d.sm_count = p.multiProcessorCount;
  d.l2_bytes = size_t(p.l2CacheSize);
  d.smem_per_block_optin = p.sharedMemPerBlockOptin;
  d.total_mem = p.totalGlobalMem;
  return cache.emplace(device, d).first->second;
}

int current_device() {
  int d = 0;
  MOEX_CUDA_CHECK(cudaGetDevice(&d));
  return d;
}

DeviceGuard::DeviceGuard(int device) : prev_(current_device()) {
  if (device != prev_) MOEX_CUDA_CHECK(cudaSetDevice(device));
}
DeviceGuard::~DeviceGuard() {
  int now = -1;
  if (cudaGetDevice(&now) == cudaSuccess && now != prev_) cudaSetDevice(prev_);
}

// ---------------------------------------------------------------- streams

namespace {
constexpr int kMaxDevices = 64;
constexpr int kSideBlocksPerSm = 2;
thread_local cudaStream_t t_streams[kMaxDevices] = {};
thread_local bool t_stream_set[kMaxDevices] = {};
}  // namespace

cudaStream_t current_stream() {
  int d = current_device();
  if (d < 0 || d >= kMaxDevices) return nullptr;
  if (!t_stream_set[d]) {
    // A non-blocking stream, created once per thread and device and kept for the process: the
    // legacy default stream cannot be captured into a graph. At the device's greatest priority,
    // so that where side_stream() work runs beside it, its blocks are scheduled first.
    cudaStream_t s = nullptr;
    int least = 0, greatest = 0;
    MOEX_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    MOEX_CUDA_CHECK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, stream_priorities() ? greatest : least));
    t_streams[d] = s;
    t_stream_set[d] = true;
  }
  return t_streams[d];
}

void set_current_stream(cudaStream_t s) {
  int d = current_device();
  if (d < 0 || d >= kMaxDevices) return;
  t_streams[d] = s;
  t_stream_set[d] = true;
}

void synchronize() { MOEX_CUDA_CHECK(cudaStreamSynchronize(current_stream())); }

bool stream_priorities() {
  static const bool on = env_int("MOEX_STREAM_PRIORITIES", 1) != 0;
  return on;
}

cudaStream_t side_stream() {
  thread_local cudaStream_t side[kMaxDevices] = {};
  const int d = current_device();
  if (d < 0 || d >= kMaxDevices) return nullptr;
  // At the least priority: the work beside the current stream fills the SMs its chain leaves
  // idle, and gives way as blocks retire (graphs keep the priorities: capture_graph instantiates
  // with per-node priorities).
  if (!side[d]) {
    int least = 0, greatest = 0;
    MOEX_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    MOEX_CUDA_CHECK(cudaStreamCreateWithPriority(&side[d], cudaStreamNonBlocking, least));
  }
  return side[d];
}

int env_int(const char* name, int fallback) { return int(env_switch_int(name, fallback)); }

namespace {
thread_local bool t_on_side = false;
}  // namespace

void set_on_side(bool on) { t_on_side = on; }

int side_blocks_per_sm() {
  // Measured on the H200 (docs/gpu_model.md): the shared expert's gate / up GEMV on the side
  // stream, beside the router's top-k and the routed experts' GEMVs of a batch-1 decode step.
  static const int cap = env_int("MOEX_SIDE_BLOCKS_PER_SM", kSideBlocksPerSm);
  return t_on_side ? cap : 0;
}

// ---------------------------------------------------------------- caching allocator

namespace {

struct Pool {
  std::mutex mu;
  // Free blocks per device: capacity -> pointers.
  std::map<int, std::multimap<size_t, void*>> free_blocks;
  std::unordered_map<void*, std::pair<int, size_t>> live;  // ptr -> (device, capacity)
  // Blocks owned by a private pool (see PrivatePool): a free returns them there.
  std::unordered_map<void*, PrivatePool*> owner;
  AllocatorStats stats;
};
thread_local PrivatePool* t_private = nullptr;
thread_local DeferFreesScope* t_defer = nullptr;
Pool& pool() {
  static Pool* p = new Pool();  // leaked on purpose: blocks may be released during static teardown
  return *p;
}

size_t round_size(size_t bytes) {
  if (bytes <= (size_t(1) << 20)) return std::max<size_t>(512, (bytes + 511) / 512 * 512);
  return (bytes + (size_t(2) << 20) - 1) / (size_t(2) << 20) * (size_t(2) << 20);
}

}  // namespace

void* cache_alloc(size_t bytes, int device, size_t* capacity) {
  size_t want = round_size(bytes);
  Pool& p = pool();
  PrivatePool* priv = t_private && t_private->device_ == device ? t_private : nullptr;
  if (priv) {
    std::lock_guard<std::mutex> lock(p.mu);
    auto it = priv->free_.lower_bound(want);
    if (it != priv->free_.end() && it->first <= 2 * want) {
      void* ptr = it->second;
      const size_t cap = it->first;
      priv->free_.erase(it);
      p.live[ptr] = {device, cap};
      if (capacity) *capacity = cap;
      return ptr;
    }
  }
  if (priv) {
    // A new block for the private pool: from the global cache or the driver, owned by the pool
    // from now on.
    t_private = nullptr;
    size_t cap = 0;
    void* ptr = nullptr;
    try {
      ptr = cache_alloc(bytes, device, &cap);
    } catch (...) {
      t_private = priv;
      throw;
    }
    t_private = priv;
    std::lock_guard<std::mutex> lock(p.mu);
    p.owner[ptr] = priv;
    priv->blocks_.emplace_back(ptr, cap);
    if (capacity) *capacity = cap;
    return ptr;
  }
  {
    std::lock_guard<std::mutex> lock(p.mu);
    auto& fl = p.free_blocks[device];
    auto it = fl.lower_bound(want);
    // Reuse a cached block unless it would waste more than half of it.
    if (it != fl.end() && it->first <= 2 * want) {
      void* ptr = it->second;
      size_t cap = it->first;
      fl.erase(it);
      p.live[ptr] = {device, cap};
      if (capacity) *capacity = cap;
      return ptr;
    }
  }
  DeviceGuard g(device);
  void* ptr = nullptr;
  cudaError_t err = cudaMalloc(&ptr, want);
  if (err == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    empty_cache();
    err = cudaMalloc(&ptr, want);
  }
  if (err == cudaErrorMemoryAllocation) {
    // What the user can act on (the sizes, not the call and line): a batch, prompt or model that
    // does not fit is bad input for this GPU, as std::bad_alloc is for the host.
    cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) cudaGetLastError();
    const auto gib = [](size_t b) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.2f GiB", double(b) / double(size_t(1) << 30));
      return std::string(buf);
    };
    throw DeviceError("out of device memory on cuda:" + std::to_string(device) + " (" + device_info(device).name +
                      "): asked for " + gib(want) + " at once with " + gib(free_b) + " of " + gib(total_b) +
                      " free; the model, the batch, the prompt or --max-new-tokens need more memory than this GPU has");
  }
  if (err != cudaSuccess)
    throw_cuda_error(err, ("cudaMalloc(" + std::to_string(want) + " bytes)").c_str(), __FILE__,
                     __LINE__);
  std::lock_guard<std::mutex> lock(p.mu);
  p.live[ptr] = {device, want};
  p.stats.cuda_mallocs++;
  p.stats.bytes_reserved += want;
  if (capacity) *capacity = want;
  return ptr;
}

void cache_free(void* ptr, int device) {
  if (!ptr) return;
  for (DeferFreesScope* d = t_defer; d; d = d->prev_)
    if (d->device_ == device) {
      d->held_.push_back(ptr);
      return;
    }
  Pool& p = pool();
  std::lock_guard<std::mutex> lock(p.mu);
  auto it = p.live.find(ptr);
  if (it == p.live.end()) return;
  size_t cap = it->second.second;
  p.live.erase(it);
  auto own = p.owner.find(ptr);
  if (own != p.owner.end()) own->second->free_.emplace(cap, ptr);
  else p.free_blocks[device].emplace(cap, ptr);
}

DeferFreesScope::DeferFreesScope(int device) : device_(device), prev_(t_defer) { t_defer = this; }

DeferFreesScope::~DeferFreesScope() {
  t_defer = prev_;
  for (void* ptr : held_) cache_free(ptr, device_);
}

PrivatePool::PrivatePool(int device) : device_(device) {}

PrivatePool::~PrivatePool() {
  Pool& p = pool();
  std::lock_guard<std::mutex> lock(p.mu);
  // Blocks still in use (a tensor made under the pool outlives it) go back to the global cache
  // when they are freed; the others go back now.
  for (auto [ptr, cap] : blocks_) p.owner.erase(ptr);
  for (auto [cap, ptr] : free_) p.free_blocks[device_].emplace(cap, ptr);
  if (t_private == this) t_private = nullptr;
}

PrivatePoolScope::PrivatePoolScope(PrivatePool* pool) : prev_(t_private) { t_private = pool; }
PrivatePoolScope::~PrivatePoolScope() { t_private = prev_; }

void empty_cache() {
  Pool& p = pool();
  std::lock_guard<std::mutex> lock(p.mu);
  for (auto& [dev, fl] : p.free_blocks) {
    DeviceGuard g(dev);
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(current_stream(), &st) == cudaSuccess &&
        st != cudaStreamCaptureStatusNone)
      continue;  // freeing during capture would invalidate it; keep the cache
    MOEX_CUDA_CHECK(cudaDeviceSynchronize());
    for (auto& [cap, ptr] : fl) {
      cudaFree(ptr);
      p.stats.bytes_reserved -= cap;
    }
    fl.clear();
  }
}

AllocatorStats allocator_stats() {
  Pool& p = pool();
  std::lock_guard<std::mutex> lock(p.mu);
  return p.stats;
}

std::shared_ptr<Storage> alloc_storage(size_t bytes, int device) {
  if (device < 0 || device >= device_count())
    throw Unsupported("cuda:" + std::to_string(device) + " does not exist (this machine has " +
                      std::to_string(device_count()) + " CUDA devices)");
  if (bytes == 0) return std::make_shared<Storage>(nullptr, 0, Device::cuda(device), nullptr);
  void* p = cache_alloc(bytes, device);
  return std::make_shared<Storage>(p, bytes, Device::cuda(device),
                                   [device](void* q) { cache_free(q, device); });
}

namespace {

// Host -> device copies of weights come from memory-mapped files: pageable memory, which the
// driver would stage through its own small pinned buffer one piece at a time. Large copies go
// through two pinned 16 MiB buffers instead: while the DMA of one runs, the CPU reads the next
// piece of the file into the other (reading the page cache / disk overlaps with the transfer).
constexpr size_t kStageBytes = size_t(16) << 20;
constexpr size_t kStagedFrom = size_t(4) << 20;

struct Staging {
  void* buf[2] = {nullptr, nullptr};
  cudaEvent_t done[2] = {nullptr, nullptr};
};

void staged_upload(char* dst, const char* src, size_t bytes, int dev, cudaStream_t s) {
  static std::mutex mu;
  static std::map<int, Staging> staging;  // per device, kept for the process's lifetime
  std::lock_guard<std::mutex> lock(mu);
  Staging& st = staging[dev];
  if (!st.buf[0]) {
    for (int i = 0; i < 2; ++i) {
      MOEX_CUDA_CHECK(cudaHostAlloc(&st.buf[i], kStageBytes, cudaHostAllocDefault));
      MOEX_CUDA_CHECK(cudaEventCreateWithFlags(&st.done[i], cudaEventDisableTiming));
      MOEX_CUDA_CHECK(cudaEventRecord(st.done[i], s));
    }
  }
  for (size_t off = 0, i = 0; off < bytes; off += kStageBytes, i ^= 1) {
    const size_t n = std::min(kStageBytes, bytes - off);
    MOEX_CUDA_CHECK(cudaEventSynchronize(st.done[i]));  // its previous DMA has finished
    std::memcpy(st.buf[i], src + off, n);
    MOEX_CUDA_CHECK(cudaMemcpyAsync(dst + off, st.buf[i], n, cudaMemcpyHostToDevice, s));
    MOEX_CUDA_CHECK(cudaEventRecord(st.done[i], s));
  }
  MOEX_CUDA_CHECK(cudaStreamSynchronize(s));
}

}  // namespace

void copy_bytes(void* dst, Device dst_dev, const void* src, Device src_dev, size_t bytes) {
  if (bytes == 0) return;
  int dev = dst_dev.is_cuda() ? dst_dev.index : (src_dev.is_cuda() ? src_dev.index : -1);
  if (dev < 0) {
    std::copy_n(static_cast<const char*>(src), bytes, static_cast<char*>(dst));
    return;
  }
  DeviceGuard g(dev);
  cudaStream_t s = current_stream();
  if (dst_dev.is_cuda() && !src_dev.is_cuda() && bytes >= kStagedFrom) {
    staged_upload(static_cast<char*>(dst), static_cast<const char*>(src), bytes, dev, s);
    return;
  }
  MOEX_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s));
  MOEX_CUDA_CHECK(cudaStreamSynchronize(s));
}

// ---------------------------------------------------------------- timing

namespace {
constexpr size_t kFlushBytes = size_t(256) << 20;

// Reads n 16-byte words and writes nothing (unless their xor hits one value: a store the compiler
// cannot drop), so the L2 is left holding clean lines, as a model step leaves it. A memset of the
// flush buffer (do_bench's flush, MOEX_BENCH_L2_FLUSH=write) leaves it full of dirty lines
// instead, whose write-backs then share the HBM with the timed call's reads (docs/cuda.md).
__global__ void read_flush_kernel(const uint4* p, size_t n, unsigned* sink) {
  unsigned acc = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint4 v = p[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9E3779B9u) *sink = acc;
}

// The flush before each timed run: a read of kFlushBytes, or with MOEX_BENCH_L2_FLUSH=write a
// memset of them (to compare with triton.testing.do_bench, which zeroes a 256 MB buffer).
void flush_l2(void* flush, int i, int dev, cudaStream_t s) {
  if (l2_flush_writes()) {
    MOEX_CUDA_CHECK(cudaMemsetAsync(flush, i & 0xff, kFlushBytes, s));
    return;
  }
  // The first 16 bytes are the sink; the rest is read.
  read_flush_kernel<<<device_info(dev).sm_count * 4, 512, 0, s>>>(
      static_cast<const uint4*>(flush) + 1, kFlushBytes / 16 - 1, static_cast<unsigned*>(flush));
  MOEX_CUDA_CHECK(cudaGetLastError());
}
}  // namespace

bool l2_flush_writes() {
  static const bool write = env_switch_int("MOEX_BENCH_L2_FLUSH", 0) == 1;
  return write;
}

double time_ms(const std::function<void()>& fn, bool use_graph, int warmup, int iters) {
  cudaStream_t s = current_stream();
  int dev = current_device();
  void* flush = cache_alloc(kFlushBytes, dev);
  cudaGraphExec_t exec = nullptr;
  cudaGraph_t graph = nullptr;
  std::vector<cudaEvent_t> ev(2 * size_t(std::max(iters, 1)));
  for (auto& e : ev) MOEX_CUDA_CHECK(cudaEventCreate(&e));
  auto cleanup = [&]() {
    for (auto& e : ev) cudaEventDestroy(e);
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    cache_free(flush, dev);
  };
  try {
    if (use_graph) {
      fn();  // first call outside capture: lets lazy allocations and setup happen
      MOEX_CUDA_CHECK(cudaStreamSynchronize(s));
      MOEX_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
      try {
        fn();
      } catch (...) {
        cudaGraph_t g2 = nullptr;
        cudaStreamEndCapture(s, &g2);
        if (g2) cudaGraphDestroy(g2);
        throw;
      }
      MOEX_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
      MOEX_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    }
    auto run = [&]() {
      if (use_graph) MOEX_CUDA_CHECK(cudaGraphLaunch(exec, s));
      else fn();
    };
    for (int i = 0; i < warmup; ++i) run();
    for (int i = 0; i < iters; ++i) {
      flush_l2(flush, i, dev, s);
      MOEX_CUDA_CHECK(cudaEventRecord(ev[2 * i], s));
      run();
      MOEX_CUDA_CHECK(cudaEventRecord(ev[2 * i + 1], s));
    }
    MOEX_CUDA_CHECK(cudaStreamSynchronize(s));
    std::vector<float> ms(size_t(std::max(iters, 0)));
    for (int i = 0; i < iters; ++i)
      MOEX_CUDA_CHECK(cudaEventElapsedTime(&ms[i], ev[2 * i], ev[2 * i + 1]));
    cleanup();
    if (ms.empty()) return 0;
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  } catch (...) {
    cleanup();
    throw;
  }
}

namespace {

__global__ void fill_random_kernel(void* p, int dtype, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    float v = float(h & 0xffff) / 32768.f - 1.f;
    if (dtype == 0) static_cast<float*>(p)[i] = v;
    else if (dtype == 1) static_cast<__half*>(p)[i] = __float2half(v);
    else static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16(v);
  }
}

cublasHandle_t cublas_handle() {
  static std::mutex mu;
  static std::map<int, cublasHandle_t> handles;
  std::lock_guard<std::mutex> lock(mu);
  int d = current_device();
  auto it = handles.find(d);
  if (it != handles.end()) return it->second;
  cublasHandle_t h = nullptr;
  MOEX_CUBLAS_CHECK(cublasCreate(&h));
  handles[d] = h;
  return h;
}

}  // namespace

Ceilings measure_ceilings(DType dtype) {
  Ceilings c;
  int dev = current_device();
  cudaStream_t s = current_stream();
  {
    size_t bytes = size_t(2) << 30;
    void* a = cache_alloc(bytes, dev);
    void* b = cache_alloc(bytes, dev);
    MOEX_CUDA_CHECK(cudaMemsetAsync(a, 1, bytes, s));
    double ms = time_ms([&] { MOEX_CUDA_CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s)); },
                        false, 3, 10);
    c.bandwidth_gbs = 2.0 * double(bytes) / (ms * 1e-3) / 1e9;
    cache_free(a, dev);
    cache_free(b, dev);
  }
  {
    const int n = 8192;
    int code = dtype == DType::kF32 ? 0 : dtype == DType::kF16 ? 1 : 2;
    size_t es = code == 0 ? 4 : 2;
    size_t bytes = size_t(n) * n * es;
    void* a = cache_alloc(bytes, dev);
    void* b = cache_alloc(bytes, dev);
    void* d = cache_alloc(bytes, dev);
    fill_random_kernel<<<1024, 256, 0, s>>>(a, code, size_t(n) * n, 1u);
    fill_random_kernel<<<1024, 256, 0, s>>>(b, code, size_t(n) * n, 2u);
    MOEX_CUDA_CHECK_LAUNCH(fill_random_kernel);
    cublasHandle_t h = cublas_handle();
    MOEX_CUBLAS_CHECK(cublasSetStream(h, s));
    cudaDataType_t t = code == 0 ? CUDA_R_32F : code == 1 ? CUDA_R_16F : CUDA_R_16BF;
    float alpha = 1.f, beta = 0.f;
    double ms = time_ms(
        [&] {
          MOEX_CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, a, t, n, b,
                                         t, n, &beta, d, t, n, CUBLAS_COMPUTE_32F,
                                         CUBLAS_GEMM_DEFAULT));
        },
        false, 3, 10);
    c.peak_tflops = 2.0 * double(n) * n * n / (ms * 1e-3) / 1e12;
    cache_free(a, dev);
    cache_free(b, dev);
    cache_free(d, dev);
  }
  return c;
}

bool pdl_enabled(int device) {
  static const bool allowed = env_int("MOEX_PDL", 1) != 0;
  return allowed && device_info(device).major >= 9;
}

}  // namespace moex::cuda
