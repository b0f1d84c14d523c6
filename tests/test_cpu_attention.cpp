// Host attention (src/ops/cpu/attention*.cpp) against a float64 softmax attention written here,
// on ugly shapes: GQA groups of 1, 3, 4 and 16 heads, head widths 64, 80, 128 and MLA's 576/512
// with the values inside the keys, 1 to 600 tokens after 0 to 700 cached columns, sliding
// windows, sinks, left padding, float32 and bf16 activations. Then the properties the tiling
// must keep: a real row of a padded batch equals its sequence run alone bit for bit, results do
// not depend on the thread count, and the AVX-512 kernels agree with the portable ones.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "cpu/engine.hpp"
#include "ops/cpu/attention_kernels.hpp"
#include "ops/ops.hpp"
#include "support/test_support.hpp"

namespace moex::ops {
namespace {

struct Case {
  int64_t heads, kv_heads, dk, dv;
  bool v_from_k;
  int64_t batch, tokens, past, window;
  bool sinks, padded, bf16;
};

std::string case_str(const Case& c) {
  return std::to_string(c.heads) + "/" + std::to_string(c.kv_heads) + " heads, dk " + std::to_string(c.dk) +
         " dv " + std::to_string(c.dv) + (c.v_from_k ? " v_from_k" : "") + ", batch " + std::to_string(c.batch) +
         " tokens " + std::to_string(c.tokens) + " past " + std::to_string(c.past) + " window " +
         std::to_string(c.window) + (c.sinks ? " sinks" : "") + (c.padded ? " padded" : "") +
         (c.bf16 ? " bf16" : " f32");
}

// gtest would otherwise print the struct's bytes.
void PrintTo(const Case& c, std::ostream* os) { *os << case_str(c); }

std::vector<float> uniform(int64_t n, std::mt19937& rng, float a, bool bf16) {
  std::uniform_real_distribution<float> u(-a, a);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = bf16 ? round_bf16(u(rng)) : u(rng);
  return v;
}

// A filled cache and a query step of case c. Padding columns hold random values too: no real
// query may read them.
struct Problem {
  AttentionSpec spec;
  LayerKV kv;
  Step step;
  Tensor q;
};

Problem make_problem(const Case& c, uint64_t seed) {
  std::mt19937 rng{static_cast<unsigned>(seed)};
  Problem p;
  AttentionSpec& s = p.spec;
  s.heads = c.heads;
  s.kv_heads = c.kv_heads;
  s.head_dim_k = c.dk;
  s.head_dim_v = c.dv;
  s.v_from_k = c.v_from_k;
  s.scale = 1.0f / std::sqrt(float(c.dk));
  s.sliding_window = c.window;
  if (c.sinks) s.sinks = Tensor::from_floats(uniform(c.heads, rng, 2.0f, false), {c.heads});
  const int64_t cols = c.past + c.tokens, kd = c.kv_heads * c.dk, vd = c.kv_heads * c.dv;
  p.kv.capacity_hint = cols + 3;  // capacity above the filled length, as in generation
  std::vector<int64_t> pad;
  for (int64_t b = 0; b < c.batch; ++b) pad.push_back(c.padded ? (b * 37) % (cols) : 0);
  // Keys scaled by 3 give peaked softmaxes (large score range) next to flat ones.
  auto append = [&](int64_t n, int64_t at) {
    Step st{c.batch, n, at};
    st.pad = pad;
    Tensor k = Tensor::from_floats(uniform(c.batch * n * kd, rng, 3.0f, c.bf16), {c.batch * n, kd});
    Tensor v = c.v_from_k ? Tensor() : Tensor::from_floats(uniform(c.batch * n * vd, rng, 1.0f, c.bf16), {c.batch * n, vd});
    kv_append(p.kv, k, v, st);
  };
  if (c.past > 0) append(c.past, 0);
  append(c.tokens, c.past);
  p.step = Step{c.batch, c.tokens, c.past};
  p.step.pad = pad;
  p.q = Tensor::from_floats(uniform(c.batch * c.tokens * c.heads * c.dk, rng, 1.0f, c.bf16),
                            {c.batch * c.tokens, c.heads * c.dk});
  return p;
}

// Plain softmax attention in double over the keys each query sees (ops.hpp's contract without
// the bf16 rounding points).
std::vector<double> reference(const Problem& p) {
  const AttentionSpec& s = p.spec;
  const Step& st = p.step;
  const int64_t cap = p.kv.capacity(), kd = p.kv.k.size(2);
  const int64_t vd = s.v_from_k ? kd : p.kv.v.size(2), vh = s.v_from_k ? s.head_dim_k : s.head_dim_v;
  const float* K = p.kv.k.data<float>();
  const float* V = s.v_from_k ? K : p.kv.v.data<float>();
  const float* Q = p.q.data<float>();
  const std::vector<float> sinks = s.sinks.defined() ? s.sinks.to_float_vector() : std::vector<float>();
  std::vector<double> out(size_t(st.rows() * s.heads * s.head_dim_v), 0.0);
  for (int64_t r = 0; r < st.rows(); ++r)
    for (int64_t h = 0; h < s.heads; ++h) {
      const int64_t b = r / st.tokens, col = st.column(r), g = h / (s.heads / s.kv_heads);
      int64_t first = st.pad_of(b);
      if (s.sliding_window > 0) first = std::max(first, col - s.sliding_window + 1);
      if (first > col) continue;  // a padding query: zeros
      std::vector<double> sc;
      double mx = sinks.empty() ? -INFINITY : sinks[size_t(h)];
      for (int64_t j = first; j <= col; ++j) {
        double d = 0;
        for (int64_t i = 0; i < s.head_dim_k; ++i)
          d += double(Q[(r * s.heads + h) * s.head_dim_k + i]) * K[(b * cap + j) * kd + g * s.head_dim_k + i];
        sc.push_back(d * s.scale);
        mx = std::max(mx, sc.back());
      }
      double den = sinks.empty() ? 0.0 : std::exp(sinks[size_t(h)] - mx);
      for (double& x : sc) den += (x = std::exp(x - mx));
      double* o = out.data() + (r * s.heads + h) * s.head_dim_v;
      for (int64_t j = first; j <= col; ++j)
        for (int64_t i = 0; i < s.head_dim_v; ++i)
          o[i] += sc[size_t(j - first)] / den * V[(b * cap + j) * vd + g * vh + i];
    }
  return out;
}

double rel_error(const std::vector<float>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

std::vector<float> run(const Problem& p, bool bf16) {
  return attention(p.q, p.kv, p.step, p.spec, bf16 ? DType::kBF16 : DType::kF32).to_float_vector();
}

class CpuAttention : public ::testing::TestWithParam<Case> {};

TEST_P(CpuAttention, MatchesFloat64) {
  const Case c = GetParam();
  const uint64_t seed = 7 + uint64_t(c.tokens) * 1009 + uint64_t(c.past) * 17 + uint64_t(c.dk);
  const Problem p = make_problem(c, seed);
  const std::vector<float> got = run(p, c.bf16);
  const std::vector<double> want = reference(p);
  ASSERT_EQ(got.size(), want.size());
  // bf16 rounds p and the output (2^-9 relative each); float32 only accumulates.
  const double tol = c.bf16 ? 4.0 * std::ldexp(1.0, -8) : 2e-6;
  EXPECT_LE(rel_error(got, want), tol) << case_str(c) << ", seed " << seed;
  if (c.bf16)
    for (float x : got) ASSERT_EQ(x, round_bf16(x)) << case_str(c);
  // Padding queries read nothing and return zeros.
  for (int64_t r = 0; r < p.step.rows(); ++r)
    if (p.step.column(r) < p.step.pad_of(r / p.step.tokens))
      for (int64_t i = 0; i < c.heads * c.dv; ++i) ASSERT_EQ(got[size_t(r * c.heads * c.dv + i)], 0.0f);
}

// heads, kv_heads, dk, dv, v_from_k, batch, tokens, past, window, sinks, padded, bf16
INSTANTIATE_TEST_SUITE_P(
    Shapes, CpuAttention,
    ::testing::Values(Case{1, 1, 64, 64, false, 1, 1, 0, 0, false, false, false},
                      Case{1, 1, 64, 64, false, 2, 17, 5, 0, true, true, true},
                      Case{4, 1, 80, 80, false, 2, 3, 700, 0, false, true, false},
                      Case{4, 1, 80, 80, false, 1, 130, 0, 7, true, false, true},
                      Case{6, 2, 128, 128, false, 3, 17, 5, 7, false, true, false},
                      Case{6, 2, 128, 128, false, 2, 600, 0, 0, false, true, true},
                      Case{6, 2, 64, 64, false, 2, 1, 700, 7, true, true, false},
                      Case{16, 16, 128, 128, false, 2, 130, 5, 0, false, true, false},
                      Case{16, 16, 128, 128, false, 1, 600, 700, 0, true, false, true},
                      Case{16, 16, 128, 128, false, 3, 1, 700, 0, false, true, true},
                      Case{16, 1, 576, 512, true, 1, 1, 700, 0, false, false, true},
                      Case{16, 1, 576, 512, true, 2, 3, 5, 0, false, true, false},
                      Case{4, 1, 192, 128, false, 1, 130, 0, 0, false, false, false},
                      Case{6, 2, 80, 64, false, 2, 3, 700, 7, true, false, true}),
    [](const ::testing::TestParamInfo<Case>& i) { return "case" + std::to_string(i.index); });

// A real row of a left-padded batch computes what its sequence computes alone, bit for bit:
// prefill tiles and decode chunks are anchored at the row's first visible key. The decode steps
// also cross the two decode schedules: the batch (12 sequence x kv head pairs) runs whole pairs
// per thread, a sequence alone (4 pairs) splits them by key chunks.
TEST(CpuAttentionPadding, PaddedRowsMatchTheSequenceAlone) {
  for (const int64_t window : {int64_t(0), int64_t(7)})
    for (const auto& [tokens, past] : {std::pair<int64_t, int64_t>{600, 0}, {1, 1100}, {3, 700}, {130, 5}}) {
      Case c{8, 4, 80, 80, false, 3, tokens, past, window, true, true, true};
      const Problem batch = make_problem(c, 99);
      const std::vector<float> got = run(batch, true);
      const int64_t cols = past + tokens, od = c.heads * c.dv;
      for (int64_t b = 0; b < c.batch; ++b) {
        const int64_t pad = batch.step.pad_of(b);
        // The same sequence alone, unpadded, its columns shifted to the left.
        Problem one;
        one.spec = batch.spec;
        const int64_t n = cols - pad, kd = batch.kv.k.size(2), vd = batch.kv.v.size(2), cap = batch.kv.capacity();
        std::vector<float> k(static_cast<size_t>(n * kd)), v(static_cast<size_t>(n * vd));
        std::copy_n(batch.kv.k.data<float>() + (b * cap + pad) * kd, n * kd, k.begin());
        std::copy_n(batch.kv.v.data<float>() + (b * cap + pad) * vd, n * vd, v.begin());
        const int64_t real_tokens = std::min(tokens, n), real_past = n - real_tokens;
        if (real_past > 0)
          kv_append(one.kv, Tensor::from_floats(std::vector<float>(k.begin(), k.begin() + real_past * kd), {real_past, kd}),
                    Tensor::from_floats(std::vector<float>(v.begin(), v.begin() + real_past * vd), {real_past, vd}),
                    Step{1, real_past, 0});
        kv_append(one.kv, Tensor::from_floats(std::vector<float>(k.begin() + real_past * kd, k.end()), {real_tokens, kd}),
                  Tensor::from_floats(std::vector<float>(v.begin() + real_past * vd, v.end()), {real_tokens, vd}),
                  Step{1, real_tokens, real_past});
        const float* qb = batch.q.data<float>() + (b * tokens + tokens - real_tokens) * c.heads * c.dk;
        one.q = Tensor::from_floats(std::vector<float>(qb, qb + real_tokens * c.heads * c.dk), {real_tokens, c.heads * c.dk});
        one.step = Step{1, real_tokens, real_past};
        const std::vector<float> alone = run(one, true);
        for (int64_t t = 0; t < real_tokens; ++t)
          for (int64_t i = 0; i < od; ++i)
            ASSERT_EQ(got[size_t((b * tokens + tokens - real_tokens + t) * od + i)], alone[size_t(t * od + i)])
                << "sequence " << b << " pad " << pad << " token " << t << " col " << i << ", tokens " << tokens
                << " past " << past << " window " << window;
      }
    }
}

// The work split (prefill tiles, decode key chunks) changes with the thread count; the sums do not.
TEST(CpuAttentionThreads, OneAndTwoThreadsAgreeBitForBit) {
  const int saved = omp_get_max_threads();
  for (const Case& c : {Case{16, 16, 128, 128, false, 2, 300, 0, 0, false, true, true},
                        Case{16, 1, 576, 512, true, 1, 1, 2000, 0, false, false, true},
                        Case{6, 2, 80, 80, false, 2, 2, 1500, 7, true, true, false}}) {
    const Problem p = make_problem(c, 5);
    omp_set_num_threads(1);
    const std::vector<float> one = run(p, c.bf16);
    omp_set_num_threads(2);
    const std::vector<float> two = run(p, c.bf16);
    EXPECT_EQ(one, two) << case_str(c);
  }
  omp_set_num_threads(saved);
}

// The AVX-512 kernels against the portable ones on the same packed inputs.
TEST(CpuAttentionKernels, Avx512AgreesWithPortable) {
  if (!moex::cpu::detect_cpu_features().avx512) GTEST_SKIP() << "no AVX-512 on this CPU";
  const auto& a = cpu::attention_kernels_avx512();
  const auto& b = cpu::attention_kernels_portable();
  std::mt19937 rng{3};
  for (const int64_t dk : {int64_t(19), int64_t(64), int64_t(80), int64_t(576)})
    for (const int64_t nk : {int64_t(1), int64_t(17), int64_t(64)}) {
      const int64_t stride = dk + 5, rows = 7;
      const std::vector<float> k = uniform(nk * stride, rng, 1.0f, false);
      std::vector<float> kt_a(size_t(dk * cpu::kKeyBlock), -1.0f), kt_b(kt_a);
      a.pack_keys(k.data(), stride, nk, dk, kt_a.data());
      b.pack_keys(k.data(), stride, nk, dk, kt_b.data());
      ASSERT_EQ(kt_a, kt_b) << "dk " << dk << " nk " << nk;
      const std::vector<float> q = uniform(rows * dk, rng, 1.0f, false);
      std::vector<const float*> qp;
      for (int64_t r = 0; r < rows; ++r) qp.push_back(q.data() + r * dk);
      std::vector<float> sa(size_t(rows * cpu::kKeyBlock)), sb(sa);
      a.scores(qp.data(), rows, kt_a.data(), dk, 0.5f, sa.data(), cpu::kKeyBlock);
      b.scores(qp.data(), rows, kt_b.data(), dk, 0.5f, sb.data(), cpu::kKeyBlock);
      for (size_t i = 0; i < sa.size(); ++i) ASSERT_NEAR(sa[i], sb[i], 1e-5 * std::sqrt(double(dk))) << i;
      for (const bool bf16 : {false, true}) {
        std::vector<float> pa = sa, pb = sa;
        float ma = 0, mb = 0;
        const double da = a.softmax(pa.data(), nk, 0.25f, bf16, &ma);
        const double db = b.softmax(pb.data(), nk, 0.25f, bf16, &mb);
        EXPECT_EQ(ma, mb);
        EXPECT_EQ(pa, pb) << "exp differs from std::exp, nk " << nk;  // both correctly rounded
        EXPECT_NEAR(da, db, 1e-12 * da);
      }
      // Values are the keys; rows of p are the scores rows, several per call.
      const int64_t dv = dk;
      std::vector<float> acc_a(size_t(rows * dv), 0.5f), acc_b(acc_a);
      a.pv(sa.data(), cpu::kKeyBlock, rows, nk, k.data(), stride, dv, acc_a.data(), dv);
      b.pv(sa.data(), cpu::kKeyBlock, rows, nk, k.data(), stride, dv, acc_b.data(), dv);
      for (size_t i = 0; i < acc_a.size(); ++i)
        ASSERT_NEAR(acc_a[i], acc_b[i], 1e-6 * nk * (1 + std::abs(acc_b[i]))) << i;
      // A row's sums do not depend on the rows it shares a call with.
      std::vector<float> acc_one(size_t(dv), 0.5f);
      a.pv(sa.data() + 3 * cpu::kKeyBlock, cpu::kKeyBlock, 1, nk, k.data(), stride, dv, acc_one.data(), dv);
      ASSERT_TRUE(std::equal(acc_one.begin(), acc_one.end(), acc_a.begin() + 3 * dv));
    }
}

}  // namespace
}  // namespace moex::ops
