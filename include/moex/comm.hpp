// Collective communication between the ranks of an expert-parallel group.
//
// A Communicator is the narrow interface the expert-parallel code (moex/expert_parallel.hpp) is
// written against: a rank, a group size, the device its collectives run on and five collectives.
// Every rank of a group must make the same calls in the same order (as with NCCL or MPI); a call
// returns on a rank once every rank has made it. Two implementations: ThreadCommunicator (N ranks
// as N threads of one process: the tests and the CPU path) and the NCCL communicator (ranks on
// GPUs, make_nccl_group / make_nccl_rank below).
//
// Failure is part of the contract: a call never hangs. A rank whose peers do not arrive within
// the group's timeout gets CommError, and so does every other rank then (the group is aborted).
// A rank that fails outside a collective calls abort(); every pending and later call of every
// rank then throws CommError naming that rank and its reason. Inputs that disagree across ranks
// (dtype, shape, counts, or different collectives called at one step) throw InvalidInput on every
// rank, naming the ranks and their shapes; such a mismatch leaves the group usable.
//
// Determinism: all_reduce_sum adds the ranks' tensors in rank order 0, 1, ..., N-1 in float32
// and rounds once to the tensor's dtype, so every rank gets the same bits whatever the thread
// timing, and the result equals a sequential sum over ranks.
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "moex/error.hpp"
#include "moex/tensor.hpp"

namespace moex {

// A collective failed because of the group, not of this rank's input: a peer aborted, a peer did
// not arrive within the timeout, or the group was aborted earlier.
class CommError : public Error {
 public:
  using Error::Error;
};

struct AllToAllResult {
  Tensor rows;                  // [sum(counts), ...]: rows from rank 0 first, then rank 1, ...
  std::vector<int64_t> counts;  // [N]: rows received from each rank
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Where this rank's collectives move data: the CPU (thread group) or this rank's GPU (NCCL).
  // A model of expert parallelism lives on this device.
  virtual Device device() const = 0;

  // In place: t = sum over ranks of t, for contiguous host tensors of float32, bfloat16 or
  // float16 with the same dtype and shape on every rank. Summed in rank order in float32, rounded
  // once (see the file-top note). InvalidInput: a dtype or shape that differs across ranks, or an
  // unsupported dtype / non-contiguous tensor.
  virtual void all_reduce_sum(Tensor& t) = 0;

  // all_reduce_sum as stream work: for a contiguous tensor on device(), enqueued on the calling
  // thread's current stream and returned from at once (no host synchronisation, so it can be
  // captured into a CUDA graph and replayed). The same rank-order sum and bits. The caller
  // vouches that every rank makes this call with the same dtype and shape (nothing is checked
  // across ranks) and waits for the stream itself; a peer that never arrives then shows there,
  // not here. The default (host groups) is all_reduce_sum itself.
  virtual void all_reduce_sum_enqueue(Tensor& t) { all_reduce_sum(t); }

  // Variable all-to-all. `send` is contiguous [R, ...] with R = sum(send_counts): the first
  // send_counts[0] rows go to rank 0, the next send_counts[1] rows to rank 1, and so on. Returns
  // the rows sent to this rank, in rank order of the senders (each sender's rows in their order),
  // with the count from each. Every rank's `send` must have the same dtype and the same trailing
  // shape (R may differ); send_counts has N non-negative entries summing to R.
  virtual AllToAllResult all_to_all_v(const Tensor& send,
                                      const std::vector<int64_t>& send_counts) = 0;

  // Concatenation of every rank's `values` in rank order; every rank gives the same length
  // (small vectors: counts, sizes, checks).
  virtual std::vector<int64_t> all_gather(const std::vector<int64_t>& values) = 0;

  virtual void barrier() = 0;

  // Throws CommError when the group has been aborted (by any rank, or from another thread); a
  // host check, no collective. Lets a rank whose collectives run inside replayed graphs (no call
  // of this interface) stop replaying once its group is gone.
  virtual void throw_if_aborted() = 0;

