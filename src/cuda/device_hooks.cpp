// Device hooks of a CUDA build (declared in core/device_hooks.hpp): forward to the CUDA runtime
// layer (src/cuda/runtime.hpp). Only CUDA builds compile this folder.
#include "core/device_hooks.hpp"
#include "cuda/runtime.hpp"
#include "moex/error.hpp"

#include <atomic>
#include <map>
#include <utility>
#include <vector>

namespace moex::detail {

std::shared_ptr<Storage> device_alloc(size_t bytes, Device device) {
  return moex::cuda::alloc_storage(bytes, device.index);
}
void device_copy(void* dst, Device dst_dev, const void* src, Device src_dev, size_t bytes) {
  moex::cuda::copy_bytes(dst, dst_dev, src, src_dev, bytes);
}
int cuda_device_count() { return moex::cuda::device_count(); }
size_t device_free_bytes(Device device) {
  moex::cuda::DeviceGuard guard(device.index);
  moex::cuda::empty_cache();
  size_t free = 0, total = 0;
  MOEX_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  return free;
}
namespace {

class CudaGraph final : public CapturedGraph {
 public:
  explicit CudaGraph(int device) : device_(device), pool_(std::make_unique<moex::cuda::PrivatePool>(device)) {}
  ~CudaGraph() override {
    if (exec_) cudaGraphExecDestroy(exec_);
    if (graph_) cudaGraphDestroy(graph_);
  }
  void replay() override {
    moex::cuda::DeviceGuard guard(device_);
    MOEX_CUDA_CHECK(cudaGraphLaunch(exec_, moex::cuda::current_stream()));
  }
  int device_;
  std::unique_ptr<moex::cuda::PrivatePool> pool_;  // destroyed after the graph (member order)
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

}  // namespace

std::unique_ptr<CapturedGraph> capture_graph(Device device, const std::function<void()>& fn,
                                             const std::function<void()>& rewind) {
  moex::cuda::DeviceGuard guard(device.index);
  auto g = std::make_unique<CudaGraph>(device.index);
  cudaStream_t s = moex::cuda::current_stream();
  if (rewind) {  // the warm run: fills the private pool with the blocks the capture will ask for
    {
      moex::cuda::PrivatePoolScope scope(g->pool_.get());
      fn();
      rewind();
    }
    MOEX_CUDA_CHECK(cudaStreamSynchronize(s));
  }
  MOEX_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  try {
    moex::cuda::PrivatePoolScope scope(g->pool_.get());
    fn();
  } catch (...) {
    cudaGraph_t broken = nullptr;
    cudaStreamEndCapture(s, &broken);
    if (broken) cudaGraphDestroy(broken);
    cudaGetLastError();  // the capture's error is reported by the exception
    throw;
  }
  const cudaError_t err = cudaStreamEndCapture(s, &g->graph_);
  if (err != cudaSuccess) {
    cudaGetLastError();
    throw DeviceError(std::string("graph capture failed on ") + device.str() + ": " + cudaGetErrorString(err));
  }
  // Per-node priorities: the nodes keep the priority of the stream they were captured from (a
  // shared expert's side branch runs below the routed experts' chain, as it does uncaptured).
  MOEX_CUDA_CHECK(cudaGraphInstantiate(&g->exec_, g->graph_, cudaGraphInstantiateFlagUseNodePriority));
  return g;
}

namespace {

class CudaAsyncDownload final : public AsyncDownload {
 public:
  CudaAsyncDownload(int device, size_t bytes, int slots) : device_(device), bytes_(bytes) {
    if (slots < 1 || bytes == 0) throw InvalidInput("make_async_download: needs >= 1 slot of >= 1 byte");
    moex::cuda::DeviceGuard guard(device_);
    slots_.resize(size_t(slots));
    for (auto& sl : slots_) {
      MOEX_CUDA_CHECK(cudaHostAlloc(&sl.host, bytes_, cudaHostAllocDefault));
      MOEX_CUDA_CHECK(cudaEventCreateWithFlags(&sl.done, cudaEventDisableTiming));
    }
  }
  ~CudaAsyncDownload() override {
    moex::cuda::DeviceGuard guard(device_);
    if (stream_) cudaStreamSynchronize(stream_);  // no copy may still target a freed slot
    for (auto& sl : slots_) {
      if (sl.done) cudaEventDestroy(sl.done);
      if (sl.host) cudaFreeHost(sl.host);
    }
  }
  void enqueue(const Tensor& src, int slot) override {
    if (src.nbytes() > bytes_ || !src.is_contiguous() || src.device() != Device::cuda(device_))
      throw InvalidInput("AsyncDownload::enqueue: " + std::to_string(src.nbytes()) + " bytes from " +
                         src.device().str() + " into slots of " + std::to_string(bytes_) + " bytes on cuda:" +
                         std::to_string(device_));
    auto& sl = at(slot);
    moex::cuda::DeviceGuard guard(device_);
    stream_ = moex::cuda::current_stream();
    MOEX_CUDA_CHECK(cudaMemcpyAsync(sl.host, src.raw(), src.nbytes(), cudaMemcpyDeviceToHost, stream_));
    MOEX_CUDA_CHECK(cudaEventRecord(sl.done, stream_));
  }
  const void* wait(int slot) override {
    auto& sl = at(slot);
    moex::cuda::DeviceGuard guard(device_);
    MOEX_CUDA_CHECK(cudaEventSynchronize(sl.done));
    return sl.host;
  }
  void drain() override {
    if (!stream_) return;
    moex::cuda::DeviceGuard guard(device_);
    MOEX_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

 private:
  struct Slot {
    void* host = nullptr;
    cudaEvent_t done = nullptr;
  };
  Slot& at(int slot) {
    if (slot < 0 || size_t(slot) >= slots_.size())
      throw InvalidInput("AsyncDownload: slot " + std::to_string(slot) + " of " + std::to_string(slots_.size()));
    return slots_[size_t(slot)];
  }
  int device_;
  size_t bytes_;
  std::vector<Slot> slots_;
  cudaStream_t stream_ = nullptr;
};

}  // namespace

std::unique_ptr<AsyncDownload> make_async_download(Device device, size_t bytes, int slots) {
  if (!device.is_cuda()) throw Unsupported("an asynchronous download needs a CUDA device, got " + device.str());
  return std::make_unique<CudaAsyncDownload>(device.index, bytes, slots);
}

void* current_stream(Device device) {
  moex::cuda::DeviceGuard guard(device.index);
  return moex::cuda::current_stream();
}

namespace {

class CudaStreamBranch final : public StreamBranch {
 public:
  explicit CudaStreamBranch(int device) : device_(device) {
    moex::cuda::DeviceGuard guard(device_);
    main_ = moex::cuda::current_stream();
    side_ = moex::cuda::side_stream();
    // Two events per thread and device, made once (a record / wait pair per use; a recorded
    // event may be recorded again once the waits on it are enqueued).
    thread_local std::map<int, std::pair<cudaEvent_t, cudaEvent_t>> events;
    auto& ev = events[device_];
    if (!ev.first) {
      MOEX_CUDA_CHECK(cudaEventCreateWithFlags(&ev.first, cudaEventDisableTiming));
      MOEX_CUDA_CHECK(cudaEventCreateWithFlags(&ev.second, cudaEventDisableTiming));
    }
    fork_ = ev.first;
    done_ = ev.second;
    MOEX_CUDA_CHECK(cudaEventRecord(fork_, main_));
    MOEX_CUDA_CHECK(cudaStreamWaitEvent(side_, fork_, 0));
    defer_ = std::make_unique<moex::cuda::DeferFreesScope>(device_);
  }
  ~CudaStreamBranch() override {
    // An exception between open and join: still join (a capture must end with every branch
    // joined), reporting nothing more.
    if (!joined_) try { join(); } catch (...) {}
  }
  void join() override {
    if (joined_) return;
    joined_ = true;
    moex::cuda::DeviceGuard guard(device_);
    MOEX_CUDA_CHECK(cudaEventRecord(done_, side_));
    MOEX_CUDA_CHECK(cudaStreamWaitEvent(main_, done_, 0));
    defer_.reset();  // the held frees: both streams' work so far now precedes anything new on main
  }

