#include "cpu/experts_quant.hpp"

#include <omp.h>

#include <algorithm>
#include <cstring>

#include "core/activation.hpp"
#include "cpu/engine.hpp"
#include "moex/quant.hpp"

namespace moex::cpu {

// Chosen once per process from the CPU's features (engine.cpp reads them the same way).
kernels::BlockScaledFn block_scaled_kernel() {
  static const kernels::BlockScaledFn fn = detect_cpu_features().avx512bf16
                                               ? kernels::gemm_block_scaled_avx512bf16
                                           : detect_cpu_features().avx512
                                               ? kernels::gemm_block_scaled_avx512
                                           : detect_cpu_features().avx2_fma && detect_cpu_features().f16c
                                               ? kernels::gemm_block_scaled_avx2
                                               : kernels::gemm_block_scaled_portable;
  return fn;
}

namespace {

// Whether the kernel reads bf16 activation rows (QuantRows::b).
bool kernel_reads_bf16() { return block_scaled_kernel() == kernels::gemm_block_scaled_avx512bf16; }

kernels::BlockScaledArgs matrix_args(const ExpertsSpec& s, const Tensor& W, const Tensor& S,
                                     int64_t e, int64_t N, int64_t K, int64_t fused_rows) {
  kernels::BlockScaledArgs a;
  a.fp4 = s.quant.kind == QuantScheme::Kind::kFp4E2M1;
  a.row_bytes = a.fp4 ? K / 2 : K;
  a.k = K;
  a.w = static_cast<const uint8_t*>(W.raw()) + e * N * a.row_bytes;
  a.scale_dtype = S.dtype();
  a.scale_cols = S.size(2);
  a.scale = static_cast<const char*>(S.raw()) +
            size_t(e * S.size(1) * S.size(2)) * dtype_size(S.dtype());
  a.fused_rows = fused_rows;
  a.bn = s.quant.block_n;
  a.pair_from_rows = block_scaled_pair_from_rows(detect_cpu_features());
  return a;
}

}  // namespace

void QuantRows::resize(int64_t rows, int64_t k_, bool fp4_) {
  k = k_;
  fp4 = fp4_;
  nb = quant::ceil_div(k, quant::kActBlock);
  ld = nb * quant::kActBlock;
  q.resize(size_t(rows * ld));
  s.resize(size_t(rows * nb));
  b.resize(kernel_reads_bf16() ? size_t(rows * ld) : 0);
}

void QuantRows::set_row(int64_t r, const float* x) {
  uint8_t codes[quant::kActBlock];
  float* qr = q.data() + r * ld;
  const bool evens_odds = fp4 && b.empty();  // the float FP4 kernel's order
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t c0 = b * quant::kActBlock, len = std::min(quant::kActBlock, k - c0);
    quant::quantize_activation_row(x + c0, len, codes, s.data() + r * nb + b);
    float* dst = qr + c0;
    for (int64_t i = 0; i < quant::kActBlock; ++i) {
      // Float FP4 kernel: each 32 block as evens then odds (its nibble order); K is a multiple of 32.
      const int64_t src = !evens_odds ? i : (i / 32) * 32 + (i % 32 < 16 ? 2 * (i % 32) : 2 * (i % 32 - 16) + 1);
      dst[i] = src < len ? f8e4m3_to_float(codes[src]) : 0.f;
    }
  }
  if (!b.empty()) kernels::pack_activation_bf16(qr, ld, b.data() + r * ld);
}

std::unique_ptr<PreparedExperts> prepare_quantized_experts(const ExpertsWeights& w) {
  for (const Tensor* t : {&w.gate_up, &w.down})
    if (t->defined()) t->collapse_to_huge_pages();
  return nullptr;
}

kernels::BlockScaledArgs quant_gate_up(const ExpertsSpec& s, const ExpertsWeights& w, int64_t e) {
  const int64_t R = s.gate_up_rows();
  return matrix_args(s, w.gate_up, w.gate_up_scale, e, R, s.hidden, s.has_gate ? s.intermediate : R);
}

kernels::BlockScaledArgs quant_down(const ExpertsSpec& s, const ExpertsWeights& w, int64_t e) {
  return matrix_args(s, w.down, w.down_scale, e, s.hidden, s.intermediate, s.hidden);
}

void quant_linear(kernels::BlockScaledArgs W, const QuantRows& X, const int64_t* x_rows,
                  int64_t M, int64_t n0, int64_t n1, float* y, int64_t ldy) {
  W.xq = X.q.data();
  W.xb = X.b.empty() ? nullptr : X.b.data();
  W.xs = X.s.data();
  W.x_ld = X.ld;
  W.nb = X.nb;
  W.n0 = n0;
  W.n1 = n1;
  W.y = y;
  W.ldy = ldy;
  const kernels::BlockScaledFn fn = block_scaled_kernel();
  for (int64_t m0 = 0; m0 < M; m0 += 256) {  // int m per call; rows are independent
    W.x_rows = x_rows ? x_rows + m0 : nullptr;
    if (!x_rows) {
      W.xq = X.q.data() + m0 * X.ld, W.xs = X.s.data() + m0 * X.nb;
      if (W.xb) W.xb = X.b.data() + m0 * X.ld;
    }
    W.m = int(std::min<int64_t>(256, M - m0));
    W.y = y + m0 * ldy;
    fn(W);
  }
}

int64_t quant_rows_per_task(int64_t total_rows, int threads) {
  const int64_t per = total_rows / std::max<int64_t>(1, 4 * int64_t(threads));
  return std::clamp<int64_t>(per / 16 * 16, 16, 256);
}

