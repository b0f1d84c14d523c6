// Expert parallelism on in-process ranks: the shard math, the all-to-all index math, and both
// modes of expert_parallel_forward against the single-device experts call, plus its failures.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "moex/check.hpp"
#include "moex/expert_parallel.hpp"
#include "moex/safetensors.hpp"
#include "support/test_support.hpp"

using namespace moex;

namespace {

// ---- shards ----

TEST(ExpertShard, ContiguousByRank) {
  const ExpertShard s = make_expert_shard(12, 3, 2);
  EXPECT_EQ(s.first, 8);
  EXPECT_EQ(s.count, 4);
  EXPECT_TRUE(s.owns(11));
  EXPECT_FALSE(s.owns(7));
  EXPECT_EQ(s.owner(5), 1);
  const ExpertShard one = make_expert_shard(5, 1, 0);
  EXPECT_EQ(one.first, 0);
  EXPECT_EQ(one.count, 5);
}

TEST(ExpertShard, InvalidSizesSayWhy) {
  try {
    make_expert_shard(12, 5, 0);
    FAIL() << "no error";
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("ep_size must divide the number of experts"),
              std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("ep_size 5"), std::string::npos) << e.what();
  }
  EXPECT_THROW(make_expert_shard(12, 0, 0), InvalidInput);
  EXPECT_THROW(make_expert_shard(12, -2, 0), InvalidInput);
  EXPECT_THROW(make_expert_shard(12, 3, 3), InvalidInput);
  EXPECT_THROW(make_expert_shard(0, 1, 0), InvalidInput);
}

TEST(ExpertShard, MarkSentinels) {
  const ExpertShard s = make_expert_shard(12, 3, 1);  // experts 4..7
  for (DType dt : {DType::kI64, DType::kI32}) {
    const Tensor ids = Tensor::from_ints({0, 5, 11, 12, 7, 4, 40, 3}, {4, 2}, dt);
    const Tensor local = mark_sentinels(ids, s);
    EXPECT_EQ(local.dtype(), dt);
    EXPECT_EQ(local.shape(), (Shape{4, 2}));
    EXPECT_EQ(local.to_int_vector(), (std::vector<int64_t>{4, 1, 4, 4, 3, 0, 4, 4}));
  }
  EXPECT_THROW(mark_sentinels(Tensor::from_ints({1, -1}, {1, 2}), s), InvalidInput);
  EXPECT_THROW(mark_sentinels(Tensor::from_floats({1, 2}, {1, 2}), s), InvalidInput);
  EXPECT_EQ(mark_sentinels(Tensor::from_ints({}, {0, 2}), s).shape(), (Shape{0, 2}));
}

TEST(ExpertShard, WeightsAreViews) {
  const test::ExpertsLayout l{true, true, false, true};
  const ExpertsSpec spec = test::make_experts_spec(l, 6, 16, 8, Activation::kSilu);
  const ExpertsWeights w = test::random_experts_weights(spec, DType::kBF16, 3);
  const ExpertShard s = make_expert_shard(6, 3, 1);
  const ExpertsWeights local = shard_experts_weights(spec, w, s);
  validate_experts_weights(shard_experts_spec(spec, s), local);
  EXPECT_EQ(local.gate_up.shape(), (Shape{2, 16, 16}));
  EXPECT_EQ(local.gate_up.storage(), w.gate_up.storage());
  EXPECT_EQ(local.gate_up.raw(), w.gate_up.select(0, 2).raw());
  EXPECT_EQ(local.down_bias.raw(), w.down_bias.select(0, 2).raw());
  EXPECT_TRUE(local.down.is_contiguous());

  // The per-expert form keeps the shard's own tensors.
  ExpertsWeights pe;
  auto per = std::make_shared<PerExpertWeights>();
  const ExpertsSpec plain = test::make_experts_spec({true, false, false, true}, 6, 16, 8,
                                                    Activation::kSilu);
  const ExpertsWeights fused = test::random_experts_weights(plain, DType::kF32, 4);
  for (int64_t e = 0; e < 6; ++e) {
    per->gate.push_back(fused.gate_up.select(0, e).slice(0, 0, 8));
    per->up.push_back(fused.gate_up.select(0, e).slice(0, 8, 16));
    per->down.push_back(fused.down.select(0, e));
  }
  pe.per_expert = per;
  const ExpertsWeights local_pe = shard_experts_weights(plain, pe, s);
  ASSERT_EQ(local_pe.per_expert->gate.size(), 2u);
  EXPECT_EQ(local_pe.per_expert->down[1].raw(), per->down[3].raw());
  EXPECT_FALSE(local_pe.fused());

  EXPECT_THROW(shard_experts_weights(spec, w, make_expert_shard(12, 3, 1)), InvalidInput);
}

