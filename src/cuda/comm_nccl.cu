// NcclCommunicator: the ranks of an expert-parallel group on GPUs (moex/comm.hpp has the
// contract). NCCL is opened at run time (dlopen), so libmoex carries no link dependency on it and
// a machine without it gets a clear Unsupported instead of a loader error.
//
// Every collective is: (1) an all-gather of a fixed-size description of the call (collective,
// dtype, element count or row shape, counts), which every rank checks the same way, so a
// disagreement throws the same InvalidInput on every rank and leaves the group usable; (2) the
// data movement on the current stream of the rank's device; (3) a bounded wait on that stream
// that polls ncclCommGetAsyncError and, past the timeout, aborts the communicator. The
// communicators are non-blocking: an NCCL call may return ncclInProgress while NCCL's threads
// finish it (connecting to the peers at a group's first calls), and settle() polls it against the
// same timeout before the next call, so no NCCL call can block the rank for good.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <dlfcn.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/env_switch_read.hpp"
#include "cuda/common.cuh"
#include "cuda/runtime.hpp"
#include "moex/comm.hpp"

namespace moex {
namespace {

// The NCCL entry points moex calls, looked up once.
struct NcclApi {
  ncclResult_t (*get_unique_id)(ncclUniqueId*) = nullptr;
  ncclResult_t (*comm_init_rank_config)(ncclComm_t*, int, ncclUniqueId, int, ncclConfig_t*) = nullptr;
  ncclResult_t (*all_gather)(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*send)(const void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*recv)(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*group_start)() = nullptr;
  ncclResult_t (*group_end)() = nullptr;
  ncclResult_t (*async_error)(ncclComm_t, ncclResult_t*) = nullptr;
  ncclResult_t (*abort)(ncclComm_t) = nullptr;
  ncclResult_t (*destroy)(ncclComm_t) = nullptr;
  const char* (*error_string)(ncclResult_t) = nullptr;
  std::string error;  // why it could not be loaded ("" when loaded)
};

const NcclApi& nccl() {
  static const NcclApi api = [] {
    NcclApi a;
    const std::string name = env_switch_text("MOEX_NCCL_LIBRARY").value_or("libnccl.so.2");
    void* h = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      a.error = "NCCL not found (" + name + ": " + dlerror() +
                "); install NCCL or set MOEX_NCCL_LIBRARY to its libnccl.so.2";
      return a;
    }
    auto get = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(h, name));
      if (!fn && a.error.empty()) a.error = std::string("the NCCL library lacks ") + name;
    };
    get(a.get_unique_id, "ncclGetUniqueId");
    get(a.comm_init_rank_config, "ncclCommInitRankConfig");
    get(a.all_gather, "ncclAllGather");
    get(a.send, "ncclSend");
    get(a.recv, "ncclRecv");
    get(a.group_start, "ncclGroupStart");
    get(a.group_end, "ncclGroupEnd");
    get(a.async_error, "ncclCommGetAsyncError");
    get(a.abort, "ncclCommAbort");
    get(a.destroy, "ncclCommDestroy");
    get(a.error_string, "ncclGetErrorString");
    return a;
  }();
  return api;
}

// Rank-order sum of N gathered copies: out[i] = round(((0 + g[0][i]) + g[1][i]) + ...), float32
// in between, as ThreadCommunicator adds.
template <class T>
__global__ void rank_order_sum_kernel(const T* __restrict__ gathered, T* __restrict__ out, int64_t n, int ranks) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float acc = 0.0f;
    for (int r = 0; r < ranks; ++r) acc = __fadd_rn(acc, cuda::to_float(gathered[int64_t(r) * n + i]));
    out[i] = cuda::from_float<T>(acc);
  }
}

