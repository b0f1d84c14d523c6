// cuDNN fused attention for prompt steps (see attention_cudnn.hpp for why and when).
#include "ops/cuda/attention_cudnn.hpp"

#include <cstdlib>
#include <cstring>
#include <string>

#include "core/env_switch_read.hpp"
#include "moex/error.hpp"
#include "ops/cuda/cuda_ops.hpp"

#if MOEX_WITH_CUDNN_FRONTEND

#include <dlfcn.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <thread>
#include <memory>
#include <mutex>
#include <tuple>
#include <unordered_map>

#define NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING 1
#include <cudnn_frontend.h>

#include "cuda/runtime.hpp"

// The frontend's dynamic loading resolves every cuDNN call through this handle.
namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;
}

namespace moex::ops::cuda {

namespace {

namespace fe = cudnn_frontend;

struct Library {
  bool loaded = false;
  std::string status;
};

const Library& library() {
  static const Library lib = [] {
    Library l;
    if (env_switch_int("MOEX_CUDNN", 1) == 0) {
      l.status = "cuDNN attention off (MOEX_CUDNN=0)";
      return l;
    }
    const std::string name = env_switch_text("MOEX_CUDNN_LIBRARY").value_or("libcudnn.so.9");
    void* h = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      const char* err = dlerror();
      l.status = "cuDNN attention not used: cannot load " + name + " (" + (err ? err : "not found") +
                 "; install cuDNN 9, e.g. pip install nvidia-cudnn-cu13, or set MOEX_CUDNN_LIBRARY)";
      return l;
    }
    fe::cudnn_dlhandle = h;
    try {
      const int64_t v = fe::detail::get_backend_version();
      // SDPA with bottom-right causal alignment and GQA needs cuDNN 9.
      if (v < 90000) {
        l.status = "cuDNN attention not used: " + name + " is version " + std::to_string(v) + ", 9.0 or newer needed";
        return l;
      }
      l.loaded = true;
      l.status = "cuDNN " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
                 std::to_string(v % 100) + " (" + name + ")";
    } catch (const std::exception& e) {
      l.status = std::string("cuDNN attention not used: ") + e.what();
    }
    return l;
  }();
  return lib;
}

// One handle per device (cuDNN handles are bound to the device current at creation).
cudnnHandle_t handle_for(int device) {
  static std::mutex mu;
  static std::map<int, cudnnHandle_t> handles;
  std::lock_guard<std::mutex> lock(mu);
  auto it = handles.find(device);
  if (it != handles.end()) return it->second;
  cudnnHandle_t h = nullptr;
  const cudnnStatus_t st = fe::detail::create_handle(&h);
  if (st != CUDNN_STATUS_SUCCESS)
    throw DeviceError(std::string("cudnnCreate failed on cuda:") + std::to_string(device) + ": " +
                      fe::detail::get_error_string(st));
  handles.emplace(device, h);
  return h;
}

// A graph per shape: device, dtype, batch, heads, kv heads, head dims of k and v, new tokens, cached columns,
// cache capacity (the stride between sequences; 0 for one sequence, where none is read), scale.
using Key = std::tuple<int, int, int, int, int, int, int, int64_t, int64_t, int64_t, float>;
enum : int64_t { kQ = 1, kK = 2, kV = 3, kO = 4 };

// What building a graph needs, copied off the call (the builder may run after it returned).
struct Shape {
  int elem = kAttnBF16;
  int64_t B = 1, H = 1, G = 1, T = 1, past = 0, D = 0, Dv = 0, C = 0;
  float scale = 1.f;
};

struct Entry {
  std::atomic<int> state{0};  // 0 being built, 1 ready, 2 cuDNN has no engine for the shape
  std::shared_ptr<fe::graph::Graph> graph;
  int64_t workspace = 0;
  std::string why;
};

void build(const Shape& x, cudnnHandle_t h, Entry& out) {
  const int64_t B = x.B, H = x.H, G = x.G, T = x.T, D = x.D, Dv = x.Dv, S = x.past + x.T, C = x.C > 0 ? x.C : S;
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(x.elem == kAttnBF16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  // Logical [batch, heads, sequence, dim]: queries and output are [rows, heads * d] row-major, the
  // cache [batch, capacity, kv_heads * d].
  auto q = g->tensor(fe::graph::Tensor_attributes().set_name("q").set_uid(kQ).set_dim({B, H, T, D}).set_stride(
      {T * H * D, D, H * D, 1}));
  auto k = g->tensor(fe::graph::Tensor_attributes().set_name("k").set_uid(kK).set_dim({B, G, S, D}).set_stride(
      {C * G * D, D, G * D, 1}));
  auto v = g->tensor(fe::graph::Tensor_attributes().set_name("v").set_uid(kV).set_dim({B, G, S, Dv}).set_stride(
      {C * G * Dv, Dv, G * Dv, 1}));
  auto opts =
      fe::graph::SDPA_attributes().set_name("prompt_attention").set_generate_stats(false).set_attn_scale(x.scale);
  // Query t of the step sits at column past + t: it sees columns [0, past + t].
  if (x.past == 0) opts.set_causal_mask(true);
  else opts.set_causal_mask_bottom_right(true);
  auto [o, stats] = g->sdpa(q, k, v, opts);
  (void)stats;
  o->set_output(true).set_uid(kO).set_dim({B, H, T, Dv}).set_stride({T * H * Dv, Dv, H * Dv, 1});
  auto check = [&](fe::error_t e, const char* stage) {
    if (e.is_good()) return true;
    out.why = std::string(stage) + ": " + e.get_message();
    return false;
  };
  int64_t ws = 0;
  const bool ok = check(g->validate(), "validate") && check(g->build_operation_graph(h), "build_operation_graph") &&
                  check(g->create_execution_plans({fe::HeurMode_t::A}), "create_execution_plans") &&
                  check(g->check_support(h), "check_support") && check(g->build_plans(h), "build_plans") &&
                  check(g->get_workspace_size(ws), "get_workspace_size");
  if (ok) {
    out.graph = std::move(g);
    out.workspace = ws;
  }
  out.state.store(ok ? 1 : 2, std::memory_order_release);
}

// Whether builder() has been constructed and not yet destroyed (a model destroyed after it, at
// exit, has nothing to wait for).
std::atomic<bool> builder_started{false};

// Builds graphs off the calling thread. Planning a new shape costs cuDNN ~50 ms (H200, cuDNN 9.14,
// first_call_ms in lab/cuda/attention_lab.cpp), more than a 4096-token prompt's attention saves in
// all 24 layers of the Qwen shape (~6 ms), so a shape's first calls run the project's flash kernel
// while its graph is built, and later calls run cuDNN. The worker has its own cuDNN handle per
// device (handles are not shared between threads) and is joined at exit; it is created after the
// CUDA runtime, so it is destroyed before the runtime is torn down.
//
// Exit: a build still running when the process exits used to end in SIGSEGV (`moex generate` on
// a GPU, one short prompt: exit came within the ~50 ms of planning; `bench generate`, which
// plans synchronously, never did). The likely cause: cuDNN creates objects of its own during a
// build (engine libraries it opens on demand), after this builder, so exit destroys them first,
// under the running build. So a model's destruction waits for the builds in flight
// (wait_idle, through ops::finish_background_work), and at exit the worker leaves its handles to
// the process instead of calling into cuDNN again.
class Builder {
 public:
  Builder() { builder_started.store(true, std::memory_order_release); }
  ~Builder() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    builder_started.store(false, std::memory_order_release);
  }
  void enqueue(int device, const Shape& x, std::shared_ptr<Entry> e) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
      queue_.push_back({device, x, std::move(e)});
    }
    cv_.notify_one();
  }
  // Returns once no build is queued or running.
  void wait_idle() {
    std::unique_lock<std::mutex> lock(mu_);
    idle_.wait(lock, [this] { return queue_.empty() && !busy_; });
  }

 private:
  struct Job {
    int device = 0;
    Shape x;
    std::shared_ptr<Entry> e;
  };
  void loop() {
    std::map<int, cudnnHandle_t> handles;
    for (;;) {
      Job job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
        if (stop_) break;
        job = std::move(queue_.front());
        queue_.pop_front();
        busy_ = true;
      }
      try {
        if (cudaSetDevice(job.device) != cudaSuccess)
          throw DeviceError("cudaSetDevice(" + std::to_string(job.device) + ") failed");
        cudnnHandle_t& h = handles[job.device];
        if (!h && fe::detail::create_handle(&h) != CUDNN_STATUS_SUCCESS) {
          h = nullptr;
          throw DeviceError("cudnnCreate failed on cuda:" + std::to_string(job.device));
        }
        build(job.x, h, *job.e);
      } catch (const std::exception& ex) {
        job.e->why = ex.what();
        job.e->state.store(2, std::memory_order_release);
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        busy_ = false;
      }
      idle_.notify_all();
    }
    // Stopped only at exit (the builder is a static): the handles go with the process.
  }
  std::mutex mu_;
  std::condition_variable cv_, idle_;
  std::deque<Job> queue_;
  bool stop_ = false, busy_ = false;
  std::thread thread_;
};