// ---- index math ----

TEST(ExpertParallelPlan, TokenSlices) {
  auto slices = [](int64_t T, int n) {
    std::vector<int64_t> v;
    for (int r = 0; r < n; ++r) {
      const TokenRange s = token_slice(T, n, r);
      v.insert(v.end(), {s.begin, s.end});
    }
    return v;
  };
  EXPECT_EQ(slices(7, 3), (std::vector<int64_t>{0, 3, 3, 5, 5, 7}));
  EXPECT_EQ(slices(2, 4), (std::vector<int64_t>{0, 1, 1, 2, 2, 2, 2, 2}));
  EXPECT_EQ(slices(0, 2), (std::vector<int64_t>{0, 0, 0, 0}));
  EXPECT_THROW(token_slice(3, 2, 2), InvalidInput);
}

TEST(ExpertParallelPlan, DispatchOrdersByRankThenTokenThenSlot) {
  const ExpertShard s = make_expert_shard(6, 3, 0);  // ranks hold {0,1}, {2,3}, {4,5}
  // T = 3, k = 2; 9 is a sentinel already; token 2 routes nowhere on ranks 0 and 1.
  const std::vector<int64_t> ids = {5, 0, 3, 9, 4, 5};
  const DispatchPlan p = plan_dispatch(ids, 2, s);
  EXPECT_EQ(p.send_counts, (std::vector<int64_t>{1, 1, 3}));
  EXPECT_EQ(p.flat, (std::vector<int64_t>{1, 2, 0, 4, 5}));
  EXPECT_EQ(p.local_ids, (std::vector<int64_t>{0, 1, 1, 0, 1}));
  const auto pos = combine_positions(p, 3, 2);
  EXPECT_EQ(pos, (std::vector<int64_t>{2, 0, 1, -1, 3, 4}));
  for (size_t q = 0; q < p.flat.size(); ++q) EXPECT_EQ(pos[size_t(p.flat[q])], int64_t(q));
}