enum Op : int64_t { kAllReduceSum = 1, kAllToAllV, kAllGather, kBarrier };
const char* op_name(int64_t op) {
  switch (op) {
    case kAllReduceSum: return "all_reduce_sum";
    case kAllToAllV: return "all_to_all_v";
    case kAllGather: return "all_gather";
    case kBarrier: return "barrier";
  }
  return "?";
}
// A call's description: op, dtype, then up to kDims shape entries (all_reduce_sum: the shape;
// all_to_all_v: the trailing shape; all_gather: the value count), zero-padded.
constexpr int kDims = 8;
constexpr int kDesc = 3 + kDims;

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, int rank, int size, int device, std::chrono::milliseconds timeout)
      : comm_(comm), rank_(rank), size_(size), device_(device), timeout_(timeout) {}
  ~NcclCommunicator() override {
    if (!comm_) return;
    cuda::DeviceGuard g(device_);
    if (aborted_.load()) return;  // (ncclCommAbort freed it)
    nccl().destroy(comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Device device() const override { return Device::cuda(device_); }

  void all_reduce_sum_enqueue(Tensor& t) override {
    cuda::DeviceGuard g(device_);
    check_open();
    if (t.device() != Device::cuda(device_) || !t.is_contiguous())
      throw InvalidInput("all_reduce_sum_enqueue: a contiguous tensor on " + Device::cuda(device_).str() + ", got " +
                         t.str());
    check_sum_dtype(t);
    if (t.numel() > 0) enqueue_sum(t);
  }

  void all_reduce_sum(Tensor& t) override {
    cuda::DeviceGuard g(device_);
    check_open();
    check_sum_dtype(t);
    if (!t.is_contiguous()) throw InvalidInput("all_reduce_sum: a contiguous tensor");
    agree(kAllReduceSum, t.dtype(), t.shape(), {});
    if (t.numel() == 0) return;
    const Device here = Device::cuda(device_);
    Tensor d = t.device() == here ? t : t.to(here);
    enqueue_sum(d);
    wait("all_reduce_sum");
    if (d.raw() != t.raw()) {
      const Tensor h = d.to(t.device());
      std::memcpy(t.raw(), h.raw(), t.nbytes());
    }
  }

  AllToAllResult all_to_all_v(const Tensor& send, const std::vector<int64_t>& send_counts) override {
    cuda::DeviceGuard g(device_);
    check_open();
    if (send.dim() < 1 || !send.is_contiguous()) throw InvalidInput("all_to_all_v: a contiguous tensor [R, ...]");
    if (int(send_counts.size()) != size_)
      throw InvalidInput("all_to_all_v: " + std::to_string(send_counts.size()) + " send counts for " +
                         std::to_string(size_) + " ranks");
    int64_t total = 0;
    for (int64_t c : send_counts) {
      if (c < 0) throw InvalidInput("all_to_all_v: a negative send count");
      total += c;
    }
    if (total != send.size(0))
      throw InvalidInput("all_to_all_v: send counts sum to " + std::to_string(total) + ", the tensor has " +
                         std::to_string(send.size(0)) + " rows");
    Shape row(send.shape().begin() + 1, send.shape().end());
    const std::vector<int64_t> counts = agree(kAllToAllV, send.dtype(), row, send_counts);  // [N][N]
    AllToAllResult r;
    int64_t rows_in = 0;
    for (int p = 0; p < size_; ++p) {
      r.counts.push_back(counts[size_t(p * size_ + rank_)]);
      rows_in += r.counts.back();
    }
    const Device here = Device::cuda(device_);
    Shape out_shape = {rows_in};
    out_shape.insert(out_shape.end(), row.begin(), row.end());
    if (total == 0 && rows_in == 0) {
      r.rows = Tensor::empty(out_shape, send.dtype(), send.device());
      return r;
    }
    const Tensor d = send.device() == here || total == 0 ? send : send.to(here);
    Tensor out = Tensor::empty(out_shape, send.dtype(), here);
    const size_t row_bytes = size_t(shape_numel(row)) * dtype_size(send.dtype());
    cudaStream_t s = cuda::current_stream();
    // One NCCL group, held together under the lock (an abort from another thread lands before or
    // after it, never inside).
    const ncclResult_t sent = locked([&] {
      ncclResult_t res = nccl().group_start();
      int64_t at_send = 0, at_recv = 0;
      for (int p = 0; p < size_ && (res == ncclSuccess || res == ncclInProgress); ++p) {
        const int64_t out_rows = send_counts[size_t(p)], in_rows = r.counts[size_t(p)];
        if (out_rows > 0)
          res = nccl().send(static_cast<const char*>(d.raw()) + at_send * row_bytes, size_t(out_rows) * row_bytes,
                            ncclUint8, p, comm_, s);
        if (in_rows > 0 && (res == ncclSuccess || res == ncclInProgress))
          res = nccl().recv(static_cast<char*>(out.raw()) + at_recv * row_bytes, size_t(in_rows) * row_bytes,
                            ncclUint8, p, comm_, s);
        at_send += out_rows;
        at_recv += in_rows;
      }
      const ncclResult_t end = nccl().group_end();
      return res == ncclSuccess || res == ncclInProgress ? end : res;
    });
    call(sent, "ncclSend / ncclRecv");
    wait("all_to_all_v");
    r.rows = send.device() == here ? out
             : rows_in == 0        ? Tensor::empty(out_shape, send.dtype(), send.device())
                                   : out.to(send.device());
    return r;
  }

  std::vector<int64_t> all_gather(const std::vector<int64_t>& values) override {
    cuda::DeviceGuard g(device_);
    check_open();
    return agree(kAllGather, DType::kI64, {int64_t(values.size())}, values);
  }

  void barrier() override {
    cuda::DeviceGuard g(device_);
    check_open();
    agree(kBarrier, DType::kI64, {}, {});
  }

  void throw_if_aborted() override { check_open(); }

  void abort(const std::string& reason) noexcept override {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_.load()) return;
    reason_ = "rank " + std::to_string(rank_) + " aborted the group: " + reason;
    aborted_.store(true);
    try {
      cuda::DeviceGuard g(device_);
      nccl().abort(comm_);
    } catch (...) {
    }
  }

 private:
  static void check_sum_dtype(const Tensor& t) {
    if (t.dtype() != DType::kF32 && t.dtype() != DType::kBF16 && t.dtype() != DType::kF16)
      throw InvalidInput("all_reduce_sum: float32, bfloat16 or float16 tensors, got " + std::string(dtype_name(t.dtype())));
  }

  // d (contiguous, on this rank's device, not empty) = the rank-order sum, as stream work.
  void enqueue_sum(Tensor& d) {
    const Device here = Device::cuda(device_);
    const int64_t n = d.numel();
    Tensor gathered = Tensor::empty({int64_t(size_), n}, d.dtype(), here);
    cudaStream_t s = cuda::current_stream();
    call(locked([&] { return nccl().all_gather(d.raw(), gathered.raw(), d.nbytes(), ncclUint8, comm_, s); }),
         "ncclAllGather");
    const int blocks = int(std::min<int64_t>((n + 255) / 256, 4096));
    if (d.dtype() == DType::kF32)
      rank_order_sum_kernel<float><<<blocks, 256, 0, s>>>(static_cast<const float*>(gathered.raw()),
                                                          static_cast<float*>(d.raw()), n, size_);
    else if (d.dtype() == DType::kBF16)
      rank_order_sum_kernel<__nv_bfloat16><<<blocks, 256, 0, s>>>(
          static_cast<const __nv_bfloat16*>(gathered.raw()), static_cast<__nv_bfloat16*>(d.raw()), n, size_);
    else
      rank_order_sum_kernel<__half><<<blocks, 256, 0, s>>>(static_cast<const __half*>(gathered.raw()),
                                                           static_cast<__half*>(d.raw()), n, size_);
    MOEX_CUDA_CHECK(cudaPeekAtLastError());
  }

  // Runs f (NCCL calls on comm_) under the lock unless the group was aborted: abort(), which may
  // come from another thread (run_ranks stopping a group), frees comm_ under the same lock.
  template <class F>
  ncclResult_t locked(F&& f) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!aborted_.load()) return f();
    }
    check_open();
    return ncclInternalError;  // (not reached: check_open throws)
  }

  void check_open() {
    if (aborted_.load()) {
      std::lock_guard<std::mutex> lock(mu_);
      throw CommError("NCCL group (rank " + std::to_string(rank_) + " of " + std::to_string(size_) + "): " + reason_);
    }
  }
  void fail(const std::string& why) {
    abort(why);
    check_open();
  }
  // An NCCL call's result: an error fails the group; ncclInProgress (non-blocking communicator)
  // is polled until NCCL's threads finish the call, bounded by the timeout.
  void call(ncclResult_t r, const char* what) {
    if (r != ncclSuccess && r != ncclInProgress) fail(std::string(what) + " failed: " + nccl().error_string(r));
    if (r == ncclInProgress) settle(what);
  }
  void settle(const char* what) {
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t q = locked([&] { return nccl().async_error(comm_, &state); });
      if (q != ncclSuccess) fail(std::string(what) + ": ncclCommGetAsyncError failed: " + nccl().error_string(q));
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) fail(std::string(what) + ": " + nccl().error_string(state));
      if (std::chrono::steady_clock::now() - start > timeout_) {
        std::ostringstream o;
        o << what << " did not complete within " << timeout_.count() << " ms: a peer did not arrive";
        fail(o.str());
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  // Waits for the stream's work, bounded by the timeout; NCCL's asynchronous errors fail it too.
  void wait(const char* what) {
    cudaStream_t s = cuda::current_stream();
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
      const cudaError_t e = cudaStreamQuery(s);
      if (e == cudaSuccess) break;
      if (e != cudaErrorNotReady) {
        (void)cudaGetLastError();
        fail(std::string(what) + ": " + cudaGetErrorString(e));
      }
      ncclResult_t async = ncclSuccess;
      if (locked([&] { return nccl().async_error(comm_, &async); }) == ncclSuccess && async != ncclSuccess &&
          async != ncclInProgress)
        fail(std::string(what) + ": " + nccl().error_string(async));
      if (std::chrono::steady_clock::now() - start > timeout_) {
        std::ostringstream o;
        o << what << " did not complete within " << timeout_.count() << " ms: a peer did not arrive";
        fail(o.str());
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
    check_open();  // aborted from another thread while its kernels ran: their results are void
  }

  // All-gathers this call's description (+ `values`, whose length must agree) and throws the same
  // InvalidInput on every rank when they differ. Returns every rank's values, rank after rank.
  std::vector<int64_t> agree(int64_t op, DType dtype, const Shape& shape, const std::vector<int64_t>& values) {
    if (shape.size() > size_t(kDims)) throw InvalidInput(std::string(op_name(op)) + ": at most 8 dimensions");
    std::vector<int64_t> desc(kDesc, 0);
    desc[0] = op;
    desc[1] = int64_t(dtype);
    desc[2] = int64_t(shape.size());
    for (size_t i = 0; i < shape.size(); ++i) desc[3 + i] = shape[i];
    const std::vector<int64_t> all = gather_i64(desc);
    for (int p = 1; p < size_; ++p)
      if (!std::equal(all.begin(), all.begin() + kDesc, all.begin() + int64_t(p) * kDesc)) {
        auto str = [&](int q) {
          const int64_t* d = all.data() + int64_t(q) * kDesc;
          std::ostringstream o;
          o << "rank " << q << ": " << op_name(d[0]) << " of " << dtype_name(DType(d[1])) << " [";
          for (int64_t i = 0; i < d[2] && i < kDims; ++i) o << (i ? ", " : "") << d[3 + i];
          o << "]";
          return o.str();
        };
        throw InvalidInput("NCCL group: the ranks' calls disagree (" + str(0) + "; " + str(p) + ")");
      }
    if (op == kBarrier) return {};
    return gather_i64(values);
  }

  std::vector<int64_t> gather_i64(const std::vector<int64_t>& v) {
    const Device here = Device::cuda(device_);
    const int64_t n = int64_t(v.size());
    std::vector<int64_t> out(size_t(n * size_));
    if (n == 0) return out;
    Tensor mine = Tensor::from_ints(v, {n}).to(here);
    Tensor all = Tensor::empty({int64_t(size_) * n}, DType::kI64, here);
    cudaStream_t s = cuda::current_stream();
    call(locked([&] { return nccl().all_gather(mine.raw(), all.raw(), size_t(n), ncclInt64, comm_, s); }),
         "ncclAllGather");
    wait("all_gather");
    const Tensor h = all.to(Device::cpu());
    std::memcpy(out.data(), h.raw(), out.size() * sizeof(int64_t));
    return out;
  }

  ncclComm_t comm_;
  int rank_, size_, device_;
  std::chrono::milliseconds timeout_;
  std::atomic<bool> aborted_{false};
  std::mutex mu_;
  std::string reason_;
};

}  // namespace

