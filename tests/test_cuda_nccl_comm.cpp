// The NCCL communicator (make_nccl_group: ranks on the GPUs of one process) against the contract
// of moex/comm.hpp, with ThreadCommunicator as the reference: all_reduce_sum gives its bits (rank
// order, float32, one rounding) for device and host tensors of three dtypes, all_to_all_v delivers
// every row to its rank in sender order, all_gather / barrier, calls that disagree throw the same
// InvalidInput on every rank and leave the group usable; a peer that never arrives makes the
// waiting rank throw CommError within the timeout; all_reduce_sum_enqueue gives the same bits as
// stream work, also replayed from a captured CUDA graph; make_nccl_rank's ranks meet through their
// rendezvous file (and give up on it in time). Needs two GPUs and NCCL; skips otherwise (and in
// builds without CUDA, where make_nccl_group says so).
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "core/device_hooks.hpp"
#include "moex/comm.hpp"
#include "moex/error.hpp"
#include "support/test_support.hpp"

namespace moex {
namespace {

constexpr int kRanks = 2;

bool ready() { return test::cuda_devices() >= kRanks && nccl_available(); }

std::vector<std::unique_ptr<Communicator>> nccl_group(std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  std::vector<int> devices;
  for (int i = 0; i < kRanks; ++i) devices.push_back(i);
  return make_nccl_group(devices, timeout);
}

Tensor rank_values(int rank, int64_t n, DType dt) {
  std::mt19937 rng(uint32_t(1234 + rank));
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = u(rng);
  return Tensor::from_floats(v, {n}).to(dt);
}

std::vector<uint8_t> bytes_of(const Tensor& t) {
  const Tensor h = t.to(Device::cpu());
  std::vector<uint8_t> b(h.nbytes());
  std::memcpy(b.data(), h.raw(), b.size());
  return b;
}

// The reference: every rank's bytes after the thread group's all_reduce_sum of rank_values.
std::vector<std::vector<uint8_t>> thread_group_sum(int64_t n, DType dt) {
  std::vector<std::vector<uint8_t>> want(kRanks);
  auto threads = make_thread_group(kRanks);
  test::expect_no_rank_errors(run_ranks(threads, [&](Communicator& c) {
    Tensor t = rank_values(c.rank(), n, dt);
    c.all_reduce_sum(t);
    want[size_t(c.rank())] = bytes_of(t);
  }));
  return want;
}

TEST(CudaNcclComm, NoCudaBuildOrNoGpusSaySo) {
  if (ready()) GTEST_SKIP() << "two GPUs and NCCL present";
  EXPECT_THROW(make_nccl_group({0, 1}), Error);
}

TEST(CudaNcclComm, AllReduceSumHasTheThreadGroupsBits) {
  if (!ready()) GTEST_SKIP() << "needs two CUDA devices and NCCL";
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16})
    for (bool on_device : {true, false}) {
      const int64_t n = 1000003;  // not a multiple of anything
      const std::vector<std::vector<uint8_t>> want = thread_group_sum(n, dt);
      std::vector<std::vector<uint8_t>> got(kRanks);
      auto comms = nccl_group();
      test::expect_no_rank_errors(run_ranks(comms, [&](Communicator& c) {
        Tensor t = rank_values(c.rank(), n, dt);
        if (on_device) t = t.to(Device::cuda(c.rank()));
        c.all_reduce_sum(t);
        EXPECT_EQ(t.device(), on_device ? Device::cuda(c.rank()) : Device::cpu());
        got[size_t(c.rank())] = bytes_of(t);
      }));
      for (int r = 0; r < kRanks; ++r)
        EXPECT_TRUE(got[size_t(r)] == want[size_t(r)]) << dtype_name(dt) << " device " << on_device << " rank " << r;
    }
}

