// Pieces every CPU experts backend shares: routing views, grouping (token, slot) pairs by
// expert, a portable strided linear kernel, and the deterministic combine.
//
// Determinism: each (token, slot) pair's expert output is computed into its own fp32 row of a
// [T*k, H] buffer, and combine() sums a token's k rows in slot order. How pairs were grouped or
// threaded cannot change the result.
#pragma once

#include <cstdint>
#include <vector>

#include "moex/experts.hpp"

namespace moex::cpu {

// id and routing weight of (token t, slot j).
struct RoutingView {
  explicit RoutingView(const ExpertsProblem& p);
  int64_t id(int64_t t, int64_t j) const {
    return idx64 ? idx64[t * k + j] : int64_t(idx32[t * k + j]);
  }
  float weight(int64_t t, int64_t j) const;
  int64_t T, k, E;
  const int64_t* idx64 = nullptr;
  const int32_t* idx32 = nullptr;
  const void* w = nullptr;
  DType w_dtype;
  bool per_expert;
};

// Pairs p = t*k + j grouped by expert id (ascending), pair order kept inside a group (counting
// sort: stable, O(T*k + E)). Sentinel pairs (id >= E) are left out.
struct ExpertGroups {
  std::vector<int64_t> offsets;  // E + 1 entries
  std::vector<int64_t> pairs;
  int64_t count(int64_t e) const { return offsets[size_t(e + 1)] - offsets[size_t(e)]; }
};
ExpertGroups group_by_expert(const RoutingView& r);

// The rows expert e computes: x = the hidden rows of its pairs as fp32, [count(e), H] (resized).
void gather_expert_rows(const ExpertsProblem& p, const RoutingView& r, const ExpertGroups& g,
                        int64_t e, std::vector<float>& x);
// And where they go: pair_out row of pair i of expert e = y row i (y: [count(e), H]).
void scatter_expert_rows(const ExpertGroups& g, int64_t e, const float* y, int64_t H,
                         float* pair_out);

// One expert's weight matrix as a strided view: W(n, c) = base[n*sn + c*sk], shape [N, K];
// per-expert weights keep gate_up's two halves apart: rows n >= split then start at `upper`
// (W(n, c) = upper[(n - split)*sn + c*sk]).
struct MatrixView {
  const void* base;
  DType dtype;
  int64_t N, K, sn, sk;
  const void* bias = nullptr;  // [N] or null
  const void* upper = nullptr;
  int64_t split = 0;
  // Element (n, 0).
  const char* row(int64_t n) const {
    const size_t es = dtype_size(dtype);
    return upper && n >= split ? static_cast<const char*>(upper) + size_t((n - split) * sn) * es
                               : static_cast<const char*>(base) + size_t(n * sn) * es;
  }
};
MatrixView gate_up_view(const ExpertsSpec& s, const ExpertsWeights& w, int64_t e);
MatrixView down_view(const ExpertsSpec& s, const ExpertsWeights& w, int64_t e);

// Y[m, n] = sum_c X[m, c] * W(n, c) + bias[n] for m < M, in fp32 (X rows of length K, Y rows of
// length N, both contiguous). Portable; used by the reference-style backends.
void linear_rows(const MatrixView& W, const float* X, int64_t M, float* Y);

void load_floats(const void* src, DType t, int64_t n, float* dst);
// Rounds in place to the values representable in `t` (bf16/f16); no-op for f32.
void round_floats(float* v, int64_t n, DType t);

// The expert MLP on M rows: X [M, H] fp32 -> Y [M, H] fp32 = down(act(gate_up(X))), intermediate
// rounded to `act_dtype`. `scratch` is resized as needed.
void expert_mlp_rows(const ExpertsSpec& s, const ExpertsWeights& w, int64_t e, const float* X,
                     int64_t M, float* Y, DType act_dtype, std::vector<float>& scratch);

// out[t] = sum_{j: id valid} weight(t, j) * pair_out[t*k + j], fp32 in slot order, one rounding.
void combine(const RoutingView& r, const float* pair_out, int64_t H, Tensor& out);

}  // namespace moex::cpu