bool nccl_available() { return nccl().error.empty(); }

namespace {

int visible_devices() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
  return count;
}

void check_device(const char* who, int d) {
  const int count = visible_devices();
  if (d < 0 || d >= count)
    throw Unsupported(std::string(who) + ": no CUDA device " + std::to_string(d) + " (" + std::to_string(count) +
                      " visible)");
}

// Waits until every communicator's non-blocking initialisation has finished, within the timeout;
// on failure aborts them all and throws CommError.
void settle_init(const char* who, std::vector<ncclComm_t>& comms, const std::vector<int>& devices,
                 std::chrono::milliseconds timeout) {
  const NcclApi& api = nccl();
  const auto start = std::chrono::steady_clock::now();
  auto abort_all = [&] {
    for (size_t i = 0; i < comms.size(); ++i)
      if (comms[i]) {
        cuda::DeviceGuard g(devices[i]);
        api.abort(comms[i]);
        comms[i] = nullptr;
      }
  };
  for (size_t i = 0; i < comms.size(); ++i)
    for (;;) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t q = api.async_error(comms[i], &state);
      if (q != ncclSuccess) state = q;
      if (state == ncclSuccess) break;
      if (state != ncclInProgress) {
        abort_all();
        throw CommError(std::string(who) + ": NCCL's initialisation failed: " + api.error_string(state));
      }
      if (std::chrono::steady_clock::now() - start > timeout) {
        abort_all();
        throw CommError(std::string(who) + ": NCCL's initialisation did not finish within " +
                        std::to_string(timeout.count()) + " ms (a rank did not join)");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
}

ncclConfig_t non_blocking_config() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  return config;
}

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_nccl_group(const std::vector<int>& devices,
                                                           std::chrono::milliseconds timeout) {
  if (devices.empty()) throw InvalidInput("make_nccl_group: no devices");
  if (timeout.count() <= 0) throw InvalidInput("make_nccl_group: the timeout must be positive");
  const NcclApi& api = nccl();
  if (!api.error.empty()) throw Unsupported("make_nccl_group: " + api.error);
  for (int d : devices) check_device("make_nccl_group", d);
  ncclUniqueId id;
  if (const ncclResult_t r = api.get_unique_id(&id); r != ncclSuccess)
    throw CommError(std::string("make_nccl_group: ncclGetUniqueId failed: ") + api.error_string(r));
  const int n = int(devices.size());
  std::vector<ncclComm_t> comms(devices.size(), nullptr);
  // One thread initialises every rank: inside one NCCL group, as NCCL asks.
  ncclResult_t r = api.group_start();
  for (int i = 0; i < n && (r == ncclSuccess || r == ncclInProgress); ++i) {
    cuda::DeviceGuard g(devices[size_t(i)]);
    ncclConfig_t config = non_blocking_config();
    r = api.comm_init_rank_config(&comms[size_t(i)], n, id, i, &config);
  }
  const ncclResult_t e = api.group_end();
  if (r == ncclSuccess || r == ncclInProgress) r = e;
  if (r != ncclSuccess && r != ncclInProgress) {
    for (size_t i = 0; i < comms.size(); ++i)
      if (comms[i]) {
        cuda::DeviceGuard g(devices[i]);
        api.abort(comms[i]);
      }
    throw CommError(std::string("make_nccl_group: ncclCommInitRankConfig failed: ") + api.error_string(r));
  }
  settle_init("make_nccl_group", comms, devices, timeout);
  std::vector<std::unique_ptr<Communicator>> out;
  for (int i = 0; i < n; ++i)
    out.push_back(std::make_unique<NcclCommunicator>(comms[size_t(i)], i, n, devices[size_t(i)], timeout));
  return out;
}

