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
#include <iomanip>
#include <sstream>

#include "core/device_hooks.hpp"
#include "model/kept_decode_graph.hpp"
#include "moex/experts.hpp"
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
  using Clock = std::chrono::steady_clock;
  stats_ = GenerationStats{};
  stats_.batch = B;
  stats_.prompt_tokens = T;
  // Pack / allocate once, outside the timed stages, for both stages' backends. The decode
  // stage's map: the switch is a speed policy, not the user's request, so when a switched backend
  // cannot serve these experts (Unsupported) decoding keeps the caller's map.
  auto tp = Clock::now();
  prepare_experts(impl_);
  ExpertsImplementation decode_map = impl_;
  if (options.max_new_tokens > 1) {
    try {
      decode_map = decode_stage_experts_implementation(impl_, info_.device, options.decode_switch);
      prepare_experts(decode_map);
    } catch (const Unsupported& e) {
      decode_map = impl_;
      stats_.decode_switch_note = std::string("the decode-stage switch was not applied: ") + e.what();
    }
  }
  stats_.decode_experts_implementation = decode_map;

  // CUDA graph of one decode step, kept between calls with the cache it addresses
  // (detail::KeptDecodeGraph): a call with the same key whose prompt + new tokens fit that cache
  // replays it from its first decode step; otherwise the first decode step runs directly (it
  // warms plans and workspaces), the second is captured and replayed afterwards. It stays valid
  // while the cache keeps its tensors (the capacity planned above).
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
  std::unique_ptr<detail::KeptDecodeGraph>& kept = kept_decode_;
  std::string key;
  if (want_graph) {
    std::ostringstream k;
    k << std::setprecision(9) << "B=" << B << " padded=" << !pad.empty() << " sample=" << options.do_sample;
    if (options.do_sample) k << " t=" << options.temperature << " k=" << options.top_k << " p=" << options.top_p;
    k << " eos=";
    for (int64_t e : eos) k << e << ",";
    for (const auto& [sub, name] : decode_map) {
      k << " [" << sub << "]=" << name << "@";
      try {
        k << get_experts_backend(name).get();
      } catch (const std::exception&) {
        k << "?";
      }
    }
    key = k.str();
  }
  const bool reuse = want_graph && kept && kept->key == key && kept->graph &&
                     kept->capacity() >= T + planned;
  if (kept && want_graph && !reuse) kept.reset();  // frees its cache before a new one is made
  if (want_graph && !kept) kept = std::make_unique<detail::KeptDecodeGraph>(key, B, info_.num_layers, T + planned);
  // A call that ends by an exception drops the kept graph (whatever it left half done).
  struct DropOnThrow {
    std::unique_ptr<detail::KeptDecodeGraph>& s;
    bool done = false;
    ~DropOnThrow() {
      if (!done) s.reset();
    }
  } drop_on_throw{kept};
  std::optional<model::KVCache> local_cache;
  model::KVCache& cache = want_graph ? kept->cache : local_cache.emplace(B, info_.num_layers, T + planned);
  for (auto& l : cache.layers) l.filled = 0;

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

  // The decode steps (one token per sequence) run under the decode-stage map; the guard
  // restores the caller's map when this scope ends, normally or by an exception.
  std::optional<ScopedExpertsImplementation> decode_guard;
  bool graph_off = !want_graph;
  int64_t in_flight = 0;      // replays enqueued whose ids the host has not read (0, 1 or 2)
  int64_t device_draws = 0;   // seeds of `rng` the device used since the pipeline started
  // However the loop ends, no replay may still write into the cache, the logits or the slots
  // when they are freed (declared after them: destroyed first).
  struct Drain {
    std::unique_ptr<detail::KeptDecodeGraph>& s;
    int64_t& in_flight;
    ~Drain() {
      if (s && s->download && in_flight > 0) try { s->download->drain(); } catch (...) {}
    }
  } drain{kept, in_flight};
  auto filled = [&] {
    std::vector<int64_t> f;
    for (const auto& l : cache.layers) f.push_back(l.filled);
    return f;
  };
  auto capacity = [&] { return detail::cache_columns(cache); };
  // Enqueues the replay that feeds new token n (already in the mirror) and the download of the
  // token it chooses (n + 1) into slot (n + 1) % 2.
  auto launch = [&](int64_t n_fed) {
    before_step();
    kept->graph->replay();
    ++stats_.graph_replays;
    for (auto& l : cache.layers) ++l.filled;
    kept->download->enqueue(kept->feed.out, int((n_fed + 1) % 2));
    ++in_flight;
  };
  auto leave_pipeline = [&] {
    if (options.do_sample) rng.discard(static_cast<unsigned long long>(device_draws));
    device_draws = 0;
  };
  // Writes the state the graph's first replay of this call starts from: the step feeding new
  // token n (host ids `next`) and the feed (stop state, stop tokens, the seeds of the replays this
  // capacity allows, drawn from a copy of rng; a fixed count, since the graph bakes the buffer).
  auto start_state = [&](int64_t n, const std::vector<int64_t>& next) {
    auto& gs = kept->graph_step;
    gs.batch = B;
    gs.tokens = 1;
    gs.past = T + n;
    gs.pad = pad;
    gs.ids = next;
    ops::make_device_step(gs, info_.device);
    std::vector<uint64_t> seeds;
    if (options.do_sample) {
      std::mt19937_64 ahead = rng;
      const int64_t replays = std::min(capacity() - T - 1, options.max_new_tokens - 2) - n + 1;
      seeds.assign(size_t(std::max<int64_t>(capacity(), 1)), 0);
      for (int64_t i = 0; i < replays; ++i) seeds[size_t(i)] = ahead();
    }
    ops::make_device_feed(kept->feed, stop_token, eos, seeds, info_.device);
  };
  const int64_t max_new = options.max_new_tokens;
  for (int64_t n = 0; n < max_new; ++n) {
    std::vector<int64_t> nonfinite, next;
    if (in_flight > 0) {
      // Token n was chosen on the device by the replay that fed token n - 1. The replay that
      // feeds it goes first, when a token n + 1 will be wanted and the cache has its column.
      if (n + 1 < max_new && T + n + 1 <= capacity()) launch(n);
      const auto* r = static_cast<const int64_t*>(kept->download->wait(int(n % 2)));
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
    if (!decode_guard) decode_guard.emplace(*this, decode_map);
    // New tokens extend every row at the same column; the left padding stays masked.
    model::Step step{B, 1, T + n};
    step.pad = pad;
    step.ids = next;
    const bool fits = T + n + 1 <= capacity();
    if (n == 0 && reuse && fits) {
      // The graph of an earlier call: replayed from this first decode step.
      start_state(0, next);
      if (!kept->download)
        kept->download = detail::make_async_download(info_.device, size_t(2 * B) * sizeof(int64_t), 2);
      stats_.graph = true;
      stats_.graph_reused = true;
      launch(0);
      continue;
    }
    if (kept && kept->graph) {
      // Only a step the cache has no column for ends the pipeline here: the cache must grow, its
      // tensors move and the graph's addresses go stale. This step runs directly (and grows the
      // cache); the next one is captured again at the new capacity.
      kept->graph.reset();
      kept->graph_logits = Tensor();
      ++stats_.graph_captures_dropped;
      leave_pipeline();
    }
    if (!graph_off && n >= 1 && fits) {
      const std::vector<int64_t> before = filled();
      start_state(n, next);
      auto& gs = kept->graph_step;
      try {
        // Warm run first (the step's temporaries then come from the graph's pool), rewound:
        // the capture writes the same cache column again and counts it once, from the same mirror
        // and feed (the warm run's choice moved both on).
        kept->graph = detail::capture_graph(
            info_.device,
            [&] {
              kept->graph_logits = forward(gs, cache, true);
              ops::choose_and_feed(kept->graph_logits, options.do_sample ? &sampling : nullptr, gs, kept->feed);
            },
            [&] {
              for (size_t l = 0; l < cache.layers.size(); ++l) cache.layers[l].filled = before[l];
              kept->graph_logits = Tensor();
              start_state(n, next);
            });
        stats_.graph = true;
      } catch (const std::exception& e) {
        for (size_t l = 0; l < cache.layers.size(); ++l) cache.layers[l].filled = before[l];
        graph_off = true;
        kept->graph_logits = Tensor();
        stats_.graph_note = std::string("decode steps ran directly: capture failed: ") + e.what();
      }
      if (kept->graph) {  // the capture recorded this step (and counted its cache column); run it
        if (!kept->download)
          kept->download = detail::make_async_download(info_.device, size_t(2 * B) * sizeof(int64_t), 2);
        for (size_t l = 0; l < cache.layers.size(); ++l) cache.layers[l].filled = before[l];
        launch(n);
        continue;
      }
    }
    before_step();
    logits = forward(step, cache, true);
  }
  if (in_flight > 0) {
    kept->download->drain();
    in_flight = 0;
  }
  drop_on_throw.done = true;
  finish_call();

  const int64_t L = int64_t(seqs[0].size());
  stats_.new_tokens = L - T;
  stats_.decode_seconds = std::chrono::duration<double>(Clock::now() - t1).count();
  std::vector<int64_t> flat;
  flat.reserve(size_t(B * L));
  for (const auto& s : seqs) flat.insert(flat.end(), s.begin(), s.end());
  return Tensor::from_ints(flat, {B, L});
}

}  // namespace moex
