// What generate() keeps between calls on a CUDA device: the decode step's captured graph and
// everything whose address the graph baked in (the KV cache, the step buffer, the token choice's
// feed, the logits), so that the next call that fits replays it from its first decode step
// instead of running that step directly and capturing again (~7.7 ms per call for the Qwen1.5-MoE
// shape on the H200, 6 % of a 64-token batch-1 decode).
//
// `key` names everything a capture fixes besides addresses: the batch size, whether rows are
// left-padded (the pad columns themselves live in the step buffer), greedy or the sampling
// values, the stop tokens, and the decode-stage experts map with the identity of each backend
// object (a backend registered again under the same name is another object). Prompt length and
// cache length are not in it: the kernels read them from the step buffer, and the cache only
// has to hold the new call's prompt + new tokens.
#pragma once

#include <algorithm>
#include <memory>
#include <string>

#include "core/device_hooks.hpp"
#include "model/layers.hpp"
#include "ops/ops.hpp"

namespace moex::detail {

// Columns every layer of `cache` holds (0 before a forward has made its tensors).
inline int64_t cache_columns(const model::KVCache& cache) {
  if (cache.layers.empty()) return 0;
  int64_t c = cache.layers.front().capacity();
  for (const auto& l : cache.layers) c = std::min(c, l.capacity());
  return c;
}

struct KeptDecodeGraph {
  KeptDecodeGraph(std::string k, int64_t batch, int64_t layers, int64_t capacity)
      : key(std::move(k)), cache(batch, layers, capacity), graph_step(batch, 1, 0) {}
  std::string key;
  model::KVCache cache;
  std::unique_ptr<CapturedGraph> graph;  // null until captured (or when capture failed)
  model::Step graph_step;                // its device buffer is what the graph reads
  Tensor graph_logits;
  ops::DeviceFeed feed;
  std::unique_ptr<AsyncDownload> download;
  int64_t capacity() const { return cache_columns(cache); }
};

}  // namespace moex::detail
