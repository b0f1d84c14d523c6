// Causal attention over the KV cache (ops.hpp). The sdpa arithmetic (eager_rounding off) runs
// here, tiled; transformers' eager rounding runs in attention_eager.cpp.
//
// Two passes per tile of query rows: all query heads of a GQA group and a run of tokens of one
// sequence share one kv head, so each packed key block (attention_kernels.hpp) serves every row of
// the tile. Pass one computes the scores of every key the tile can see, then each row takes its
// maximum, exp and double denominator over exactly its visible keys; pass two accumulates p.v
// block by block, so a block of values is read once per tile while it sits in L1.
//
// What a row computes depends only on its query, its visible keys [first, first + n) and the spec,
// never on the tile, the padding or the thread count, so a real row of a left-padded batch matches
// its sequence run alone bit for bit:
//   - a score is one dot product in a fixed order (attention_kernels.hpp);
//   - the denominator sums e_j in lanes of j - first (attention_kernels.hpp), the sink's term last;
//   - p.v is summed over chunks of kChunkKeys keys counted from `first`, each from zero in key
//     order, and the chunks are added in order. Decode steps compute the chunks in parallel
//     (few rows, long caches); prefill tiles add them as they go: the same sums either way.
#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "core/parallel_errors.hpp"
#include "ops/cpu/attention_eager.hpp"
#include "ops/cpu/attention_kernels.hpp"
#include "ops/cpu/cpu_ops.hpp"