// Rank s sends s + 1 + d rows to rank d; row values encode (sender, destination, index).
TEST(CudaNcclComm, AllToAllVDeliversRowsInSenderOrder) {
  if (!ready()) GTEST_SKIP() << "needs two CUDA devices and NCCL";
  auto comms = nccl_group();
  constexpr int64_t kCols = 5;
  test::expect_no_rank_errors(run_ranks(comms, [&](Communicator& c) {
    const int s = c.rank();
    std::vector<int64_t> counts;
    std::vector<float> rows;
    for (int d = 0; d < kRanks; ++d) {
      counts.push_back(s + 1 + d);
      for (int64_t i = 0; i < s + 1 + d; ++i)
        for (int64_t k = 0; k < kCols; ++k) rows.push_back(float(s * 10000 + d * 1000 + i * 10 + k));
    }
    const int64_t R = int64_t(rows.size()) / kCols;
    const Tensor send = Tensor::from_floats(rows, {R, kCols}).to(Device::cuda(s));
    const AllToAllResult r = c.all_to_all_v(send, counts);
    std::vector<float> want;
    for (int p = 0; p < kRanks; ++p) {
      EXPECT_EQ(r.counts[size_t(p)], p + 1 + s);
      for (int64_t i = 0; i < p + 1 + s; ++i)
        for (int64_t k = 0; k < kCols; ++k) want.push_back(float(p * 10000 + s * 1000 + i * 10 + k));
    }
    EXPECT_EQ(r.rows.device(), Device::cuda(s));
    EXPECT_EQ(r.rows.to(Device::cpu()).to_float_vector(), want) << "rank " << s;
    // Host rows come back on the host; a rank may send nothing.
    const std::vector<int64_t> none(size_t(kRanks), 0);
    const AllToAllResult e = c.all_to_all_v(Tensor::empty({0, kCols}, DType::kF32), none);
    EXPECT_EQ(e.rows.size(0), 0);
  }));
}

TEST(CudaNcclComm, AllGatherAndBarrier) {
  if (!ready()) GTEST_SKIP() << "needs two CUDA devices and NCCL";
  auto comms = nccl_group();
  test::expect_no_rank_errors(run_ranks(comms, [&](Communicator& c) {
    c.barrier();
    const std::vector<int64_t> all = c.all_gather({int64_t(c.rank()), int64_t(c.rank()) * 7 - 3});
    EXPECT_EQ(all, (std::vector<int64_t>{0, -3, 1, 4}));
  }));
}

TEST(CudaNcclComm, DisagreeingCallsThrowOnEveryRankAndTheGroupStaysUsable) {
  if (!ready()) GTEST_SKIP() << "needs two CUDA devices and NCCL";
  auto comms = nccl_group();
  std::vector<std::string> what(kRanks);
  test::expect_no_rank_errors(run_ranks(comms, [&](Communicator& c) {
    Tensor t = Tensor::zeros({c.rank() == 0 ? 4 : 5}, DType::kF32, Device::cuda(c.rank()));
    try {
      c.all_reduce_sum(t);
      ADD_FAILURE() << "rank " << c.rank() << ": no error";
    } catch (const InvalidInput& e) {
      what[size_t(c.rank())] = e.what();
    }
    c.barrier();  // still usable
  }));
  EXPECT_EQ(what[0], what[1]);
  EXPECT_NE(what[0].find("disagree"), std::string::npos) << what[0];
}

// Measured on 2 x H200 with blocking communicators, rank 0 blocked inside NCCL's first call on
// the fresh group (NCCL connects the ranks lazily, on the host); the communicators are now
// non-blocking and that connection is polled against the timeout.
TEST(CudaNcclComm, APeerThatNeverArrivesTimesOut) {
  if (!ready()) GTEST_SKIP() << "needs two CUDA devices and NCCL";
  auto comms = nccl_group(std::chrono::milliseconds(1500));
  const auto start = std::chrono::steady_clock::now();
  std::string what;
  const auto errors = run_ranks(comms, [&](Communicator& c) {
    if (c.rank() == 1) return;  // never arrives
    try {
      c.barrier();
    } catch (const CommError& e) {
      what = e.what();
    }
  });
  test::expect_no_rank_errors(errors);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
  EXPECT_NE(what.find("did not complete within 1500 ms"), std::string::npos) << what;
  // The group is aborted: a later call fails at once. (Rank 1's side is aborted too, so that no
  // communicator is torn down waiting for a peer.)
  EXPECT_THROW(comms[0]->barrier(), CommError);
  comms[1]->abort("the test is over");
}

