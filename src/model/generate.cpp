// Generation: prefill, then one token per step with the KV cache, greedy or sampled, stopping at
// stop tokens or max_new_tokens. Decode steps run under the decode-stage experts policy
// (decode_stage_experts_implementation), restored by RAII however generation ends.
//
// Left-padded batches (an attention mask): every Step of the call, prefill and decode, carries
// the padding columns of each row, so that a row never reads its padding and its rope positions
// count from its first real token (transformers' position_ids = cumsum(mask) - 1); the returned
// sequences keep the padding where it was, as transformers' generate does.
//
// GenerationOptions::on_step is called from this host loop, which every device shares, right
// after the step's ids reach the host: streaming costs no extra sync.
//
// Sampling follows transformers' warper order: temperature, then top-k, then top-p, then a draw
// from the softmax. The random stream is moex's own (std::mt19937_64 seeded with `seed`), so a
// seed reproduces moex runs, not torch's.
#include <algorithm>
#include <chrono>
#include <climits>
#include <memory>
#include <cmath>
#include <optional>
#include <random>

#include "core/device_hooks.hpp"
#include "model/architecture.hpp"
#include "moex/error.hpp"

namespace moex {

namespace {

constexpr int64_t kPreallocatedNewTokens = 8192;

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

Tensor CausalLM::generate(const Tensor& input_ids, const GenerationOptions& options,
                          const Tensor& attention_mask) {
  validate_ids(input_ids);
  const std::vector<int64_t> pad = left_padding(input_ids, attention_mask);
  validate_options(options);
  const int64_t B = input_ids.size(0), T = input_ids.size(1);
  int64_t positions = 0;  // saturated: max_new_tokens may be any int64
  if (__builtin_add_overflow(T, options.max_new_tokens, &positions)) positions = INT64_MAX;
  if (!options.allow_beyond_max_positions)
    check_positions(positions, "a prompt of " + std::to_string(T) + " tokens + " +
                                   std::to_string(options.max_new_tokens) + " new tokens");
  const std::vector<int64_t> eos = options.eos_token_ids.value_or(eos_);
  std::vector<std::vector<int64_t>> seqs(static_cast<size_t>(B));
  const auto prompt = input_ids.to_int_vector();
  for (int64_t b = 0; b < B; ++b) seqs[size_t(b)].assign(prompt.begin() + b * T, prompt.begin() + (b + 1) * T);

  std::mt19937_64 rng(options.seed);
  const ops::SamplingSpec sampling{options.temperature, options.top_k, options.top_p};
  std::vector<int64_t> stop_token(size_t(B), -1);  // the stop token a finished sequence emitted
  // Every position this call feeds (the last new token is never fed back), allocated once, so
  // that the cache keeps fixed shapes while decoding; a very large max_new_tokens reserves only
  // kPreallocatedNewTokens up front (generation may stop early) and the cache doubles past it.
  const int64_t planned = std::min(std::max<int64_t>(0, options.max_new_tokens - 1), kPreallocatedNewTokens);
  model::KVCache cache(B, info_.num_layers, T + planned);
  using Clock = std::chrono::steady_clock;
  stats_ = GenerationStats{};
  stats_.batch = B;
  stats_.prompt_tokens = T;
  // Pack / allocate once, outside the timed stages, for both stages' backends (a decode backend
  // that cannot serve these experts is skipped here as it is below).
  auto tp = Clock::now();
  prepare_experts(impl_);
  if (options.max_new_tokens > 1) {
    try {
      prepare_experts(decode_stage_experts_implementation(impl_, info_.device, options.decode_switch));
    } catch (const Unsupported&) {
    }
  }
  auto t0 = Clock::now();
  stats_.prepare_seconds = std::chrono::duration<double>(t0 - tp).count();
  Tensor logits;
  if (options.max_new_tokens > 0) {
    model::Step step{B, T, 0};
    step.pad = pad;
    step.ids = prompt;
    logits = forward(step, cache, true);
  }
  // The prefill stage ends when its token is chosen: on a GPU the forward only enqueues work,
  // and the choice is what waits for it (time to first token).
  auto t1 = Clock::now();
  stats_.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();

  // The decode steps (one token per sequence) run under the decode-stage policy; the guard
  // restores the caller's map when this scope ends, normally or by an exception.
  std::optional<ScopedExpertsImplementation> decode_guard;
  // CUDA graph of one decode step: captured on the second decode step (the first warmed every
  // plan and workspace), replayed afterwards. It stays valid while the cache keeps its tensors
  // (the capacity planned above).
  //
  // The graph ends with the token choice, which feeds the chosen ids to the next step on the
  // device (ops::choose_and_feed: the step's mirror, the stop rule, the draws' seeds), so the loop
  // is a pipeline: replay n + 1 is enqueued before the host waits for the ids of replay n, and
  // the GPU runs step after step without waiting for the host (the host reads each step's ids
  // from page-locked memory one step behind; the only synchronisation per step is that wait).
  // When every row stops, the one replay enqueued ahead is discarded (it fed a column the cache
  // has; nothing reads it). Sampled draws take seeds drawn in order from `rng` ahead of time (a
  // copy), and `rng` skips the ones the device used when the pipeline ends: the tokens equal those
  // of direct steps, which draw one seed per step.
  const bool want_graph = options.cuda_graph && info_.device.is_cuda();
  bool graph_off = !want_graph;
  std::unique_ptr<detail::CapturedGraph> graph;
  model::Step graph_step{B, 1, T};
  Tensor graph_logits;
  ops::DeviceFeed feed;
  std::unique_ptr<detail::AsyncDownload> download;
  int64_t in_flight = 0;      // replays enqueued whose ids the host has not read (0, 1 or 2)
  int64_t device_draws = 0;   // seeds of `rng` the device used since the pipeline started
  // However the loop ends, no replay may still write into the cache, the logits or the slots
  // when they are freed (declared after them: destroyed first).
  struct Drain {
    std::unique_ptr<detail::AsyncDownload>& d;
    int64_t& in_flight;
    ~Drain() {
      if (d && in_flight > 0) try { d->drain(); } catch (...) {}
    }
  } drain{download, in_flight};
  auto filled = [&] {
    std::vector<int64_t> f;
    for (const auto& l : cache.layers) f.push_back(l.filled);
    return f;
  };
  auto capacity = [&] {
    int64_t c = INT64_MAX;
    for (const auto& l : cache.layers) c = std::min(c, l.capacity());
    return c;
  };
  // Enqueues the replay that feeds new token n (already in the mirror) and the download of the
  // token it chooses (n + 1) into slot (n + 1) % 2.
  auto launch = [&](int64_t n_fed) {
    graph->replay();
    ++stats_.graph_replays;
    for (auto& l : cache.layers) ++l.filled;
    download->enqueue(feed.out, int((n_fed + 1) % 2));
    ++in_flight;
  };
  auto leave_pipeline = [&] {
    if (options.do_sample) rng.discard(static_cast<unsigned long long>(device_draws));
    device_draws = 0;
  };
  const int64_t max_new = options.max_new_tokens;
  for (int64_t n = 0; n < max_new; ++n) {
    std::vector<int64_t> nonfinite, next;
    if (in_flight > 0) {
      // Token n was chosen on the device by the replay that fed token n - 1. The replay that
      // feeds it goes first, when a token n + 1 will be wanted and the cache has its column.
      if (n + 1 < max_new && T + n + 1 <= capacity()) launch(n);
      const auto* r = static_cast<const int64_t*>(download->wait(int(n % 2)));
      --in_flight;
      ++device_draws;
      next.assign(r, r + B);
      nonfinite.assign(r + B, r + 2 * B);
    } else {
      // Non-finite logits would pick garbage tokens silently. On the host the check is one pass
      // over B x V floats (naming the first value); on a GPU the token choice counts them in its
      // pass and the counts come back with the ids (no extra copy or sync).
      if (info_.device.host_accessible() && logits.dtype() == DType::kF32)
        check_finite(logits, "at new token " + std::to_string(n));
      // One choice for every row (on the model's device; the ids come back to the host).
      next = ops::choose_tokens(logits, options.do_sample ? &sampling : nullptr, rng,
                                info_.device.host_accessible() ? nullptr : &nonfinite);
    }
    for (size_t b = 0; b < nonfinite.size(); ++b)
      if (nonfinite[b] > 0)
        throw Error("the forward gave a non-finite logit (" + std::to_string(nonfinite[b]) +
                    " NaN or infinite values in row " + std::to_string(b) + ") at new token " +
                    std::to_string(n) + "; the checkpoint's weights or config values (rope, rms_norm_eps) overflow");
    if (n == 0) {
      t1 = Clock::now();
      stats_.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();
    }
    bool all_done = true;
    for (int64_t b = 0; b < B; ++b) {
      if (stop_token[size_t(b)] >= 0) {
        next[size_t(b)] = stop_token[size_t(b)];
        continue;
      }
      const int64_t tok = next[size_t(b)];
      if (std::find(eos.begin(), eos.end(), tok) != eos.end()) stop_token[size_t(b)] = tok;
      else all_done = false;
    }
    for (int64_t b = 0; b < B; ++b) seqs[size_t(b)].push_back(next[size_t(b)]);
    if (options.on_step) options.on_step(std::span<const int64_t>(next));
    if (all_done || n + 1 == max_new) break;
    if (in_flight > 0) continue;  // the step feeding token n is already enqueued
    if (!decode_guard) {
      // The switch is a speed policy, not the user's request: when a switched backend cannot
      // serve these experts (Unsupported), decoding keeps the caller's map instead of failing.
      try {
        decode_guard.emplace(*this, decode_stage_experts_implementation(impl_, info_.device, options.decode_switch));
      } catch (const Unsupported&) {
        decode_guard.emplace(*this, impl_);
      }
    }
    // New tokens extend every row at the same column; the left padding stays masked.
    model::Step step{B, 1, T + n};
    step.pad = pad;
    step.ids = next;
    const bool fits = T + n + 1 <= capacity();
    if (graph) {
      // Only a step the cache has no column for ends the pipeline here: the cache must grow, its
      // tensors move and the graph's addresses go stale. This step runs directly (and grows the
      // cache); the next one is captured again at the new capacity.
      graph.reset();
      graph_logits = Tensor();
      ++stats_.graph_captures_dropped;
      leave_pipeline();
    }
    if (!graph_off && n >= 1 && fits) {
      graph_step = step;
      ops::make_device_step(graph_step, info_.device);
      const std::vector<int64_t> before = filled();
      // The device's share of the loop: stop state, stop tokens, and one seed per replay this
      // capacity allows (drawn from a copy of rng; rng skips the used ones when the pipeline ends).
      std::vector<uint64_t> seeds;
      if (options.do_sample) {
        std::mt19937_64 ahead = rng;
        const int64_t replays = std::min(capacity() - T - 1, max_new - 2) - n + 1;
        for (int64_t i = 0; i < replays; ++i) seeds.push_back(ahead());
      }
      auto reset_feed = [&] { ops::make_device_feed(feed, stop_token, eos, seeds, info_.device); };
      reset_feed();
      try {
        // Warm run first (the step's temporaries then come from the graph's pool), rewound:
        // the capture writes the same cache column again and counts it once, from the same mirror
        // and feed (the warm run's choice moved both on).
        graph = detail::capture_graph(
            info_.device,
            [&] {
              graph_logits = forward(graph_step, cache, true);
              ops::choose_and_feed(graph_logits, options.do_sample ? &sampling : nullptr, graph_step, feed);
            },
            [&] {
              for (size_t l = 0; l < cache.layers.size(); ++l) cache.layers[l].filled = before[l];
              graph_logits = Tensor();
              ops::make_device_step(graph_step, info_.device);
              reset_feed();
            });
        stats_.graph = true;
      } catch (const std::exception& e) {
        for (size_t l = 0; l < cache.layers.size(); ++l) cache.layers[l].filled = before[l];
        graph_off = true;
        graph_logits = Tensor();
        stats_.graph_note = std::string("decode steps ran directly: capture failed: ") + e.what();
      }
      if (graph) {  // the capture recorded this step (and counted its cache column); run it
        if (!download) download = detail::make_async_download(info_.device, size_t(2 * B) * sizeof(int64_t), 2);
        for (size_t l = 0; l < cache.layers.size(); ++l) cache.layers[l].filled = before[l];
        launch(n);
        continue;
      }
    }
    logits = forward(step, cache, true);
  }
  if (in_flight > 0) {
    download->drain();
    in_flight = 0;
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
