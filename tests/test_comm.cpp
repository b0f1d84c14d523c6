// ThreadCommunicator: the collectives' results, their determinism, validation across ranks, and
// failure without hangs (a peer that aborts or never arrives).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "moex/comm.hpp"
#include "support/test_support.hpp"

using namespace moex;
using std::chrono::milliseconds;

namespace {

// Runs fn on every rank; fails the test with each rank's exception.
void run_ok(const std::vector<std::unique_ptr<Communicator>>& comms,
            const std::function<void(Communicator&)>& fn) {
  test::expect_no_rank_errors(run_ranks(comms, fn));
}

template <class E>
std::string message_of(const std::exception_ptr& p) {
  try {
    std::rethrow_exception(p);
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("wrong exception type: ") + e.what();
  }
}

TEST(ThreadComm, AllReduceSumsInRankOrderInFloat32) {
  // 1e8 + 1 == 1e8 in float32: ((1e8 + 1) - 1e8) = 0 in rank order, 1 in any other order.
  auto comms = make_thread_group(3);
  const std::vector<float> value = {1e8f, 1.0f, -1e8f};
  for (int rep = 0; rep < 20; ++rep)
    run_ok(comms, [&](Communicator& c) {
      Tensor t = Tensor::from_floats({value[size_t(c.rank())], 2.0f}, {2});
      c.all_reduce_sum(t);
      EXPECT_EQ(t.to_float_vector(), (std::vector<float>{0.0f, 6.0f})) << "rank " << c.rank();
    });
}

TEST(ThreadComm, AllReduceSixteenBitRoundsOnce) {
  // bfloat16: 256 + 1 + 1 is 258 when summed in float32 and rounded once, 256 when each
  // partial sum is rounded to bfloat16.
  for (DType dt : {DType::kBF16, DType::kF16}) {
    auto comms = make_thread_group(3);
    const float big = dt == DType::kBF16 ? 256.0f : 2048.0f;
    run_ok(comms, [&](Communicator& c) {
      Tensor t = Tensor::from_floats({c.rank() == 0 ? big : 1.0f, -1.0f, 0.5f}, {1, 3}, dt);
      c.all_reduce_sum(t);
      EXPECT_EQ(t.dtype(), dt);
      EXPECT_EQ(t.to_float_vector(), (std::vector<float>{big + 2, -3.0f, 1.5f}))
          << dtype_name(dt) << " rank " << c.rank();
    });
  }
}

TEST(ThreadComm, AllToAllVMovesRowsInRankOrder) {
  for (int n : {1, 2, 3, 4}) {
    auto comms = make_thread_group(n);
    // Rank s sends (s + d) % 3 rows to rank d (zeros included); row i to d holds 100 s + 10 d + i.
    auto count = [](int s, int d) { return int64_t((s + d) % 3); };
    run_ok(comms, [&](Communicator& c) {
      const int s = c.rank();
      std::vector<int64_t> counts;
      std::vector<float> rows;
      for (int d = 0; d < n; ++d) {
        counts.push_back(count(s, d));
        for (int64_t i = 0; i < count(s, d); ++i)
          rows.insert(rows.end(), {float(100 * s + 10 * d + i), -1.0f});
      }
      const Tensor send =
          Tensor::from_floats(rows, {int64_t(rows.size() / 2), 2}, DType::kF16);  // exact to 2048
      const AllToAllResult got = c.all_to_all_v(send, counts);
      std::vector<float> want;
      for (int src = 0; src < n; ++src) {
        EXPECT_EQ(got.counts[size_t(src)], count(src, s));
        for (int64_t i = 0; i < count(src, s); ++i)
          want.insert(want.end(), {float(100 * src + 10 * s + i), -1.0f});
      }
      EXPECT_EQ(got.rows.shape(), (Shape{int64_t(want.size() / 2), 2}));
      EXPECT_EQ(got.rows.to_float_vector(), want) << "n=" << n << " rank " << s;
    });
  }
}

TEST(ThreadComm, AllGatherConcatenatesInRankOrder) {
  auto comms = make_thread_group(4);
  run_ok(comms, [&](Communicator& c) {
    const auto got = c.all_gather({c.rank(), 10 * c.rank()});
    EXPECT_EQ(got, (std::vector<int64_t>{0, 0, 1, 10, 2, 20, 3, 30}));
    c.barrier();
    EXPECT_TRUE(c.all_gather({}).empty());
  });
}

TEST(ThreadComm, MismatchedShapesFailOnEveryRankNamingThem) {
  auto comms = make_thread_group(3);
  const auto errors = run_ranks(comms, [&](Communicator& c) {
    Tensor t = Tensor::zeros({3, c.rank() == 2 ? 5 : 4}, DType::kF32);
    try {
      c.all_reduce_sum(t);
    } catch (const InvalidInput& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("rank 2"), std::string::npos) << m;
      EXPECT_NE(m.find("[3, 5]"), std::string::npos) << m;
      EXPECT_NE(m.find("[3, 4]"), std::string::npos) << m;
      c.barrier();  // the group stays usable after a mismatch
      throw;
    }
  });
  for (const auto& e : errors) EXPECT_TRUE(e);
  for (const auto& e : errors) EXPECT_EQ(message_of<InvalidInput>(e).find("wrong"), std::string::npos);
}

