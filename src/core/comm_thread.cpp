// ThreadCommunicator: the ranks of a group are threads of one process sharing a ThreadGroup.
//
// Every collective is two rendezvous. At the first, each rank posts a description of its call
// (which collective, dtype, shape, counts, a pointer to its data) into the group; the last rank to
// arrive checks that the posts agree and leaves one verdict that every rank reads, so all ranks
// throw the same InvalidInput or none does. Then each rank reads its peers' data directly and
// builds its own result; the second rendezvous keeps every rank's input alive (and unmodified)
// until all have read it, which is also why all_reduce_sum writes into its tensor only after it.
// Waiting is bounded: a wait that reaches the group's timeout aborts the group, which wakes every
// other waiter with CommError.
#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <sstream>
#include <thread>

#include "moex/comm.hpp"

namespace moex {

namespace {

enum class Op : unsigned char { kAllReduceSum, kAllToAllV, kAllGather, kBarrier };

const char* op_name(Op op) {
  switch (op) {
    case Op::kAllReduceSum: return "all_reduce_sum";
    case Op::kAllToAllV: return "all_to_all_v";
    case Op::kAllGather: return "all_gather";
    case Op::kBarrier: return "barrier";
  }
  return "?";
}

// What one rank posts for one collective. Owned by the group (copied in under the lock), except
// `data`, which points into the rank's own tensor and is read only between the two rendezvous.
struct Post {
  Op op = Op::kBarrier;
  DType dtype = DType::kF32;
  Shape shape;
  std::vector<int64_t> values;  // all_to_all_v: send counts; all_gather: the values
  const void* data = nullptr;
};

std::string post_str(const Post& p) {
  std::ostringstream o;
  o << op_name(p.op);
  if (p.op == Op::kAllReduceSum || p.op == Op::kAllToAllV)
    o << " of " << dtype_name(p.dtype) << shape_str(p.shape);
  if (p.op == Op::kAllGather) o << " of " << p.values.size() << " values";
  return o.str();
}

}  // namespace

struct ThreadGroup {
  int n = 1;
  std::chrono::milliseconds timeout{kDefaultCommTimeout};
  std::mutex mu;
  std::condition_variable cv;
  bool aborted = false;
  std::string abort_message;
  // The rendezvous: `generation` counts completed rendezvous; `arrived` lists who is in the
  // current one.
  uint64_t generation = 0;
  std::vector<bool> arrived;
  int arrived_count = 0;
  std::vector<Post> posts;
  std::string verdict;  // of the last first-phase rendezvous: empty when the posts agree

  void abort_locked(const std::string& message) {
    if (aborted) return;
    aborted = true;
    abort_message = message;
    cv.notify_all();
  }

  [[noreturn]] void throw_aborted_locked(int rank, Op op) const {
    throw CommError("collective " + std::string(op_name(op)) + " on rank " + std::to_string(rank) +
                    " of " + std::to_string(n) + " failed: " + abort_message);
  }

  // Blocks until every rank has arrived at this rendezvous (or throws CommError). `post` (first
  // phase only) is stored for the last arriver to check; returns the verdict of that check.
  std::string rendezvous(int rank, Op op, const Post* post) {
    std::unique_lock<std::mutex> lock(mu);
    if (aborted) throw_aborted_locked(rank, op);
    if (post) posts[size_t(rank)] = *post;
    const uint64_t my_generation = generation;
    arrived[size_t(rank)] = true;
    if (++arrived_count == n) {
      verdict = post ? check_posts_locked() : std::string();
      std::fill(arrived.begin(), arrived.end(), false);
      arrived_count = 0;
      ++generation;
      cv.notify_all();
      return verdict;
    }
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (generation == my_generation && !aborted) {
      if (cv.wait_until(lock, deadline) == std::cv_status::timeout && generation == my_generation &&
          !aborted) {
        std::string missing;
        for (int r = 0; r < n; ++r)
          if (!arrived[size_t(r)]) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
        abort_locked("rank " + std::to_string(rank) + " timed out after " +
                     std::to_string(timeout.count()) + " ms in " + op_name(op) +
                     " waiting for rank(s) " + missing);
      }
    }
    if (generation == my_generation) throw_aborted_locked(rank, op);
    // Completed: the verdict stays until this rank posts again (the next check needs it).
    return post ? verdict : std::string();
  }

