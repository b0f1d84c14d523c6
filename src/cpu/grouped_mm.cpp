// `grouped_mm` on CPU: sort (token, slot) pairs by expert, run each expert's tokens as one
// matrix product (weights read once per expert, not once per token), un-permute by writing each
// result to its pair's row, then combine. Experts are distributed over threads dynamically.
#include <vector>

#include "cpu/backends.hpp"
#include "cpu/experts_common.hpp"

namespace moex::cpu {
namespace {

class GroupedMmCpu final : public ExpertsBackend {
 public:
  BackendCaps caps() const override {
    return cpu_caps("tokens sorted by expert, one grouped product; the CPU default");
  }

  void forward(const ExpertsProblem& p, Tensor& out) const override {
    const ExpertsSpec& s = *p.spec;
    const int64_t H = s.hidden;
    RoutingView r(p);
    ExpertGroups g = group_by_expert(r);
    std::vector<float> pair_out(size_t(r.T * r.k * H), 0.f);
    const size_t es = dtype_size(p.hidden.dtype());
    const char* hid = static_cast<const char*>(p.hidden.raw());
#pragma omp parallel
    {
      std::vector<float> x, y, scratch;
#pragma omp for schedule(dynamic, 1)
      for (int64_t e = 0; e < s.num_experts; ++e) {
        const int64_t n = g.count(e);
        if (n == 0) continue;
        const int64_t* pairs = g.pairs.data() + g.offsets[size_t(e)];
        x.resize(size_t(n * H));
        y.resize(size_t(n * H));
        for (int64_t i = 0; i < n; ++i)
          load_floats(hid + size_t(pairs[i] / r.k * H) * es, p.hidden.dtype(), H, x.data() + i * H);
        expert_mlp_rows(s, *p.weights, e, x.data(), n, y.data(), p.hidden.dtype(), scratch);
        for (int64_t i = 0; i < n; ++i)
          std::copy(y.begin() + i * H, y.begin() + (i + 1) * H, pair_out.begin() + pairs[i] * H);
      }
    }
    combine(r, pair_out.data(), H, out);
  }
};

}  // namespace

std::shared_ptr<const ExpertsBackend> make_grouped_mm_backend() {
  return std::make_shared<GroupedMmCpu>();
}

}  // namespace moex::cpu
