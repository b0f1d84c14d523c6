// The experts call across ranks, replicated (all-reduce) or dispatched (all-to-all); the design is
// in moex/expert_parallel.hpp.
#include <algorithm>
#include <cstring>
#include <sstream>
#include <string>

#include "core/device_hooks.hpp"
#include "moex/error.hpp"
#include "moex/expert_parallel.hpp"

namespace moex {

namespace {

// The routing weight of every slot, [T, k], in top_k_weights' dtype: top_k_weights itself when it
// is per slot, else gathered by id from [T, E] (0 for sentinels). Done once here so that both
// modes, and the local experts call, see [T, k] whatever the router gave.
Tensor slot_weights(const Tensor& top_k_index, const Tensor& top_k_weights, int64_t num_experts) {
  const int64_t T = top_k_index.size(0), k = top_k_index.size(1);
  if (top_k_weights.size(1) == k) return top_k_weights.contiguous();
  if (!top_k_weights.device().host_accessible())
    throw Unsupported("expert_parallel_forward: [T, E] routing weights on " + top_k_weights.device().str() +
                      " (pass them per slot, [T, k])");
  const Tensor w = top_k_weights.contiguous();
  Tensor out = Tensor::zeros({T, k}, w.dtype());
  const std::vector<int64_t> ids = top_k_index.to_int_vector();
  const size_t es = dtype_size(w.dtype());
  const char* src = static_cast<const char*>(w.raw());
  char* dst = static_cast<char*>(out.raw());
  for (int64_t i = 0; i < T * k; ++i) {
    const int64_t id = ids[size_t(i)];
    if (id >= 0 && id < num_experts)
      std::memcpy(dst + size_t(i) * es, src + size_t((i / k) * num_experts + id) * es, es);
  }
  return out;
}

// Local checks, then (check_ranks) one all_gather so that ranks called with different problems all
// fail with the same message instead of deadlocking or mixing rows of different shapes.
void check_problem(Communicator& comm, const Experts& local, const ExpertShard& shard,
                   const Tensor& hidden, const Tensor& top_k_index, const Tensor& top_k_weights,
                   ExpertParallelMode mode, bool check_ranks) {
  const std::string me = "expert_parallel_forward on rank " + std::to_string(comm.rank()) + ": ";
  if (shard.rank != comm.rank() || shard.size != comm.size())
    throw InvalidInput(me + "the shard is rank " + std::to_string(shard.rank) + " of " +
                       std::to_string(shard.size) + ", the communicator rank " +
                       std::to_string(comm.rank()) + " of " + std::to_string(comm.size()));
  if (local.spec().num_experts != shard.count)
    throw InvalidInput(me + "the local experts hold " + std::to_string(local.spec().num_experts) +
                       " experts, the shard " + std::to_string(shard.count));
  const int64_t H = local.spec().hidden;
  if (hidden.dim() != 2 || hidden.size(1) != H)
    throw InvalidInput(me + "hidden must be [T, " + std::to_string(H) + "], got " + hidden.str());
  const int64_t T = hidden.size(0);
  if (top_k_index.dim() != 2 || top_k_index.size(0) != T ||
      (top_k_index.dtype() != DType::kI32 && top_k_index.dtype() != DType::kI64))
    throw InvalidInput(me + "top_k_index must be int32 or int64 [" + std::to_string(T) +
                       ", k], got " + top_k_index.str());
  const int64_t k = top_k_index.size(1);
  if (top_k_weights.dim() != 2 || top_k_weights.size(0) != T ||
      (top_k_weights.size(1) != k && top_k_weights.size(1) != shard.num_experts) ||
      !is_floating(top_k_weights.dtype()))
    throw InvalidInput(me + "top_k_weights must be float [" + std::to_string(T) + ", " +
                       std::to_string(k) + "] or [" + std::to_string(T) + ", " +
                       std::to_string(shard.num_experts) + "], got " + top_k_weights.str());
  // Host tensors, or tensors on the communicator's device (the model's GPU), all in one place.
  const Device dev = hidden.device();
  for (const Tensor* t : {&hidden, &top_k_index, &top_k_weights})
    if (t->device() != dev || (!dev.host_accessible() && dev != comm.device()))
      throw InvalidInput(me + "hidden, top_k_index and top_k_weights must be on the host or on the "
                         "communicator's device " + comm.device().str() + ", got " + hidden.str() + ", " +
                         top_k_index.str() + ", " + top_k_weights.str());
  if (mode == ExpertParallelMode::kAllToAll && detail::capturing(dev))
    throw Unsupported(me + "the all-to-all mode plans its dispatch from the ids on the host (a "
                      "synchronisation), which a CUDA graph cannot capture; the replicated mode can");
  // Every rank holds the same ids, so every rank throws here alike (none is left waiting). Ids on
  // a device are not read back (that would synchronise every layer); mark_sentinels turns a
  // negative one into a sentinel there.
  if (dev.host_accessible()) {
    const std::vector<int64_t> ids = top_k_index.to_int_vector();
    for (size_t i = 0; i < ids.size(); ++i)
      if (ids[i] < 0)
        throw InvalidInput(me + "top_k_index[" + std::to_string(int64_t(i) / k) + ", " +
                           std::to_string(int64_t(i) % k) + "] = " + std::to_string(ids[i]) +
                           " is negative");
  }
  if (!check_ranks) return;

  const std::vector<int64_t> mine = {T, k, H, int64_t(hidden.dtype()), int64_t(mode),
                                     shard.num_experts};
  const std::vector<int64_t> all = comm.all_gather(mine);
  auto describe = [&](size_t r) {
    const int64_t* v = &all[r * mine.size()];
    std::ostringstream o;
    o << "rank " << r << " has hidden " << dtype_name(DType(v[3])) << "[" << v[0] << ", " << v[2]
      << "], k=" << v[1] << ", E=" << v[5] << ", mode "
      << (ExpertParallelMode(v[4]) == ExpertParallelMode::kReplicated ? "replicated" : "all_to_all");
    return o.str();
  };
  for (size_t q = 1; q < size_t(comm.size()); ++q)
    if (!std::equal(all.begin(), all.begin() + std::ptrdiff_t(mine.size()),
                    all.begin() + std::ptrdiff_t(q * mine.size())))
      throw InvalidInput("expert_parallel_forward: the ranks disagree: " + describe(0) + ", " +
                         describe(q));
}

Tensor rows_of(const Tensor& t, int64_t begin, int64_t end) { return t.slice(0, begin, end).contiguous(); }

Tensor all_to_all_forward(Communicator& comm, const Experts& local, std::string_view backend,
                          const ExpertShard& shard, const Tensor& hidden, const Tensor& top_k_index,
                          const Tensor& weights) {
  const int64_t T = hidden.size(0), k = top_k_index.size(1), H = hidden.size(1);
  const DType dt = hidden.dtype();
  const TokenRange mine = token_slice(T, comm.size(), comm.rank());
  const int64_t Tl = mine.size();

  // Dispatch: one row per (token, slot) routed to a held expert, ordered by destination.
  const std::vector<int64_t> ids = rows_of(top_k_index, mine.begin, mine.end).to_int_vector();
  const DispatchPlan plan = plan_dispatch(ids, k, shard);
  const int64_t R = int64_t(plan.flat.size());
  const Tensor x = rows_of(hidden, mine.begin, mine.end);
  const std::vector<float> w = rows_of(weights, mine.begin, mine.end).to_float_vector();
  Tensor send_x = Tensor::empty({R, H}, dt);
  Tensor send_id = Tensor::empty({R, 1}, DType::kI64);
  Tensor send_w = Tensor::empty({R, 1}, DType::kF32);
  const size_t row_bytes = size_t(H) * dtype_size(dt);
  for (int64_t p = 0; p < R; ++p) {
    const int64_t f = plan.flat[size_t(p)];
    std::memcpy(static_cast<char*>(send_x.raw()) + size_t(p) * row_bytes,
                static_cast<const char*>(x.raw()) + size_t(f / k) * row_bytes, row_bytes);
    send_id.data<int64_t>()[p] = plan.local_ids[size_t(p)];
    send_w.data<float>()[p] = w[size_t(f)];
  }
  const AllToAllResult got_x = comm.all_to_all_v(send_x, plan.send_counts);
  const AllToAllResult got_id = comm.all_to_all_v(send_id, plan.send_counts);
  const AllToAllResult got_w = comm.all_to_all_v(send_w, plan.send_counts);

  // The owner's experts on the rows it received: a [rows, 1] top-k problem, weight applied.
  const Tensor y = local.forward(backend, got_x.rows, got_id.rows, got_w.rows);

  // Back to the senders: each receives its rows in the order it sent them (plan order).
  const AllToAllResult back = comm.all_to_all_v(y, got_x.counts);

  // Combine per token in slot order, float32, one rounding.
  const std::vector<int64_t> pos = combine_positions(plan, Tl, k);
  const Tensor back_f = back.rows.to(DType::kF32);
  const float* b = back_f.data<float>();
  std::vector<float> acc(size_t(Tl * H), 0.0f);
  for (int64_t t = 0; t < Tl; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int64_t p = pos[size_t(t * k + j)];
      if (p < 0) continue;
      for (int64_t h = 0; h < H; ++h) acc[size_t(t * H + h)] += b[p * H + h];
    }

  // Every rank returns [T, H]: each sends its slice to all (the receive is in rank order).
  Tensor send_out = Tensor::empty({Tl * comm.size(), H}, dt);
  for (int r = 0; r < comm.size(); ++r)
    convert_floats(acc.data(), DType::kF32,
                   static_cast<char*>(send_out.raw()) + size_t(r * Tl) * row_bytes, dt, Tl * H);
  return comm.all_to_all_v(send_out, std::vector<int64_t>(size_t(comm.size()), Tl)).rows;
}

// The same exchange with the rows on a GPU: the plan is made on the host from the ids (one
// download), the rows move on the device (gather_rows_on_device for the dispatch and the final
// exchange, sum_rows_on_device for the combine, in the host version's order and rounding).
Tensor all_to_all_forward_device(Communicator& comm, const Experts& local, std::string_view backend,
                                 const ExpertShard& shard, const Tensor& hidden, const Tensor& top_k_index,
                                 const Tensor& weights) {
  const int64_t T = hidden.size(0), k = top_k_index.size(1), H = hidden.size(1);
  const Device dev = hidden.device();
  const DType dt = hidden.dtype();
  const TokenRange mine = token_slice(T, comm.size(), comm.rank());
  const int64_t Tl = mine.size();
  auto upload = [&](const std::vector<int64_t>& v) {
    return Tensor::from_ints(v, {int64_t(v.size())}).to(dev);
  };

  const std::vector<int64_t> ids = top_k_index.slice(0, mine.begin, mine.end).to(Device::cpu()).to_int_vector();
  const DispatchPlan plan = plan_dispatch(ids, k, shard);
  const int64_t R = int64_t(plan.flat.size());
  std::vector<int64_t> row_of(static_cast<size_t>(R)), slot_of(static_cast<size_t>(R));
  for (int64_t p = 0; p < R; ++p) {
    row_of[size_t(p)] = mine.begin + plan.flat[size_t(p)] / k;
    slot_of[size_t(p)] = mine.begin * k + plan.flat[size_t(p)];
  }
  Tensor send_x = Tensor::empty({R, H}, dt, dev);
  Tensor send_w = Tensor::empty({R, 1}, weights.dtype(), dev);
  detail::gather_rows_on_device(hidden, upload(row_of), send_x);
  detail::gather_rows_on_device(weights.view({T * k, 1}), upload(slot_of), send_w);
  const Tensor send_id = Tensor::from_ints(plan.local_ids, {R, 1}).to(dev);
  const AllToAllResult got_x = comm.all_to_all_v(send_x, plan.send_counts);
  const AllToAllResult got_id = comm.all_to_all_v(send_id, plan.send_counts);
  const AllToAllResult got_w = comm.all_to_all_v(send_w, plan.send_counts);

  const Tensor y = local.forward(backend, got_x.rows, got_id.rows, got_w.rows);
  const AllToAllResult back = comm.all_to_all_v(y, got_x.counts);

  Tensor part = Tensor::empty({Tl, H}, dt, dev);
  detail::sum_rows_on_device(back.rows, upload(combine_positions(plan, Tl, k)), k, part);
  // Every rank returns [T, H]: its slice to every rank (rows 0..Tl-1, N times).
  std::vector<int64_t> tiles;
  for (int r = 0; r < comm.size(); ++r)
    for (int64_t t = 0; t < Tl; ++t) tiles.push_back(t);
  Tensor send_out = Tensor::empty({Tl * comm.size(), H}, dt, dev);
  detail::gather_rows_on_device(part, upload(tiles), send_out);
  return comm.all_to_all_v(send_out, std::vector<int64_t>(size_t(comm.size()), Tl)).rows;
}

}  // namespace

Tensor expert_parallel_forward(Communicator& comm, const Experts& local, std::string_view backend,
                               const ExpertShard& shard, const Tensor& hidden,
                               const Tensor& top_k_index, const Tensor& top_k_weights,
                               ExpertParallelMode mode, bool check_ranks) {
  check_problem(comm, local, shard, hidden, top_k_index, top_k_weights, mode, check_ranks);
  const Tensor x = hidden.contiguous();
  const Tensor ids = top_k_index.contiguous();
  const Tensor w = slot_weights(ids, top_k_weights, shard.num_experts);
  if (mode == ExpertParallelMode::kAllToAll)
    return x.device().host_accessible() ? all_to_all_forward(comm, local, backend, shard, x, ids, w)
                                        : all_to_all_forward_device(comm, local, backend, shard, x, ids, w);
  // Replicated: this rank's experts on every token, the others' ids as sentinels, summed.
  Tensor out = local.forward(backend, x, mark_sentinels(ids, shard), w);
  if (out.device().host_accessible()) comm.all_reduce_sum(out);
  else comm.all_reduce_sum_enqueue(out);  // stream work: a captured decode step keeps it
  return out;
}

}  // namespace moex