TEST(ExpertParallelPlan, UglyCases) {
  const ExpertShard s = make_expert_shard(8, 4, 2);
  // Every slot to one rank, duplicates included.
  DispatchPlan p = plan_dispatch({7, 6, 6, 7}, 2, s);
  EXPECT_EQ(p.send_counts, (std::vector<int64_t>{0, 0, 0, 4}));
  EXPECT_EQ(p.flat, (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(p.local_ids, (std::vector<int64_t>{1, 0, 0, 1}));
  // k = 1.
  p = plan_dispatch({3, 0, 5}, 1, s);
  EXPECT_EQ(p.send_counts, (std::vector<int64_t>{1, 1, 1, 0}));
  EXPECT_EQ(p.flat, (std::vector<int64_t>{1, 0, 2}));
  EXPECT_EQ(combine_positions(p, 3, 1), (std::vector<int64_t>{1, 0, 2}));
  // Only sentinels: nothing is sent, every slot combines to nothing.
  p = plan_dispatch({8, 100}, 2, s);
  EXPECT_EQ(p.send_counts, (std::vector<int64_t>{0, 0, 0, 0}));
  EXPECT_TRUE(p.flat.empty());
  EXPECT_EQ(combine_positions(p, 1, 2), (std::vector<int64_t>{-1, -1}));
  // T = 0.
  p = plan_dispatch({}, 3, s);
  EXPECT_EQ(p.send_counts, (std::vector<int64_t>{0, 0, 0, 0}));
  EXPECT_TRUE(combine_positions(p, 0, 3).empty());
  // Invalid input.
  EXPECT_THROW(plan_dispatch({1, -1}, 2, s), InvalidInput);
  EXPECT_THROW(plan_dispatch({1, 2, 3}, 2, s), InvalidInput);
  DispatchPlan bad;
  bad.flat = {0, 0};
  EXPECT_THROW(combine_positions(bad, 1, 2), InvalidInput);
}

// ---- the call across ranks ----

const char* mode_name(ExpertParallelMode m) {
  return m == ExpertParallelMode::kReplicated ? "replicated" : "all_to_all";
}

// Every rank's output of expert_parallel_forward (rank order), each rank holding its shard.
std::vector<Tensor> run_parallel(int n, const std::string& backend, const ExpertsSpec& spec,
                                 const ExpertsWeights& w, const test::Routing& r,
                                 ExpertParallelMode mode) {
  auto comms = make_thread_group(n, std::chrono::seconds(60));
  std::vector<Tensor> outs(static_cast<size_t>(n));
  const auto errors = run_ranks(comms, [&](Communicator& c) {
    const ExpertShard shard = make_expert_shard(spec.num_experts, c.size(), c.rank());
    const Experts local(shard_experts_spec(spec, shard), shard_experts_weights(spec, w, shard));
    outs[size_t(c.rank())] = expert_parallel_forward(c, local, backend, shard, r.hidden,
                                                     r.top_k_index, r.top_k_weights, mode);
  });
  for (size_t i = 0; i < errors.size(); ++i)
    if (errors[i]) std::rethrow_exception(errors[i]);
  return outs;
}

void expect_matches_single_device(int n, const std::string& backend, const ExpertsSpec& spec,
                                  DType dt, int64_t T, int64_t k, test::RoutingCase rc,
                                  ExpertParallelMode mode, uint64_t seed,
                                  bool per_expert_weights = false) {
  const ExpertsWeights w = test::random_experts_weights(spec, dt, seed);
  const test::Routing r = test::random_routing(spec, T, k, dt, seed + 1, rc, per_expert_weights);
  const Tensor single = experts_forward(backend, spec, w, r.hidden, r.top_k_index, r.top_k_weights);
  const auto outs = run_parallel(n, backend, spec, w, r, mode);
  const std::string what = std::string("N=") + std::to_string(n) + " backend=" + backend +
                           " dtype=" + std::string(dtype_name(dt)) + " mode=" + mode_name(mode) +
                           " routing=" + test::routing_case_name(rc) + " T=" + std::to_string(T) +
                           " k=" + std::to_string(k) + " seed=" + std::to_string(seed);
  // Float32: rounding differences only; 16-bit: the experts tolerance.
  const double tol = dt == DType::kF32 ? 1e-6 : experts_tolerance(dt, std::max(spec.hidden, spec.intermediate));
  for (int q = 0; q < n; ++q) {
    const Tensor& out = outs[size_t(q)];
    ASSERT_EQ(out.shape(), (Shape{T, spec.hidden})) << what;
    ASSERT_EQ(out.dtype(), dt) << what;
    if (T > 0) EXPECT_LE(rel_l2_error(out, single), tol) << what << " rank " << q;
    // Every rank holds the same bits.
    EXPECT_EQ(std::memcmp(out.raw(), outs[0].raw(), out.nbytes()), 0) << what << " rank " << q;
  }
  // Against the float64 reference as every backend is checked.
  if (T > 0) {
    const Tensor ref = experts_reference_f64(spec, w, r.hidden, r.top_k_index, r.top_k_weights);
    EXPECT_LE(rel_l2_error(outs[0], ref),
              experts_tolerance(dt, std::max(spec.hidden, spec.intermediate)))
        << what;
  }
}

class ExpertParallelParity
    : public ::testing::TestWithParam<std::tuple<int, std::string, DType, ExpertParallelMode>> {};

TEST_P(ExpertParallelParity, MatchesSingleDevice) {
  const auto& [n, backend, dt, mode] = GetParam();
  const ExpertsSpec spec = test::make_experts_spec({true, false, false, true}, 12, 33, 20,
                                                   Activation::kSilu);
  uint64_t seed = 100 + uint64_t(n);
  expect_matches_single_device(n, backend, spec, dt, 13, 3, test::RoutingCase::kRandom, mode, seed++);
  expect_matches_single_device(n, backend, spec, dt, 7, 2, test::RoutingCase::kSentinels, mode, seed++);
  // Only the lower third of the experts: with 3 or 4 ranks, whole ranks receive nothing.
  expect_matches_single_device(n, backend, spec, dt, 9, 2, test::RoutingCase::kEmptyExperts, mode, seed++);
  expect_matches_single_device(n, backend, spec, dt, 5, 3, test::RoutingCase::kDuplicates, mode, seed++);
  expect_matches_single_device(n, backend, spec, dt, 2, 1, test::RoutingCase::kRandom, mode, seed++);
  expect_matches_single_device(n, backend, spec, dt, 0, 2, test::RoutingCase::kRandom, mode, seed++);
}

INSTANTIATE_TEST_SUITE_P(
    RanksBackendsDtypesModes, ExpertParallelParity,
    ::testing::Combine(::testing::Values(1, 2, 3, 4),
                       ::testing::Values("eager", "batched_mm", "grouped_mm"),
                       ::testing::Values(DType::kF32, DType::kBF16),
                       ::testing::Values(ExpertParallelMode::kReplicated,
                                         ExpertParallelMode::kAllToAll)),
    [](const auto& info) {
      return "n" + std::to_string(std::get<0>(info.param)) + "_" + std::get<1>(info.param) + "_" +
             std::string(dtype_name(std::get<2>(info.param))) + "_" +
             mode_name(std::get<3>(info.param));
    });

TEST(ExpertParallel, OtherLayoutsAndPerExpertRoutingWeights) {
  // Biases, transposed and interleaved layouts, gpt-oss's activation, [T, E] routing weights.
  for (const auto& l : test::all_experts_layouts())
    for (ExpertParallelMode mode : {ExpertParallelMode::kReplicated, ExpertParallelMode::kAllToAll}) {
      const ExpertsSpec spec = test::make_experts_spec(
          l, 8, 24, 16, l.gate ? Activation::kSwigluOai : Activation::kGeluTanh);
      SCOPED_TRACE(test::experts_layout_name(l));
      expect_matches_single_device(2, "grouped_mm", spec, DType::kF32, 11, 2,
                                   test::RoutingCase::kRandom, mode, 7, true);
      expect_matches_single_device(4, "eager", spec, DType::kBF16, 6, 3,
                                   test::RoutingCase::kEveryExpert, mode, 8);
    }
}

TEST(ExpertParallel, FixtureCasesOnTwoRanksMatchTransformers) {
  // The experts cases transformers recorded (experts_cases.safetensors, fp32) through both
  // modes on 2 ranks, each rank holding half of the fixture's experts.
  for (const std::string model : {"qwen2_moe", "qwen3_moe", "mixtral", "olmoe", "deepseek_v3",
                                  "gpt_oss"}) {
    const test::ExpertsFixture fx = test::load_experts_fixture(model);
    ASSERT_EQ(fx.spec.num_experts % 2, 0) << model;
    auto cases = SafetensorsFile::open(
        test::data_path("hf-tiny/" + model + "/experts_cases.safetensors"));
    for (int T : {1, 7, 64})
      for (ExpertParallelMode mode :
           {ExpertParallelMode::kReplicated, ExpertParallelMode::kAllToAll}) {
        const std::string p = "T" + std::to_string(T) + "_";
        test::Routing r{cases->get(p + "hidden"), cases->get(p + "top_k_index"),
                        cases->get(p + "top_k_weights")};
        const Tensor expected = cases->get(p + "out");
        for (const Tensor& out : run_parallel(2, "grouped_mm", fx.spec, fx.weights, r, mode))
          EXPECT_LE(rel_l2_error(out, expected), 1e-5)
              << model << " T=" << T << " mode=" << mode_name(mode);
      }
  }
}

// ---- failures ----

TEST(ExpertParallel, RanksThatDisagreeFailAlike) {
  const ExpertsSpec spec = test::make_experts_spec({true, false, false, true}, 4, 16, 8,
                                                   Activation::kSilu);
  const ExpertsWeights w = test::random_experts_weights(spec, DType::kF32, 1);
  auto comms = make_thread_group(2, std::chrono::seconds(60));
  const auto errors = run_ranks(comms, [&](Communicator& c) {
    const ExpertShard shard = make_expert_shard(4, 2, c.rank());
    const Experts local(shard_experts_spec(spec, shard), shard_experts_weights(spec, w, shard));
    const test::Routing r = test::random_routing(spec, c.rank() == 0 ? 5 : 6, 2, DType::kF32, 2,
                                                 test::RoutingCase::kRandom);
    expert_parallel_forward(c, local, "eager", shard, r.hidden, r.top_k_index, r.top_k_weights,
                            ExpertParallelMode::kAllToAll);
  });
  for (const auto& e : errors) {
    ASSERT_TRUE(e);
    try {
      std::rethrow_exception(e);
    } catch (const InvalidInput& x) {
      const std::string m = x.what();
      EXPECT_NE(m.find("rank 0 has hidden float32[5, 16]"), std::string::npos) << m;
      EXPECT_NE(m.find("rank 1 has hidden float32[6, 16]"), std::string::npos) << m;
    }
  }
}

TEST(ExpertParallel, ARankFailingBeforeTheCallFailsTheOthersFast) {
  const ExpertsSpec spec = test::make_experts_spec({true, false, false, true}, 6, 16, 8,
                                                   Activation::kSilu);
  const ExpertsWeights w = test::random_experts_weights(spec, DType::kF32, 1);
  const test::Routing r = test::random_routing(spec, 4, 2, DType::kF32, 2, test::RoutingCase::kRandom);
  for (ExpertParallelMode mode : {ExpertParallelMode::kReplicated, ExpertParallelMode::kAllToAll}) {
    auto comms = make_thread_group(3, std::chrono::milliseconds(300));
    const auto start = std::chrono::steady_clock::now();
    std::vector<std::exception_ptr> errors(3);
    std::vector<std::thread> threads;
    for (int q = 0; q < 3; ++q)
      threads.emplace_back([&, q] {
        Communicator& c = *comms[size_t(q)];
        try {
          // A shard that is wrong for this communicator: rank 1 fails at its boundary check,
          // before any collective, and does not abort: the others must time out, not hang.
          const ExpertShard shard = make_expert_shard(6, 3, q == 1 ? 0 : q);
          const Experts local(shard_experts_spec(spec, shard), shard_experts_weights(spec, w, shard));
          expert_parallel_forward(c, local, "batched_mm", shard, r.hidden, r.top_k_index,
                                  r.top_k_weights, mode);
        } catch (...) {
          errors[size_t(q)] = std::current_exception();
        }
      });
    for (auto& t : threads) t.join();
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
    EXPECT_THROW(std::rethrow_exception(errors[1]), InvalidInput);
    EXPECT_THROW(std::rethrow_exception(errors[0]), CommError);
    EXPECT_THROW(std::rethrow_exception(errors[2]), CommError);
  }
}

TEST(ExpertParallel, BoundaryErrors) {
  const ExpertsSpec spec = test::make_experts_spec({true, false, false, true}, 4, 16, 8,
                                                   Activation::kSilu);
  const ExpertsWeights w = test::random_experts_weights(spec, DType::kF32, 1);
  auto comms = make_thread_group(1);
  const ExpertShard shard = make_expert_shard(4, 1, 0);
  const Experts local(shard_experts_spec(spec, shard), shard_experts_weights(spec, w, shard));
  const test::Routing r = test::random_routing(spec, 3, 2, DType::kF32, 2, test::RoutingCase::kRandom);
  auto call = [&](const Tensor& h, const Tensor& ids, const Tensor& wt) {
    return expert_parallel_forward(*comms[0], local, "eager", shard, h, ids, wt,
                                   ExpertParallelMode::kAllToAll);
  };
  EXPECT_THROW(call(r.hidden.slice(1, 0, 8), r.top_k_index, r.top_k_weights), InvalidInput);
  EXPECT_THROW(call(r.hidden, Tensor::from_ints({0, 1, 2, -1, 0, 1}, {3, 2}), r.top_k_weights),
               InvalidInput);
  EXPECT_THROW(call(r.hidden, r.top_k_index, r.top_k_weights.slice(0, 0, 2)), InvalidInput);
  EXPECT_THROW(expert_parallel_forward(*comms[0], local, "eager", make_expert_shard(4, 2, 0),
                                       r.hidden, r.top_k_index, r.top_k_weights,
                                       ExpertParallelMode::kReplicated),
               InvalidInput);
  EXPECT_THROW(expert_parallel_forward(*comms[0], local, "no_such_backend", shard, r.hidden,
                                       r.top_k_index, r.top_k_weights,
                                       ExpertParallelMode::kReplicated),
               UnknownName);
}

}  // namespace