  // Marks the group failed with `reason`: every pending and later call of every rank throws
  // CommError naming this rank and the reason. Idempotent (the first reason is kept); never throws.
  virtual void abort(const std::string& reason) noexcept = 0;
};

// ---- in-process ranks ----
// The group's shared state lives in one object created by make_thread_group; each rank's
// communicator is used by one thread at a time. Every collective copies: all_reduce_sum has each
// rank read every other rank's tensor (N-fold work, which is what makes it order-exact and
// simple); fine for tests and small groups, not a model of GPU bandwidth.
class ThreadCommunicator final : public Communicator {
 public:
  ThreadCommunicator(std::shared_ptr<struct ThreadGroup> group, int rank);
  int rank() const override { return rank_; }
  int size() const override;
  Device device() const override { return Device::cpu(); }
  void all_reduce_sum(Tensor& t) override;
  AllToAllResult all_to_all_v(const Tensor& send, const std::vector<int64_t>& send_counts) override;
  std::vector<int64_t> all_gather(const std::vector<int64_t>& values) override;
  void barrier() override;
  void throw_if_aborted() override;
  void abort(const std::string& reason) noexcept override;

 private:
  std::shared_ptr<struct ThreadGroup> group_;
  int rank_;
};

constexpr std::chrono::milliseconds kDefaultCommTimeout{60000};

// N communicators sharing one group (rank i is element i). `timeout`: how long a rank waits in a
// collective for its peers before the group is aborted. InvalidInput when N < 1 or timeout <= 0.
std::vector<std::unique_ptr<Communicator>> make_thread_group(
    int ranks, std::chrono::milliseconds timeout = kDefaultCommTimeout);

// ---- NCCL: ranks on GPUs (CUDA builds; libnccl.so.2 is opened at run time) ----
// Collectives of device tensors (each on its rank's GPU; host tensors are copied there and back),
// with this interface's contract: all_reduce_sum gathers every rank's tensor (ncclAllGather) and
// adds them in rank order in float32 on the device, so every rank gets the ThreadCommunicator's
// bits (N-fold traffic: a deterministic sum, not NCCL's ring reduction); all_to_all_v exchanges
// the counts, then grouped ncclSend / ncclRecv; every call first all-gathers a description of
// itself, so calls that disagree across ranks throw the same InvalidInput on every rank.
// Bounded: the communicators are non-blocking (ncclCommInitRankConfig with blocking = 0), so
// NCCL's connection setup, which it does lazily at a group's first calls, runs in NCCL's own
// threads while the calling rank polls it against the timeout; a call whose work does not finish
// on the stream within the timeout, or any NCCL error, aborts the communicator (ncclCommAbort)
// and throws CommError. abort() aborts this rank's communicator at once (from any thread: the
// owner's next call, or its current wait, then throws CommError); peers in other processes,
// which cannot be told, fail at their timeout or are stopped by moex launch. A GPU model whose
// decode graph replays the enqueued all-reduce meets its communicator once more at the end of
// each call (a barrier), so an abort during replays fails the call instead of returning what the
// aborted collectives left. all_reduce_sum_enqueue waits for nothing (see above).
//
// One process, N GPUs: rank i on devices[i], each communicator used by one thread at a time
// (run_ranks). Unsupported: a build without CUDA, NCCL not found (the library is looked up as
// libnccl.so.2, or at $MOEX_NCCL_LIBRARY), no devices, a device that does not exist (named, with
// the number visible). CommError: NCCL's initialisation failed or did not finish in time.
std::vector<std::unique_ptr<Communicator>> make_nccl_group(
    const std::vector<int>& devices, std::chrono::milliseconds timeout = kDefaultCommTimeout);

// One rank of a group whose ranks are separate processes (one per GPU, `moex launch`): rank
// `rank` of `size` on CUDA device `device`. The ranks meet through the file `rendezvous`: rank 0
// writes NCCL's unique id there (atomically: a temporary file renamed), the others wait for it
// within the timeout. The file must not exist before rank 0 writes it (a fresh directory per
// launch). InvalidInput: rank outside [0, size); otherwise as make_nccl_group, and CommError
// when the rendezvous file does not appear in time.
std::unique_ptr<Communicator> make_nccl_rank(int rank, int size, int device, const std::string& rendezvous,
                                             std::chrono::milliseconds timeout = kDefaultCommTimeout);
// Whether make_nccl_group can work here: a CUDA build and the NCCL library found.
bool nccl_available();

// Runs fn(comm) for every communicator on its own thread and joins them. A rank whose fn throws
// aborts the group with the exception's message (its own communicator, then every other one, so
// that an NCCL rank waiting on its device for the failed rank is released too), so the others
// fail fast instead of waiting for the timeout. Returns one exception_ptr per rank (null: that rank finished).
std::vector<std::exception_ptr> run_ranks(const std::vector<std::unique_ptr<Communicator>>& comms,
                                          const std::function<void(Communicator&)>& fn);

}  // namespace moex