// The model path's all-reduce: stream work with no host synchronisation, the same bits as
// all_reduce_sum, and capturable: replayed from a CUDA graph on each rank it sums again.
TEST(CudaNcclComm, AllReduceSumEnqueueHasTheSameBitsAndReplaysFromAGraph) {
  if (!ready()) GTEST_SKIP() << "needs two CUDA devices and NCCL";
  const int64_t n = 300007;
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const std::vector<std::vector<uint8_t>> want = thread_group_sum(n, dt);
    auto comms = nccl_group();
    test::expect_no_rank_errors(run_ranks(comms, [&](Communicator& c) {
      const Device dev = Device::cuda(c.rank());
      EXPECT_EQ(c.device(), dev);
      const Tensor mine = rank_values(c.rank(), n, dt).to(dev);
      Tensor t = mine.clone();
      c.all_reduce_sum_enqueue(t);
      EXPECT_TRUE(bytes_of(t) == want[size_t(c.rank())]) << dtype_name(dt) << " rank " << c.rank() << ", direct";
      // Captured after one warm run (which sums t once more), replayed on a fresh copy of mine.
      auto graph = detail::capture_graph(dev, [&] { c.all_reduce_sum_enqueue(t); }, [] {});
      for (int rep = 0; rep < 3; ++rep) {
        detail::device_copy(t.raw(), dev, mine.raw(), dev, mine.nbytes());
        graph->replay();
        EXPECT_TRUE(bytes_of(t) == want[size_t(c.rank())]) << dtype_name(dt) << " rank " << c.rank() << ", replay " << rep;
      }
    }));
  }
  auto comms = nccl_group();
  test::expect_no_rank_errors(run_ranks(comms, [&](Communicator& c) {
    Tensor host = Tensor::zeros({4}, DType::kF32);
    EXPECT_THROW(c.all_reduce_sum_enqueue(host), InvalidInput) << "a host tensor is not stream work";
  }));
}

// One rank per process in production (moex launch); here two threads play the two processes.
TEST(CudaNcclComm, RanksMeetThroughTheRendezvousFile) {
  if (!ready()) GTEST_SKIP() << "needs two CUDA devices and NCCL";
  const std::string dir = ::testing::TempDir() + "/moex_rendezvous_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::vector<std::unique_ptr<Communicator>> comms(kRanks);
  std::vector<std::thread> threads;
  std::vector<std::string> errors(kRanks);
  for (int r = 0; r < kRanks; ++r)
    threads.emplace_back([&, r] {
      try {
        comms[size_t(r)] = make_nccl_rank(r, kRanks, r, dir + "/id", std::chrono::seconds(30));
      } catch (const std::exception& e) {
        errors[size_t(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  ASSERT_EQ(errors, std::vector<std::string>(kRanks)) << errors[0] << " / " << errors[1];
  test::expect_no_rank_errors(run_ranks(comms, [&](Communicator& c) {
    Tensor t = Tensor::from_floats({float(c.rank() + 1)}, {1}).to(Device::cuda(c.rank()));
    c.all_reduce_sum(t);
    EXPECT_EQ(t.to(Device::cpu()).to_float_vector(), std::vector<float>{3.0f});
  }));
  // A rank whose rank 0 never writes the file gives up within its timeout, naming the file.
  const auto start = std::chrono::steady_clock::now();
  try {
    make_nccl_rank(1, kRanks, 1, dir + "/never", std::chrono::milliseconds(300));
    ADD_FAILURE() << "no error";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("did not write the rendezvous file"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  EXPECT_THROW(make_nccl_rank(2, kRanks, 0, dir + "/x"), InvalidInput);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace moex