Builder& builder() {
  static Builder b;
  return b;
}

std::atomic<int64_t> calls{0};
std::atomic<bool> synchronous{false};

}  // namespace

bool cudnn_attention_available() { return library().loaded; }
int64_t cudnn_attention_calls() { return calls.load(); }
std::string cudnn_attention_status() { return library().status; }
void cudnn_attention_synchronous_builds(bool on) { synchronous.store(on); }
void finish_background_work() {
  if (builder_started.load(std::memory_order_acquire)) builder().wait_idle();
}

CudnnLaunch launch_attention_cudnn(const AttentionArgs& a, int64_t past, int device, void* out, cudaStream_t stream,
                                   std::string* why) {
  if (!library().loaded) {
    if (why) *why = library().status;
    return CudnnLaunch::kUnsupported;
  }
  if (a.elem != a.act || a.elem == kAttnF32 || a.eager || a.v_from_k || a.sinks || a.window) {
    if (why) *why = "cuDNN attention takes bf16 / f16 sdpa without sinks or windows, separate keys and values";
    return CudnnLaunch::kUnsupported;
  }
  Shape x;
  x.elem = a.elem;
  x.B = a.batch, x.H = a.heads, x.G = a.kv_heads, x.T = a.tokens, x.past = past, x.D = a.dk, x.Dv = a.dv;
  x.C = a.batch > 1 ? a.capacity : 0;
  x.scale = a.scale;
  const Key key{device, x.elem, int(x.B), int(x.H), int(x.G), int(x.D), int(x.Dv), x.T, x.past, x.C, x.scale};
  // At most kMaxGraphs shapes are kept (a server sees many prompt lengths); the oldest goes first
  // (a call still executing it holds its own reference).
  constexpr size_t kMaxGraphs = 256;
  static std::mutex mu;
  static std::map<Key, std::shared_ptr<Entry>> graphs;
  static std::deque<Key> order;
  std::shared_ptr<Entry> e;
  bool fresh = false;
  {
    std::lock_guard<std::mutex> lock(mu);
    std::shared_ptr<Entry>& slot = graphs[key];
    if (!slot) {
      slot = std::make_shared<Entry>();
      fresh = true;
      order.push_back(key);
    }
    e = slot;
    while (order.size() > kMaxGraphs) {
      graphs.erase(order.front());
      order.pop_front();
    }
  }
  if (fresh) {
    if (synchronous.load()) build(x, handle_for(device), *e);
    else builder().enqueue(device, x, e);
  }
  const int state = e->state.load(std::memory_order_acquire);
  if (state == 0) {
    if (why) *why = "its graph for this shape is being built";
    return CudnnLaunch::kBuilding;
  }
  if (state == 2) {
    if (why) *why = e->why;
    return CudnnLaunch::kUnsupported;
  }
  cudnnHandle_t h = handle_for(device);
  if (const cudnnStatus_t st = fe::detail::set_stream(h, stream); st != CUDNN_STATUS_SUCCESS)
    throw DeviceError(std::string("cudnnSetStream failed: ") + fe::detail::get_error_string(st));
  void* ws = e->workspace > 0 ? moex::cuda::cache_alloc(size_t(e->workspace), device) : nullptr;
  std::unordered_map<int64_t, void*> ptrs{{kQ, const_cast<void*>(a.q)},
                                          {kK, const_cast<void*>(a.k)},
                                          {kV, const_cast<void*>(a.v)},
                                          {kO, out}};
  fe::error_t err = e->graph->execute(h, ptrs, ws);
  // Stream-ordered reuse: the block goes back to the cache of the one current stream.
  if (ws) moex::cuda::cache_free(ws, device);
  if (err.is_bad()) throw DeviceError("cuDNN attention failed to execute: " + err.get_message());
  calls.fetch_add(1);
  return CudnnLaunch::kRan;
}

}  // namespace moex::ops::cuda

#else  // built without the cuDNN frontend headers

namespace moex::ops::cuda {

bool cudnn_attention_available() { return false; }
int64_t cudnn_attention_calls() { return 0; }
void cudnn_attention_synchronous_builds(bool) {}
void finish_background_work() {}
std::string cudnn_attention_status() {
  return "cuDNN attention not built (the cuDNN frontend headers were not found at configure time: pip install "
         "nvidia-cudnn-frontend, or -DMOEX_CUDNN_FRONTEND_DIR=...)";
}
CudnnLaunch launch_attention_cudnn(const AttentionArgs&, int64_t, int, void*, cudaStream_t, std::string* why) {
  if (why) *why = cudnn_attention_status();
  return CudnnLaunch::kUnsupported;
}

}  // namespace moex::ops::cuda

#endif