std::unique_ptr<Communicator> make_nccl_rank(int rank, int size, int device, const std::string& rendezvous,
                                             std::chrono::milliseconds timeout) {
  const std::string who = "NCCL rank " + std::to_string(rank) + " of " + std::to_string(size);
  if (size < 1 || rank < 0 || rank >= size)
    throw InvalidInput("make_nccl_rank: rank " + std::to_string(rank) + " is not in [0, " + std::to_string(size) + ")");
  if (timeout.count() <= 0) throw InvalidInput("make_nccl_rank: the timeout must be positive");
  if (rendezvous.empty()) throw InvalidInput("make_nccl_rank: no rendezvous file");
  const NcclApi& api = nccl();
  if (!api.error.empty()) throw Unsupported("make_nccl_rank: " + api.error);
  check_device(who.c_str(), device);
  ncclUniqueId id;
  namespace fs = std::filesystem;
  if (rank == 0) {
    if (const ncclResult_t r = api.get_unique_id(&id); r != ncclSuccess)
      throw CommError(who + ": ncclGetUniqueId failed: " + api.error_string(r));
    const std::string tmp = rendezvous + ".tmp";
    {
      std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
      f.write(id.internal, sizeof(id.internal));
      if (!f) throw CommError(who + ": cannot write the rendezvous file " + tmp);
    }
    std::error_code ec;
    fs::rename(tmp, rendezvous, ec);
    if (ec) throw CommError(who + ": cannot rename " + tmp + " to " + rendezvous + ": " + ec.message());
  } else {
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
      std::ifstream f(rendezvous, std::ios::binary);
      if (f && f.read(id.internal, sizeof(id.internal))) break;
      if (std::chrono::steady_clock::now() - start > timeout)
        throw CommError(who + ": rank 0 did not write the rendezvous file " + rendezvous + " within " +
                        std::to_string(timeout.count()) + " ms");
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  std::vector<ncclComm_t> comms(1, nullptr);
  {
    cuda::DeviceGuard g(device);
    ncclConfig_t config = non_blocking_config();
    const ncclResult_t r = api.comm_init_rank_config(&comms[0], size, id, rank, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
      if (comms[0]) api.abort(comms[0]);
      throw CommError(who + ": ncclCommInitRankConfig failed: " + api.error_string(r));
    }
  }
  settle_init(who.c_str(), comms, {device}, timeout);
  return std::make_unique<NcclCommunicator>(comms[0], rank, size, device, timeout);
}

}  // namespace moex
