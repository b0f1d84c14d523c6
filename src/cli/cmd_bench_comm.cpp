// `moex bench comm --ep-size N`: the two collectives expert parallelism moves its rows with, on N
// GPUs of this machine (an NCCL group, rank r on cuda:r, one thread each), against the measured
// peer copy bandwidth between cuda:0 and cuda:1 (NVLink on an H200 board):
//  - all-reduce: all_reduce_sum_enqueue of a [rows, hidden] tensor, the replicated mode's sum
//    (rank order: each rank receives the other N - 1 ranks' tensors, so its floor is
//    (N - 1) x bytes / peer bandwidth);
//  - all-to-all: all_to_all_v with equal shares, the all-to-all mode's dispatch (each rank
//    receives (N - 1) / N of its tensor's bytes; its floor divides those), the API call as the
//    model makes it (count exchange and its host wait included).
// Each result is checked before it is timed (the sum of the ranks' values; every row from its
// sender). Times: median of event-timed runs per rank (time_cuda_ms), the slowest rank reported.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/args.hpp"
#include "cli/command.hpp"
#include "moex/bench.hpp"
#include "moex/comm.hpp"
#include "moex/error.hpp"

namespace moex::cli {

int run_bench_comm(const std::vector<std::string>& argv) {
  static const Usage kUsage = [] {
    Usage u{"bench comm", "--ep-size N [flags]",
            "Time the expert-parallel collectives on N GPUs (rank r on cuda:r, NCCL) for [rows, hidden]\n"
            "bfloat16 tensors, against the measured peer copy bandwidth.",
            {}};
    u.flags = {{"ep-size", "N", "ranks (GPUs), >= 2"},
               {"rows", "R,R", "rows per rank (default 64,1024,8192,16384)"},
               {"hidden", "H", "row width (default 7168, DeepSeek-V3)"},
               {"iters", "N", "timed runs per row (default 20)"},
               {"json", "", "one JSON object per row instead of the table"}};
    return u;
  }();
  Args a(argv, kUsage);
  const int64_t n = a.get_int("ep-size", 0);
  const int64_t H = a.get_int("hidden", 7168);
  const int64_t iters = a.get_int("iters", 20);
  const std::vector<int64_t> rows = a.get_int_list("rows", {64, 1024, 8192, 16384});
  if (n < 2 || n > 64) throw InvalidInput("--ep-size must be between 2 and 64, got " + std::to_string(n));
  if (H < 1) throw InvalidInput("--hidden must be >= 1");
  if (iters < 1) throw InvalidInput("--iters must be >= 1");
  for (int64_t R : rows)
    if (R < n || R % n != 0) throw InvalidInput("--rows entries must be positive multiples of --ep-size");
  const bool json = a.has("json");

  std::vector<int> devices;
  for (int r = 0; r < int(n); ++r) devices.push_back(r);
  auto comms = make_nccl_group(devices);
  const double peer = measure_peer_copy_gbps(Device::cuda(0), Device::cuda(1));
  if (!json)
    std::printf("# %lld ranks, bfloat16 rows of %lld; peer copy cuda:0 -> cuda:1 %.1f GB/s\n"
                "| op | rows per rank | MB per rank | ms | received GB/s | floor ms | of floor |\n"
                "|---|---|---|---|---|---|---|\n",
                (long long)n, (long long)H, peer);
  for (int64_t R : rows) {
    const double bytes = double(R * H * 2);
    std::vector<double> reduce_ms(static_cast<size_t>(n)), a2a_ms(static_cast<size_t>(n));
    const auto errors = run_ranks(comms, [&](Communicator& c) {
      const Device dev = c.device();
      const int me = c.rank();
      // All-reduce: ranks hold me + 1 everywhere, the sum is n (n + 1) / 2 (exact in bfloat16 for
      // the sizes allowed here); timed on zeros, which stay zeros.
      Tensor t = Tensor::from_floats(std::vector<float>(size_t(R * H), float(me + 1)), {R, H}).to(DType::kBF16).to(dev);
      c.all_reduce_sum_enqueue(t);
      const std::vector<float> got = t.to(Device::cpu()).to(DType::kF32).to_float_vector();
      const float want = float(n * (n + 1) / 2);
      if (std::any_of(got.begin(), got.end(), [&](float v) { return v != want; }))
        throw Error("all-reduce check failed on rank " + std::to_string(me));
      Tensor z = Tensor::zeros({R, H}, DType::kBF16, dev);
      reduce_ms[size_t(me)] = time_cuda_ms(dev, [&] { c.all_reduce_sum_enqueue(z); }, false, 3, int(iters));
      // All-to-all: R / n rows to each rank, every row holding its sender's id.
      const Tensor send =
          Tensor::from_floats(std::vector<float>(size_t(R * H), float(me)), {R, H}).to(DType::kBF16).to(dev);
      const std::vector<int64_t> counts(size_t(n), R / n);
      const AllToAllResult r = c.all_to_all_v(send, counts);
      const std::vector<float> rows_in = r.rows.to(Device::cpu()).to(DType::kF32).to_float_vector();
      for (int64_t p = 0; p < n; ++p)
        for (int64_t i = 0; i < (R / n) * H; ++i)
          if (rows_in[size_t(p * (R / n) * H + i)] != float(p))
            throw Error("all-to-all check failed on rank " + std::to_string(me) + ": a row from rank " +
                        std::to_string(p) + " holds another rank's values");
      a2a_ms[size_t(me)] = time_cuda_ms(dev, [&] { c.all_to_all_v(send, counts); }, false, 3, int(iters));
    });
    for (const auto& e : errors)
      if (e) std::rethrow_exception(e);
    const double t_reduce = *std::max_element(reduce_ms.begin(), reduce_ms.end());
    const double t_a2a = *std::max_element(a2a_ms.begin(), a2a_ms.end());
    struct Row {
      const char* op;
      double ms, received;
    };
    for (const Row& row : {Row{"all_reduce_sum_enqueue", t_reduce, double(n - 1) * bytes},
                           Row{"all_to_all_v", t_a2a, double(n - 1) / double(n) * bytes}}) {
      const double floor_ms = row.received / (peer * 1e9) * 1e3;
      nlohmann::json j;
      j["op"] = row.op;
      j["ranks"] = n;
      j["rows_per_rank"] = R;
      j["hidden"] = H;
      j["bytes_per_rank"] = bytes;
      j["ms"] = row.ms;
      j["received_gbps"] = row.received / (row.ms * 1e-3) / 1e9;
      j["peer_copy_gbps"] = peer;
      j["floor_ms"] = floor_ms;
      j["fraction_of_floor"] = floor_ms / row.ms;
      if (json)
        std::printf("%s\n", j.dump().c_str());
      else
        std::printf("| %s | %lld | %.2f | %.3f | %.1f | %.3f | %.0f%% |\n", row.op, (long long)R, bytes / 1e6, row.ms,
                    j["received_gbps"].get<double>(), floor_ms, 100.0 * floor_ms / row.ms);
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace moex::cli
