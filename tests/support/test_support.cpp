#include "support/test_support.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>

namespace moex::test {

static std::vector<float> uniform(size_t n, float a, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> d(-a, a);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

ExpertsWeights random_experts_weights(const ExpertsSpec& s, DType dtype, uint64_t seed) {
  std::mt19937_64 rng(seed);
  ExpertsWeights w;
  const int64_t R = s.gate_up_rows();
  auto gu = s.gate_up_shape(), dn = s.down_shape();
  w.gate_up = Tensor::from_floats(uniform(size_t(shape_numel(gu)), 1.f / std::sqrt(float(s.hidden)), rng), gu, dtype);
  w.down = Tensor::from_floats(uniform(size_t(shape_numel(dn)), 1.f / std::sqrt(float(s.intermediate)), rng), dn, dtype);
  if (s.has_bias) {
    w.gate_up_bias = Tensor::from_floats(uniform(size_t(s.num_experts * R), 0.5f, rng), {s.num_experts, R}, dtype);
    w.down_bias = Tensor::from_floats(uniform(size_t(s.num_experts * s.hidden), 0.5f, rng), {s.num_experts, s.hidden}, dtype);
  }
  return w;
}

std::string routing_case_name(RoutingCase c) {
  switch (c) {
    case RoutingCase::kRandom: return "random";
    case RoutingCase::kEveryExpert: return "every_expert";
    case RoutingCase::kEmptyExperts: return "empty_experts";
    case RoutingCase::kDuplicates: return "duplicates";
    case RoutingCase::kSentinels: return "sentinels";
  }
  return "?";
}

Routing random_routing(const ExpertsSpec& s, int64_t T, int64_t k, DType dtype, uint64_t seed,
                       RoutingCase c, bool per_expert_weights, DType index_dtype) {
  std::mt19937_64 rng(seed * 7919 + 17);
  const int64_t E = s.num_experts;
  Routing r;
  r.hidden = Tensor::from_floats(uniform(size_t(T * s.hidden), 1.f, rng), {T, s.hidden}, dtype);
  std::vector<int64_t> ids(static_cast<size_t>(T * k));
  std::vector<int64_t> perm(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    std::iota(perm.begin(), perm.end(), 0);
    int64_t pool = E;
    if (c == RoutingCase::kEmptyExperts) pool = std::max<int64_t>(1, E / 3);
    std::shuffle(perm.begin(), perm.begin() + pool, rng);
    for (int64_t j = 0; j < k; ++j) {
      int64_t id = perm[size_t(j % pool)];
      if (c == RoutingCase::kEveryExpert) id = (t * k + j) % E;
      if (c == RoutingCase::kDuplicates && j == 1) id = ids[size_t(t * k)];
      if (c == RoutingCase::kSentinels && rng() % 4 == 0) id = E + int64_t(rng() % 3);
      ids[size_t(t * k + j)] = id;
    }
  }
  r.top_k_index = Tensor::from_ints(ids, {T, k}, index_dtype);
  std::uniform_real_distribution<float> pos(0.05f, 1.f);
  int64_t cols = per_expert_weights ? E : k;
  std::vector<float> w(static_cast<size_t>(T * cols));
  for (auto& x : w) x = pos(rng);
  r.top_k_weights = Tensor::from_floats(w, {T, cols}, DType::kF32);
  return r;
}

std::string data_path(const std::string& relative) {
  return std::string(MOEX_TEST_DATA) + "/" + relative;
}

}  // namespace moex::test