 protected:
  void enter_side() override {
    moex::cuda::DeviceGuard guard(device_);
    moex::cuda::set_current_stream(side_);
    moex::cuda::set_on_side(true);
  }
  void leave_side() override {
    moex::cuda::DeviceGuard guard(device_);
    moex::cuda::set_current_stream(main_);
    moex::cuda::set_on_side(false);
  }

 private:
  int device_;
  cudaStream_t main_ = nullptr, side_ = nullptr;
  cudaEvent_t fork_ = nullptr, done_ = nullptr;
  std::unique_ptr<moex::cuda::DeferFreesScope> defer_;
  bool joined_ = false;
};

}  // namespace

namespace {
std::atomic<int64_t> g_branches_opened{0};
}  // namespace

std::unique_ptr<StreamBranch> open_stream_branch(Device device) {
  if (!device.is_cuda()) throw Unsupported("a stream branch needs a CUDA device, got " + device.str());
  auto b = std::make_unique<CudaStreamBranch>(device.index);
  g_branches_opened.fetch_add(1, std::memory_order_relaxed);
  return b;
}

int64_t stream_branches_opened() { return g_branches_opened.load(std::memory_order_relaxed); }

bool capturing(Device device) {
  if (!device.is_cuda()) return false;
  moex::cuda::DeviceGuard guard(device.index);
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  MOEX_CUDA_CHECK(cudaStreamIsCapturing(moex::cuda::current_stream(), &st));
  return st != cudaStreamCaptureStatusNone;
}

std::string device_name(Device device) {
  if (!device.is_cuda()) return "cpu";
  const auto& i = moex::cuda::device_info(device.index);
  return i.name + " sm_" + std::to_string(i.major) + std::to_string(i.minor);
}

}  // namespace moex::detail
