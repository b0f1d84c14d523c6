// The core's only doorway to device memory. CUDA builds implement these in src/cuda/runtime.*;
// CPU-only builds get versions that report "built without CUDA" (device_hooks_cpu.cpp), so a
// request for a GPU fails with a clear error instead of silently running elsewhere.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "moex/device.hpp"
#include "moex/tensor.hpp"

namespace moex::detail {

std::shared_ptr<Storage> device_alloc(size_t bytes, Device device);
// Copies between any two devices (host <-> CUDA, CUDA <-> CUDA) and waits for completion.
void device_copy(void* dst, Device dst_dev, const void* src, Device src_dev, size_t bytes);
int cuda_device_count();  // 0 without GPU or without CUDA support; never throws
// Bytes a new allocation on `device` can get: the driver's free memory plus the blocks the
// caching allocator holds unused (released to the driver first). 0 without CUDA.
size_t device_free_bytes(Device device);
// A CUDA graph captured from the calling thread's current stream of a device, with the private
// memory pool its captured work allocated from (kept while the graph lives). replay() launches
// it on the current stream.
class CapturedGraph {
 public:
  virtual ~CapturedGraph() = default;
  virtual void replay() = 0;
};
// Runs `fn` under stream capture (its launches are recorded, not executed) and returns the graph.
// When capture fails (fn synchronises, copies from pageable memory, ...), the capture is ended
// and the error rethrown; whatever host state fn changed is the caller's to restore.
// With `rewind`, fn first runs once for real under the graph's private memory pool, then
// `rewind` undoes its host-side effects (and drops what it returned), then fn is captured: every
// block the capture asks for is then already in the pool. Without the warm run, a temporary of
// a size the allocator's cache holds no fitting block for is a cudaMalloc inside the capture,
// which CUDA refuses (seen with FP8 checkpoints, whose quantized linears allocate activation
// codes and scales per call). Unsupported without CUDA.
std::unique_ptr<CapturedGraph> capture_graph(Device device, const std::function<void()>& fn,
                                             const std::function<void()>& rewind = {});
// Copies of a small device tensor into page-locked host slots, each finished by its own event,
// on the calling thread's current stream of the device: a host loop enqueues the copy of step
// n + 1 before it waits for step n's (generate's decode pipeline), so the device never waits for
// the host between steps. Unsupported without CUDA.
class AsyncDownload {
 public:
  virtual ~AsyncDownload() = default;
  // Enqueues the copy of `src` (contiguous, at most the bytes given at creation) into `slot`.
  virtual void enqueue(const Tensor& src, int slot) = 0;
  // Blocks until the slot's last enqueued copy is done; its bytes stay valid until the slot is
  // enqueued again.
  virtual const void* wait(int slot) = 0;
  // Blocks until everything enqueued so far on the stream the copies went to has run.
  virtual void drain() = 0;
};
std::unique_ptr<AsyncDownload> make_async_download(Device device, size_t bytes, int slots);
// The calling thread's current stream of a CUDA device, as cudaStream_t (moex::cuda::current_stream).
void* current_stream(Device device);
// Whether the calling thread's current stream of `device` is being captured into a graph (work
// whose sizes come from host values of the step must refuse to be recorded). False on the CPU.
bool capturing(Device device);
// Work beside the calling thread's current stream of a CUDA device, on a second stream of that
// device (one per thread and device). Opening a branch makes the side stream wait for everything
// enqueued so far on the current stream; while side() is in scope, the ops the thread calls
// enqueue on the side stream; join() (or the destructor) makes the current stream wait for the
// side's work. Inside a graph capture the side work joins the capture as a parallel branch.
// Memory: every free the thread makes while the branch is open is held until the join (see
// DeferFreesScope in src/cuda/runtime.hpp), so neither stream is handed a block the other may
// still read. Not nestable on one device.
class StreamBranch {
 public:
  virtual ~StreamBranch() = default;
  class Side {
   public:
    explicit Side(StreamBranch& b) : b_(b) { b_.enter_side(); }
    ~Side() { b_.leave_side(); }
    Side(const Side&) = delete;
    Side& operator=(const Side&) = delete;

   private:
    StreamBranch& b_;
  };
  virtual void join() = 0;

 protected:
  virtual void enter_side() = 0;
  virtual void leave_side() = 0;
};
// Unsupported for a device without streams (the CPU, or any device without CUDA).
std::unique_ptr<StreamBranch> open_stream_branch(Device device);
// Branches opened in this process so far, on every device (tests check that a mode meant to
// fork did; 0 in a CPU-only build).
int64_t stream_branches_opened();
// mark_sentinels (moex/expert_shard.hpp) of device ids: out[i] = in[i] - first when
// first <= in[i] < first + count, else count; in and out contiguous int32 / int64 of one dtype
// and shape on one CUDA device; stream work on the current stream (capturable). Negative ids are
// not diagnosed (they become sentinels): the caller's router makes none. Unsupported without CUDA.
void mark_sentinels_on_device(const Tensor& in, Tensor& out, int64_t first, int64_t count);
// The all-to-all mode's data movement on a GPU (moex/expert_parallel.hpp), stream work on the
// current stream of the tensors' device:
// out[p] = src[idx[p]] for rows of src [rows, ...] (contiguous, any dtype), idx int64 [P] on the
// device (each in [0, rows)), out [P, ...] of src's dtype and row shape.
void gather_rows_on_device(const Tensor& src, const Tensor& idx, Tensor& out);
// out[t] = round(sum over j = 0..k-1 of rows[pos[t * k + j]]), skipping pos < 0, added in j order
// in float32 and rounded once to out's dtype (zeros when every pos of t is < 0); rows [R, H] and
// out [T, H] of one dtype (float32 / bfloat16 / float16), pos int64 [T * k] on the device.
void sum_rows_on_device(const Tensor& rows, const Tensor& pos, int64_t k, Tensor& out);
// What a measurement made on `device` holds for: "cpu", or the GPU's name and compute capability
// ("NVIDIA H200 sm_90"). Unsupported for a CUDA device without CUDA.
std::string device_name(Device device);

}  // namespace moex::detail