TEST(ThreadComm, MismatchedDtypesAndCollectivesFail) {
  auto comms = make_thread_group(2);
  auto errors = run_ranks(comms, [&](Communicator& c) {
    Tensor t = Tensor::zeros({2}, c.rank() == 0 ? DType::kF32 : DType::kBF16);
    c.all_reduce_sum(t);
  });
  for (const auto& e : errors) EXPECT_NE(message_of<InvalidInput>(e).find("dtypes differ"), std::string::npos);
  comms = make_thread_group(2);
  errors = run_ranks(comms, [&](Communicator& c) {
    if (c.rank() == 0) c.barrier();
    else c.all_gather({1});
  });
  for (const auto& e : errors)
    EXPECT_NE(message_of<InvalidInput>(e).find("different collectives"), std::string::npos);
}

TEST(ThreadComm, LocalInputErrorsAreInvalidInput) {
  EXPECT_THROW(make_thread_group(0), InvalidInput);
  EXPECT_THROW(make_thread_group(2, milliseconds(0)), InvalidInput);
  auto comms = make_thread_group(1);
  Tensor i = Tensor::from_ints({1, 2}, {2});
  EXPECT_THROW(comms[0]->all_reduce_sum(i), InvalidInput);
  Tensor f = Tensor::zeros({3, 2}, DType::kF32);
  EXPECT_THROW(comms[0]->all_to_all_v(f, {2}), InvalidInput);      // counts sum to 2, not 3
  EXPECT_THROW(comms[0]->all_to_all_v(f, {3, 0}), InvalidInput);   // 2 counts for 1 rank
  Tensor strided = Tensor::zeros({4, 4}, DType::kF32).transpose(0, 1);
  EXPECT_THROW(comms[0]->all_reduce_sum(strided), InvalidInput);
}

TEST(ThreadComm, ARankThatFailsAbortsTheOthersFast) {
  // Default (60 s) timeout: the others must learn of the failure from the abort, not the clock.
  auto comms = make_thread_group(4);
  const auto start = std::chrono::steady_clock::now();
  const auto errors = run_ranks(comms, [&](Communicator& c) {
    if (c.rank() == 2) throw InvalidInput("bad weights on this rank");
    Tensor t = Tensor::zeros({8}, DType::kF32);
    c.all_reduce_sum(t);
  });
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  for (int r = 0; r < 4; ++r) {
    ASSERT_TRUE(errors[size_t(r)]) << "rank " << r;
    if (r == 2) continue;
    const std::string m = message_of<CommError>(errors[size_t(r)]);
    EXPECT_NE(m.find("rank 2 aborted: bad weights on this rank"), std::string::npos) << m;
  }
  // Later calls fail at once too, and so does the host check, on every rank.
  EXPECT_THROW(comms[0]->barrier(), CommError);
  for (auto& c : comms) EXPECT_THROW(c->throw_if_aborted(), CommError);
}

TEST(ThreadComm, ThrowIfAbortedPassesWhileTheGroupStands) {
  auto comms = make_thread_group(2);
  for (auto& c : comms) EXPECT_NO_THROW(c->throw_if_aborted());
  comms[1]->abort("stopped");
  try {
    comms[0]->throw_if_aborted();
    FAIL() << "no error";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 aborted: stopped"), std::string::npos) << e.what();
  }
}

TEST(ThreadComm, APeerThatNeverArrivesTimesOutEveryRank) {
  auto comms = make_thread_group(3, milliseconds(200));
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::exception_ptr> errors(3);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r)
    threads.emplace_back([&, r] {
      if (r == 1) return;  // gone without a word (no abort)
      try {
        comms[size_t(r)]->all_gather({r});
      } catch (...) {
        errors[size_t(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  for (int r : {0, 2}) {
    const std::string m = message_of<CommError>(errors[size_t(r)]);
    EXPECT_NE(m.find("timed out after 200 ms in all_gather waiting for rank(s) 1"), std::string::npos)
        << m;
  }
}

}  // namespace
