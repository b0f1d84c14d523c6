// Generation: prefill, then one token per step with the KV cache, greedy or sampled, stopping at
// stop tokens or max_new_tokens. Decode steps run under the decode-stage experts policy
// (decode_stage_experts_implementation), restored by RAII however generation ends.
//
// Sampling follows transformers' warper order: temperature, then top-k, then top-p, then a draw
// from the softmax. The random stream is moex's own (std::mt19937_64 seeded with `seed`), so a
// seed reproduces moex runs, not torch's.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <optional>
#include <random>

#include "model/architecture.hpp"
#include "moex/error.hpp"

namespace moex {

namespace {

int64_t argmax(const float* l, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (l[i] > l[best]) best = i;
  return best;
}

int64_t sample(const float* logits, int64_t n, const GenerationOptions& o, std::mt19937_64& rng) {
  std::vector<double> l(logits, logits + n);
  for (auto& v : l) v /= double(o.temperature);
  if (o.top_k > 0 && o.top_k < n) {
    std::vector<double> sorted = l;
    std::nth_element(sorted.begin(), sorted.begin() + (o.top_k - 1), sorted.end(), std::greater<>());
    const double kth = sorted[size_t(o.top_k - 1)];
    for (auto& v : l)
      if (v < kth) v = -INFINITY;
  }
  const double mx = *std::max_element(l.begin(), l.end());
  std::vector<double> p(static_cast<size_t>(n));
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += (p[size_t(i)] = std::exp(l[size_t(i)] - mx));
  for (auto& v : p) v /= sum;
  if (o.top_p < 1.0f) {
    // Drop the least likely tokens whose cumulative mass (ascending) is <= 1 - top_p, keeping
    // at least the most likely one, as transformers' TopPLogitsWarper does.
    std::vector<int64_t> order(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return p[size_t(a)] < p[size_t(b)]; });
    double cum = 0;
    for (int64_t j = 0; j + 1 < n; ++j) {
      cum += p[size_t(order[size_t(j)])];
      if (cum <= 1.0 - double(o.top_p)) p[size_t(order[size_t(j)])] = 0;
    }
    sum = std::accumulate(p.begin(), p.end(), 0.0);
    for (auto& v : p) v /= sum;
  }
  const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
  double cum = 0;
  int64_t last_nonzero = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (p[size_t(i)] <= 0) continue;
    last_nonzero = i;
    cum += p[size_t(i)];
    if (u < cum) return i;
  }
  return last_nonzero;  // rounding left u just above the total
}

void validate_options(const GenerationOptions& o) {
  if (o.max_new_tokens < 0) throw InvalidInput("max_new_tokens must be >= 0, got " + std::to_string(o.max_new_tokens));
  if (!o.do_sample) return;
  if (!(o.temperature > 0.0f) || !std::isfinite(o.temperature))
    throw InvalidInput("temperature must be > 0, got " + std::to_string(o.temperature));
  if (o.top_k < 0) throw InvalidInput("top_k must be >= 0, got " + std::to_string(o.top_k));
  if (!(o.top_p > 0.0f && o.top_p <= 1.0f))
    throw InvalidInput("top_p must be in (0, 1], got " + std::to_string(o.top_p));
}

}  // namespace

Tensor CausalLM::generate(const Tensor& input_ids, const GenerationOptions& options) {
  validate_ids(input_ids);
  validate_options(options);
  const int64_t B = input_ids.size(0), T = input_ids.size(1), V = info_.vocab_size;
  const std::vector<int64_t> eos = options.eos_token_ids.value_or(eos_);
  std::vector<std::vector<int64_t>> seqs(static_cast<size_t>(B));
  const auto prompt = input_ids.to_int_vector();
  for (int64_t b = 0; b < B; ++b) seqs[size_t(b)].assign(prompt.begin() + b * T, prompt.begin() + (b + 1) * T);

  std::mt19937_64 rng(options.seed);
  std::vector<int64_t> stop_token(size_t(B), -1);  // the stop token a finished sequence emitted
  model::KVCache cache(B, info_.num_layers);
  using Clock = std::chrono::steady_clock;
  stats_ = GenerationStats{B, T, 0, 0.0, 0.0};
  // Pack / allocate once, outside the timed stages, for both stages' backends (a decode backend
  // that cannot serve these experts is skipped here as it is below).
  auto tp = Clock::now();
  prepare_experts(impl_);
  if (options.max_new_tokens > 1) {
    try {
      prepare_experts(decode_stage_experts_implementation(impl_, info_.device));
    } catch (const Unsupported&) {
    }
  }
  auto t0 = Clock::now();
  stats_.prepare_seconds = std::chrono::duration<double>(t0 - tp).count();
  Tensor logits;
  if (options.max_new_tokens > 0) logits = forward(prompt, model::Step{B, T, 0}, cache, true);
  auto t1 = Clock::now();
  stats_.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();

  // The decode steps (one token per sequence) run under the decode-stage policy; the guard
  // restores the caller's map when this scope ends, normally or by an exception.
  std::optional<ScopedExpertsImplementation> decode_guard;
  for (int64_t n = 0; n < options.max_new_tokens; ++n) {
    std::vector<int64_t> next(static_cast<size_t>(B));
    bool all_done = true;
    for (int64_t b = 0; b < B; ++b) {
      if (stop_token[size_t(b)] >= 0) {
        next[size_t(b)] = stop_token[size_t(b)];
        continue;
      }
      const float* row = logits.data<float>() + b * V;
      const int64_t tok = options.do_sample ? sample(row, V, options, rng) : argmax(row, V);
      next[size_t(b)] = tok;
      if (std::find(eos.begin(), eos.end(), tok) != eos.end()) stop_token[size_t(b)] = tok;
      else all_done = false;
    }
    for (int64_t b = 0; b < B; ++b) seqs[size_t(b)].push_back(next[size_t(b)]);
    if (all_done || n + 1 == options.max_new_tokens) break;
    if (!decode_guard) {
      // The switch is a speed policy, not the user's request: when a switched backend cannot
      // serve these experts (Unsupported), decoding keeps the caller's map instead of failing.
      try {
        decode_guard.emplace(*this, decode_stage_experts_implementation(impl_, info_.device));
      } catch (const Unsupported&) {
        decode_guard.emplace(*this, impl_);
      }
    }
    logits = forward(next, model::Step{B, 1, T + n}, cache, true);
  }

  const int64_t L = int64_t(seqs[0].size());
  stats_.new_tokens = L - T;
  stats_.decode_seconds = std::chrono::duration<double>(Clock::now() - t1).count();
  std::vector<int64_t> flat;
  flat.reserve(size_t(B * L));
  for (const auto& s : seqs) flat.insert(flat.end(), s.begin(), s.end());
  return Tensor::from_ints(flat, {B, L});
}

}  // namespace moex