  // Every rank posted; say what disagrees, naming the ranks and what each gave.
  std::string check_posts_locked() const {
    const Post& p0 = posts[0];
    for (int r = 1; r < n; ++r) {
      const Post& p = posts[size_t(r)];
      const std::string both = ": rank 0 called " + post_str(p0) + ", rank " + std::to_string(r) +
                               " called " + post_str(p);
      if (p.op != p0.op) return "ranks called different collectives" + both;
      if (p.dtype != p0.dtype) return std::string(op_name(p.op)) + ": dtypes differ" + both;
      if (p.op == Op::kAllReduceSum && p.shape != p0.shape)
        return "all_reduce_sum: shapes differ" + both;
      if (p.op == Op::kAllToAllV &&
          Shape(p.shape.begin() + 1, p.shape.end()) != Shape(p0.shape.begin() + 1, p0.shape.end()))
        return "all_to_all_v: row shapes differ" + both;
      if (p.op == Op::kAllGather && p.values.size() != p0.values.size())
        return "all_gather: lengths differ" + both;
    }
    return {};
  }
};

ThreadCommunicator::ThreadCommunicator(std::shared_ptr<ThreadGroup> group, int rank)
    : group_(std::move(group)), rank_(rank) {}

int ThreadCommunicator::size() const { return group_->n; }

void ThreadCommunicator::throw_if_aborted() {
  std::lock_guard<std::mutex> lock(group_->mu);
  if (group_->aborted)
    throw CommError("rank " + std::to_string(rank_) + " of " + std::to_string(group_->n) + ": the group failed: " +
                    group_->abort_message);
}

void ThreadCommunicator::abort(const std::string& reason) noexcept {
  try {
    std::lock_guard<std::mutex> lock(group_->mu);
    group_->abort_locked("rank " + std::to_string(rank_) + " aborted: " + reason);
  } catch (...) {  // string allocation: nothing sensible is left to do
  }
}

static void check_host_contiguous(const Tensor& t, const char* op) {
  if (!t.defined()) throw InvalidInput(std::string(op) + ": the tensor is undefined");
  if (!t.device().host_accessible())
    throw Unsupported(std::string(op) + " of ThreadCommunicator takes host tensors, not " +
                      t.str());
  if (!t.is_contiguous()) throw InvalidInput(std::string(op) + ": " + t.str() + " is not contiguous");
}

void ThreadCommunicator::all_reduce_sum(Tensor& t) {
  check_host_contiguous(t, "all_reduce_sum");
  if (t.dtype() != DType::kF32 && t.dtype() != DType::kBF16 && t.dtype() != DType::kF16)
    throw InvalidInput("all_reduce_sum sums float32, bfloat16 or float16, not " + t.str());
  ThreadGroup& g = *group_;
  Post post{Op::kAllReduceSum, t.dtype(), t.shape(), {}, t.raw()};
  if (auto v = g.rendezvous(rank_, post.op, &post); !v.empty()) throw InvalidInput(v);
  // Rank order, float32, one rounding: every rank computes the same bits.
  const int64_t n = t.numel();
  std::vector<float> acc(static_cast<size_t>(n));
  std::vector<float> part(t.dtype() == DType::kF32 ? 0 : static_cast<size_t>(n));
  for (int r = 0; r < g.n; ++r) {
    const void* src = g.posts[size_t(r)].data;  // stable until every rank passes the next rendezvous
    if (r == 0) {
      convert_floats(src, t.dtype(), acc.data(), DType::kF32, n);
      continue;
    }
    const float* x = static_cast<const float*>(src);
    if (t.dtype() != DType::kF32) {
      convert_floats(src, t.dtype(), part.data(), DType::kF32, n);
      x = part.data();
    }
    for (int64_t i = 0; i < n; ++i) acc[size_t(i)] += x[i];
  }
  g.rendezvous(rank_, post.op, nullptr);
  convert_floats(acc.data(), DType::kF32, t.raw(), t.dtype(), n);
}

AllToAllResult ThreadCommunicator::all_to_all_v(const Tensor& send,
                                                const std::vector<int64_t>& send_counts) {
  check_host_contiguous(send, "all_to_all_v");
  ThreadGroup& g = *group_;
  if (send.dim() < 1) throw InvalidInput("all_to_all_v sends rows of a tensor, not " + send.str());
  if (int64_t(send_counts.size()) != g.n)
    throw InvalidInput("all_to_all_v on rank " + std::to_string(rank_) + ": " +
                       std::to_string(send_counts.size()) + " send counts for " +
                       std::to_string(g.n) + " ranks");
  int64_t total = 0;
  for (int64_t c : send_counts) {
    if (c < 0) throw InvalidInput("all_to_all_v: negative send count " + std::to_string(c));
    total += c;
  }
  if (total != send.size(0))
    throw InvalidInput("all_to_all_v on rank " + std::to_string(rank_) + ": send counts sum to " +
                       std::to_string(total) + " but " + send.str() + " has " +
                       std::to_string(send.size(0)) + " rows");
  Post post{Op::kAllToAllV, send.dtype(), send.shape(), send_counts, send.raw()};
  if (auto v = g.rendezvous(rank_, post.op, &post); !v.empty()) throw InvalidInput(v);

  AllToAllResult res;
  res.counts.resize(size_t(g.n));
  int64_t rows = 0;
  for (int s = 0; s < g.n; ++s) rows += res.counts[size_t(s)] = g.posts[size_t(s)].values[size_t(rank_)];
  Shape shape = send.shape();
  shape[0] = rows;
  res.rows = Tensor::empty(shape, send.dtype());
  const size_t row_bytes =
      dtype_size(send.dtype()) * size_t(shape_numel(Shape(shape.begin() + 1, shape.end())));
  char* dst = static_cast<char*>(res.rows.raw());
  for (int s = 0; s < g.n; ++s) {
    const Post& p = g.posts[size_t(s)];
    int64_t offset = 0;  // rows that sender s sends to ranks before this one
    for (int d = 0; d < rank_; ++d) offset += p.values[size_t(d)];
    const size_t bytes = size_t(p.values[size_t(rank_)]) * row_bytes;
    if (bytes) std::memcpy(dst, static_cast<const char*>(p.data) + size_t(offset) * row_bytes, bytes);
    dst += bytes;
  }
  g.rendezvous(rank_, post.op, nullptr);
  return res;
}

std::vector<int64_t> ThreadCommunicator::all_gather(const std::vector<int64_t>& values) {
  ThreadGroup& g = *group_;
  Post post{Op::kAllGather, DType::kI64, {}, values, nullptr};
  if (auto v = g.rendezvous(rank_, post.op, &post); !v.empty()) throw InvalidInput(v);
  std::vector<int64_t> out;
  out.reserve(values.size() * size_t(g.n));
  for (int r = 0; r < g.n; ++r)
    out.insert(out.end(), g.posts[size_t(r)].values.begin(), g.posts[size_t(r)].values.end());
  g.rendezvous(rank_, post.op, nullptr);
  return out;
}

void ThreadCommunicator::barrier() {
  Post post{Op::kBarrier, DType::kF32, {}, {}, nullptr};
  if (auto v = group_->rendezvous(rank_, post.op, &post); !v.empty()) throw InvalidInput(v);
}

std::vector<std::unique_ptr<Communicator>> make_thread_group(int ranks,
                                                             std::chrono::milliseconds timeout) {
  if (ranks < 1) throw InvalidInput("a thread group needs at least 1 rank, got " + std::to_string(ranks));
  if (timeout.count() <= 0)
    throw InvalidInput("a thread group needs a positive timeout, got " +
                       std::to_string(timeout.count()) + " ms");
  auto g = std::make_shared<ThreadGroup>();
  g->n = ranks;
  g->timeout = timeout;
  g->arrived.assign(size_t(ranks), false);
  g->posts.resize(size_t(ranks));
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < ranks; ++r) comms.push_back(std::make_unique<ThreadCommunicator>(g, r));
  return comms;
}

std::vector<std::exception_ptr> run_ranks(const std::vector<std::unique_ptr<Communicator>>& comms,
                                          const std::function<void(Communicator&)>& fn) {
  std::vector<std::exception_ptr> errors(comms.size());
  // The failing rank's own communicator first (a thread group keeps that first reason), then every
  // other: an NCCL rank cannot be told by its peer, and one waiting on the device for the failed
  // rank (a replayed decode graph) is released only by aborting its own communicator.
  auto abort_all = [&](size_t r, const std::string& why) {
    comms[r]->abort(why);
    for (size_t q = 0; q < comms.size(); ++q)
      if (q != r) comms[q]->abort("rank " + std::to_string(r) + " failed: " + why);
  };
  std::vector<std::thread> threads;
  threads.reserve(comms.size());
  for (size_t r = 0; r < comms.size(); ++r)
    threads.emplace_back([&, r] {
      try {
        fn(*comms[r]);
      } catch (const std::exception& e) {
        errors[r] = std::current_exception();
        abort_all(r, e.what());
      } catch (...) {
        errors[r] = std::current_exception();
        abort_all(r, "an exception that is not a std::exception");
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

}  // namespace moex