void quantize_hidden(const ExpertsProblem& p, QuantRows& X) {
  const int64_t T = p.tokens(), H = p.spec->hidden;
  X.resize(T, H, p.spec->quant.kind == QuantScheme::Kind::kFp4E2M1);
  const size_t es = dtype_size(p.hidden.dtype());
  const char* hid = static_cast<const char*>(p.hidden.raw());
  std::vector<float> x;
#pragma omp parallel for schedule(static) firstprivate(x)
  for (int64_t t = 0; t < T; ++t) {
    x.resize(size_t(H));
    load_floats(hid + size_t(t * H) * es, p.hidden.dtype(), H, x.data());
    X.set_row(t, x.data());
  }
}

void quant_activate_row(const ExpertsSpec& s, const float* gu, DType act_dtype, QuantRows& h,
                        int64_t row, std::vector<float>& scratch) {
  scratch.resize(size_t(s.intermediate));
  detail::activate_row<float>(s, gu, scratch.data());
  round_floats(scratch.data(), s.intermediate, act_dtype);
  h.set_row(row, scratch.data());
}

void quant_expert_row(const ExpertsSpec& s, const ExpertsWeights& w, int64_t e, const QuantRows& X,
                      int64_t x_row, float* y, DType act_dtype, QuantRows& h,
                      std::vector<float>& scratch) {
  const int64_t R = s.gate_up_rows(), H = s.hidden;
  std::vector<float> gu(static_cast<size_t>(R));
  quant_linear(quant_gate_up(s, w, e), X, &x_row, 1, 0, R, gu.data(), R);
  h.resize(1, s.intermediate, X.fp4);
  quant_activate_row(s, gu.data(), act_dtype, h, 0, scratch);
  quant_linear(quant_down(s, w, e), h, nullptr, 1, 0, H, y, H);
}

namespace {

struct Task {
  int64_t e, n0, n1;
};

// (expert, output rows) tasks of a product with N output rows over the given experts.
std::vector<Task> make_tasks(const ExpertGroups& g, int64_t e0, int64_t e1, int64_t N) {
  std::vector<Task> tasks;
  int64_t active = 0;
  for (int64_t e = e0; e < e1; ++e) active += g.count(e) > 0;
  const int64_t step = std::min(N, quant_rows_per_task(active * N, omp_get_max_threads()));
  for (int64_t e = e0; e < e1; ++e)
    if (g.count(e) > 0)
      for (int64_t n0 = 0; n0 < N; n0 += step) tasks.push_back({e, n0, std::min(N, n0 + step)});
  return tasks;
}

}  // namespace

void quant_grouped_forward(const ExpertsProblem& p, Tensor& out, bool all_at_once) {
  const ExpertsSpec& s = *p.spec;
  const ExpertsWeights& w = *p.weights;
  const int64_t H = s.hidden, R = s.gate_up_rows();
  const DType act = p.hidden.dtype();
  RoutingView r(p);
  ExpertGroups g = group_by_expert(r);
  QuantRows X, hq;
  quantize_hidden(p, X);
  // Slot i of the grouped order (offsets[e] .. offsets[e + 1]) reads token pairs[i] / k.
  const int64_t G = int64_t(g.pairs.size());
  // Slot i's intermediate is row i of hq.
  std::vector<int64_t> token(static_cast<size_t>(G)), slot(static_cast<size_t>(G));
  for (int64_t i = 0; i < G; ++i) token[size_t(i)] = g.pairs[size_t(i)] / r.k, slot[size_t(i)] = i;
  std::vector<float> gu(static_cast<size_t>(G * R)), y(static_cast<size_t>(G * H));
  hq.resize(G, s.intermediate, X.fp4);
  auto run = [&](int64_t e0, int64_t e1) {
    const std::vector<Task> up_tasks = make_tasks(g, e0, e1, R);
#pragma omp parallel for schedule(dynamic, 1)
    for (size_t i = 0; i < up_tasks.size(); ++i) {
      const Task& t = up_tasks[i];
      const int64_t o = g.offsets[size_t(t.e)];
      quant_linear(quant_gate_up(s, w, t.e), X, token.data() + o, g.count(t.e), t.n0, t.n1,
                   gu.data() + o * R, R);
    }
    const int64_t s0 = g.offsets[size_t(e0)], s1 = g.offsets[size_t(e1)];
    std::vector<float> scratch;
#pragma omp parallel for schedule(static) firstprivate(scratch)
    for (int64_t i = s0; i < s1; ++i) quant_activate_row(s, gu.data() + i * R, act, hq, i, scratch);
    const std::vector<Task> down_tasks = make_tasks(g, e0, e1, H);
#pragma omp parallel for schedule(dynamic, 1)
    for (size_t i = 0; i < down_tasks.size(); ++i) {
      const Task& t = down_tasks[i];
      const int64_t o = g.offsets[size_t(t.e)];
      quant_linear(quant_down(s, w, t.e), hq, slot.data() + o, g.count(t.e), t.n0, t.n1, y.data() + o * H, H);
    }
  };
  if (all_at_once) {
    run(0, s.num_experts);
  } else {
    for (int64_t e = 0; e < s.num_experts; ++e)
      if (g.count(e) > 0) run(e, e + 1);
  }
  std::vector<float> pair_out(size_t(r.T * r.k * H), 0.f);
  for (int64_t i = 0; i < G; ++i)
    std::memcpy(pair_out.data() + g.pairs[size_t(i)] * H, y.data() + i * H, sizeof(float) * size_t(H));
  combine(r, pair_out.data(), H, out);
}

}  // namespace moex::cpu