namespace moex::ops::cpu {
namespace {

constexpr int64_t kChunkKeys = 512;  // keys per p.v partial sum; a multiple of kKeyBlock
// Prefill tile: about this many query rows (tokens x group heads). The scores of a tile take
// rows x visible keys floats; 64 rows over 2048 keys is 512 KiB, inside L2.
constexpr int64_t kTileRows = 64;
// Steps with at most this many tokens and fewer than kSplitMaxPairs (sequence, kv head) pairs
// split each pair by key chunks across threads; with more pairs, whole pairs keep the threads
// busy and the split's three extra barriers only cost (a descheduled thread on a shared machine
// holds each one for a time slice). Either way the sums are the same.
constexpr int64_t kSplitMaxTokens = 4;
constexpr int64_t kSplitMaxPairs = 8;

struct Geometry {
  const float *q, *k, *v;
  float* o;
  int64_t qd, od, kd, vd, cap, group, dk, dv, v_head;
  float scale;
  bool bf16;
};

struct Row {
  const float* q;
  float* o;
  int64_t first = 0, n = 0;  // visible cache columns [first, first + n); n <= 0: a padding query
  float sink = -INFINITY;
};

// Tokens [t0, t1) of sequence b with every query head of kv head g, token-major.
struct Tile {
  int64_t b, g, t0, t1;
  std::vector<Row> rows;
  int64_t kstart = 0, kend = 0;  // union of the rows' visible columns
  int64_t s_stride() const { return (kend - kstart + kKeyBlock - 1) / kKeyBlock * kKeyBlock; }
};

void fill_tile(Tile& t, const Geometry& g, const Step& step, const AttentionSpec& spec,
               const std::vector<float>& sinks) {
  t.rows.clear();
  t.kstart = INT64_MAX;
  t.kend = 0;
  for (int64_t tok = t.t0; tok < t.t1; ++tok) {
    const int64_t r = t.b * step.tokens + tok, col = step.column(r);
    // Causal up to the query's own column, never a padding column, and within the sliding window
    // counted in columns (transformers masks by cache position).
    int64_t first = step.pad_of(t.b);
    if (spec.sliding_window > 0) first = std::max(first, col - spec.sliding_window + 1);
    for (int64_t hh = 0; hh < g.group; ++hh) {
      const int64_t h = t.g * g.group + hh;
      Row row{g.q + r * g.qd + h * g.dk, g.o + r * g.od + h * g.dv, first, col + 1 - first,
              sinks.empty() ? -INFINITY : sinks[size_t(h)]};
      if (row.n > 0) {
        t.kstart = std::min(t.kstart, first);
        t.kend = std::max(t.kend, col + 1);
      }
      t.rows.push_back(row);
    }
  }
  if (t.kend == 0) t.kstart = 0;
}

const float* keys_of(const Geometry& g, const Tile& t) { return g.k + t.b * g.cap * g.kd + t.g * g.dk; }
const float* values_of(const Geometry& g, const Tile& t) { return g.v + t.b * g.cap * g.vd + t.g * g.v_head; }

// Whether row r reads any of the cache columns [k0, k1).
bool reads(const Row& r, int64_t k0, int64_t k1) { return r.n > 0 && r.first < k1 && r.first + r.n > k0; }

// Scores of the tile's rows against cache columns [k0, k1) (whole key blocks from kstart). Per
// block, only the run of rows that read it (the rows' ranges move right with the token) is
// computed: a causal tile skips its upper triangle, a windowed one its lower.
void tile_scores(const AttentionKernels& kern, const Geometry& g, const Tile& t, int64_t k0, int64_t k1,
                 std::vector<const float*>& qp, float* kt, float* s) {
  qp.clear();
  for (const Row& r : t.rows) qp.push_back(r.q);
  const float* keys = keys_of(g, t);
  const int64_t stride = t.s_stride(), nr = int64_t(t.rows.size());
  for (int64_t c = k0; c < k1; c += kKeyBlock) {
    const int64_t nk = std::min(kKeyBlock, k1 - c);
    int64_t i0 = 0, i1 = nr;
    while (i0 < nr && !reads(t.rows[size_t(i0)], c, c + nk)) ++i0;
    while (i1 > i0 && !reads(t.rows[size_t(i1 - 1)], c, c + nk)) --i1;
    if (i0 == i1) continue;
    kern.pack_keys(keys + c * g.kd, g.kd, nk, g.dk, kt);
    kern.scores(qp.data() + i0, i1 - i0, kt, g.dk, g.scale, s + i0 * stride + (c - t.kstart), stride);
  }
}

// Softmax of row i in place; returns the denominator.
double row_softmax(const AttentionKernels& kern, const Geometry& g, const Tile& t, size_t i, float* s) {
  const Row& r = t.rows[i];
  float m = 0;
  float* sr = s + int64_t(i) * t.s_stride() + (r.first - t.kstart);
  const double sum = kern.softmax(sr, r.n, r.sink, g.bf16, &m);
  return r.sink == -INFINITY ? sum : sum + std::exp(double(r.sink - m));
}

// p.v of every row over its chunk-c columns that fall in [k0, k1), added to acc (row i at
// acc + i * dv) in key order, one value block at a time; consecutive rows with the same columns
// in a block share one kernel call (and the values it loads).
void tile_pv(const AttentionKernels& kern, const Geometry& g, const Tile& t, int64_t c, int64_t k0,
             int64_t k1, const float* p, float* acc) {
  const float* vals = values_of(g, t);
  const int64_t stride = t.s_stride(), nr = int64_t(t.rows.size());
  auto segment = [&](int64_t i, int64_t b0, int64_t b1) {
    const Row& r = t.rows[size_t(i)];
    const int64_t lo = std::max({b0, r.first + c * kChunkKeys, r.first});
    const int64_t hi = std::min({b1, r.first + (c + 1) * kChunkKeys, r.first + r.n});
    return std::pair<int64_t, int64_t>{lo, hi};
  };
  for (int64_t b0 = k0; b0 < k1; b0 += kKeyBlock) {
    const int64_t b1 = std::min(b0 + kKeyBlock, k1);
    for (int64_t i = 0; i < nr;) {
      const auto [lo, hi] = segment(i, b0, b1);
      int64_t e = i + 1;
      while (e < nr && segment(e, b0, b1) == std::pair<int64_t, int64_t>{lo, hi}) ++e;
      if (lo < hi)
        kern.pv(p + i * stride + (lo - t.kstart), stride, e - i, hi - lo, vals + lo * g.vd, g.vd, g.dv,
                acc + i * g.dv, g.dv);
      i = e;
    }
  }
}

int64_t chunks_of(int64_t n) { return n <= 0 ? 0 : (n + kChunkKeys - 1) / kChunkKeys; }

void write_row(const Geometry& g, const Row& r, const float* acc, double denom, DType act) {
  if (r.n <= 0) {
    // A padding query sees no key: zeros (no real query reads its keys or values).
    std::fill(r.o, r.o + g.dv, 0.0f);
    return;
  }
  const float d = float(denom);
  for (int64_t i = 0; i < g.dv; ++i) r.o[i] = round_act(acc[i] / d, act);
}

struct Scratch {
  std::vector<float> kt, s, acc, part;
  std::vector<double> denom;
  std::vector<const float*> qp;
};

// Prefill: one tile from scores to output on one thread.
void run_tile(const AttentionKernels& kern, const Geometry& g, Tile& t, DType act, Scratch& sc) {
  const int64_t nr = int64_t(t.rows.size()), stride = t.s_stride();
  sc.s.resize(size_t(nr * stride));
  tile_scores(kern, g, t, t.kstart, t.kend, sc.qp, sc.kt.data(), sc.s.data());
  sc.denom.assign(size_t(nr), 0.0);
  int64_t chunks = 0;
  for (size_t i = 0; i < t.rows.size(); ++i) {
    if (t.rows[i].n <= 0) continue;
    sc.denom[i] = row_softmax(kern, g, t, i, sc.s.data());
    chunks = std::max(chunks, chunks_of(t.rows[i].n));
  }
  sc.acc.assign(size_t(nr * g.dv), 0.0f);
  sc.part.resize(size_t(nr * g.dv));
  for (int64_t c = 0; c < chunks; ++c) {
    // Chunk 0 sums straight into the total; later chunks from zero, then added in order.
    float* dst = c == 0 ? sc.acc.data() : sc.part.data();
    if (c > 0) std::fill(sc.part.begin(), sc.part.end(), 0.0f);
    // A row's chunk c starts at or after kstart + c * kChunkKeys, a key block boundary.
    tile_pv(kern, g, t, c, t.kstart + c * kChunkKeys, t.kend, sc.s.data(), dst);
    if (c > 0)
      for (size_t i = 0; i < sc.acc.size(); ++i) sc.acc[i] += sc.part[i];
  }
  for (size_t i = 0; i < t.rows.size(); ++i)
    write_row(g, t.rows[i], sc.acc.data() + int64_t(i) * g.dv, sc.denom[i], act);
}

void attention_prefill(const AttentionKernels& kern, const Geometry& g, const Step& step,
                       const AttentionSpec& spec, const std::vector<float>& sinks, DType act,
                       bool parallel) {
  const int64_t tile_tokens = std::max<int64_t>(1, kTileRows / g.group);
  const int64_t tiles = (step.tokens + tile_tokens - 1) / tile_tokens;
  const int64_t items = step.batch * spec.kv_heads * tiles;
  // Tiles grow their scratch vectors: an allocation failure must not leave the region.
  ParallelErrors errors;
#pragma omp parallel if (parallel)
  {
    Scratch sc;
    Tile t;
    errors.run([&] { sc.kt.resize(size_t(g.dk * kKeyBlock)); });
    // Dynamic: causal tiles differ in cost; which thread runs a tile does not change its result.
#pragma omp for schedule(dynamic)
    for (int64_t it = 0; it < items; ++it) {
      errors.run([&] {
        t.b = it / (spec.kv_heads * tiles);
        t.g = it / tiles % spec.kv_heads;
        // Late tokens first: they see the most keys.
        t.t0 = (tiles - 1 - it % tiles) * tile_tokens;
        t.t1 = std::min(step.tokens, t.t0 + tile_tokens);
        fill_tile(t, g, step, spec, sinks);
        run_tile(kern, g, t, act, sc);
      });
    }
  }
  errors.rethrow();
}

// Decode with few (sequence, kv head) pairs: every pair is one tile of all the step's tokens;
// scores and p.v are split by key chunks across threads, the p.v chunks added in order at the end.
void attention_decode(const AttentionKernels& kern, const Geometry& g, const Step& step,
                      const AttentionSpec& spec, const std::vector<float>& sinks, DType act,
                      bool parallel) {
  const int64_t pairs = step.batch * spec.kv_heads;
  std::vector<Tile> tiles(static_cast<size_t>(pairs));
  int64_t stride = 0, chunks = 0, span_chunks = 0;
  for (int64_t i = 0; i < pairs; ++i) {
    Tile& t = tiles[size_t(i)];
    t.b = i / spec.kv_heads;
    t.g = i % spec.kv_heads;
    t.t0 = 0;
    t.t1 = step.tokens;
    fill_tile(t, g, step, spec, sinks);
    stride = std::max(stride, t.s_stride());
    span_chunks = std::max(span_chunks, chunks_of(t.kend - t.kstart));
    for (const Row& r : t.rows) chunks = std::max(chunks, chunks_of(r.n));
  }
  const int64_t nr = step.tokens * g.group;
  std::vector<float> s(size_t(pairs * nr * stride));
  std::vector<float> part(size_t(pairs * chunks * nr * g.dv));
  std::vector<double> denom(size_t(pairs * nr));
  // Each tile's scores live at s + pair * nr * stride with its own row stride t.s_stride().
  // The scores pass grows per-thread vectors: an allocation failure must not leave the region.
  ParallelErrors errors;
#pragma omp parallel if (parallel)
  {
    std::vector<float> kt;
    std::vector<const float*> qp;
    errors.run([&] { kt.resize(size_t(g.dk * kKeyBlock)); });
#pragma omp for schedule(dynamic)
    for (int64_t it = 0; it < pairs * span_chunks; ++it) {
      const Tile& t = tiles[size_t(it / span_chunks)];
      const int64_t k0 = t.kstart + it % span_chunks * kChunkKeys;
      if (k0 < t.kend)
        errors.run([&] {
          tile_scores(kern, g, t, k0, std::min(t.kend, k0 + kChunkKeys), qp, kt.data(),
                      s.data() + it / span_chunks * nr * stride);
        });
    }
#pragma omp for schedule(static)
    for (int64_t it = 0; it < pairs * nr; ++it) {
      const Tile& t = tiles[size_t(it / nr)];
      if (t.rows[size_t(it % nr)].n > 0)
        denom[size_t(it)] = row_softmax(kern, g, t, size_t(it % nr), s.data() + it / nr * nr * stride);
    }
#pragma omp for schedule(dynamic)
    for (int64_t it = 0; it < pairs * chunks; ++it) {
      const Tile& t = tiles[size_t(it / chunks)];
      const int64_t c = it % chunks;
      float* acc = part.data() + it * nr * g.dv;
      std::fill(acc, acc + nr * g.dv, 0.0f);
      tile_pv(kern, g, t, c, t.kstart + c * kChunkKeys, t.kend, s.data() + it / chunks * nr * stride, acc);
    }
#pragma omp for schedule(static)
    for (int64_t it = 0; it < pairs * nr; ++it) {
      const Tile& t = tiles[size_t(it / nr)];
      const Row& r = t.rows[size_t(it % nr)];
      float* acc = part.data() + (it / nr * chunks * nr + it % nr) * g.dv;
      for (int64_t c = 1; c < chunks_of(r.n); ++c) {
        const float* p = part.data() + ((it / nr * chunks + c) * nr + it % nr) * g.dv;
        for (int64_t i = 0; i < g.dv; ++i) acc[i] += p[i];
      }
      write_row(g, r, acc, denom[size_t(it)], act);
    }
  }
  errors.rethrow();
}

}  // namespace

Tensor attention(const Tensor& q, const LayerKV& kv, const Step& step, const AttentionSpec& spec, DType act) {
  if (spec.eager_rounding) return attention_eager(q, kv, step, spec, act);
  Tensor out = Tensor::empty({step.rows(), spec.heads * spec.head_dim_v}, DType::kF32);
  if (step.rows() == 0) return out;
  Geometry g;
  g.q = q.data<float>();
  g.k = kv.k.data<float>();
  // v_from_k: the values are the leading head_dim_v columns of each kv head's key slice.
  g.v = spec.v_from_k ? g.k : kv.v.data<float>();
  g.o = out.data<float>();
  g.qd = spec.heads * spec.head_dim_k;
  g.od = spec.heads * spec.head_dim_v;
  g.kd = kv.k.size(2);
  g.vd = spec.v_from_k ? g.kd : kv.v.size(2);
  g.cap = kv.capacity();
  g.group = spec.heads / spec.kv_heads;
  g.dk = spec.head_dim_k;
  g.dv = spec.head_dim_v;
  g.v_head = spec.v_from_k ? spec.head_dim_k : spec.head_dim_v;  // kv head stride in V
  g.scale = spec.scale;
  g.bf16 = act == DType::kBF16;
  std::vector<float> sinks;
  if (spec.sinks.defined()) sinks = spec.sinks.to_float_vector();
  const int64_t work = step.rows() * spec.heads * (step.past + step.tokens) * (spec.head_dim_k + spec.head_dim_v);
  const AttentionKernels& kern = attention_kernels();
  if (step.tokens <= kSplitMaxTokens && step.batch * spec.kv_heads < kSplitMaxPairs)
    attention_decode(kern, g, step, spec, sinks, act, work >= kParallelWork);
  else
    attention_prefill(kern, g, step, spec, sinks, act, work >= kParallelWork);
  return out;
}

}  // namespace moex::ops::cpu
