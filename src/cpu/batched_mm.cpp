// `batched_mm` on CPU: one product per (token, slot) pair, reading that pair's expert weights
// straight from the weight tensor (no gathered copies). Pairs are independent, so threads take
// them dynamically. Best when there are very few tokens.
#include <vector>

#include "cpu/backends.hpp"
#include "cpu/experts_common.hpp"
#include "cpu/experts_quant.hpp"

namespace moex::cpu {
namespace {

class BatchedMmCpu final : public ExpertsBackend {
 public:
  BackendCaps caps() const override {
    return cpu_caps("one product per (token, slot) pair; for very few tokens; FP8/FP4 weights "
                    "decoded in registers");
  }

  std::unique_ptr<PreparedExperts> prepare(const ExpertsSpec& spec,
                                           const ExpertsWeights& weights) const override {
    if (spec.quant.quantized() && weights.device().host_accessible())
      return prepare_quantized_experts(weights);
    return nullptr;
  }

  // Host code: runs synchronously on the calling thread (and its OpenMP team); the context adds
  // nothing on the CPU.
  void forward(const ExpertsProblem& p, Tensor& out, const ExecContext&) const override {
    if (p.spec->quant.quantized()) return forward_quantized(p, out);
    const ExpertsSpec& s = *p.spec;
    const int64_t H = s.hidden;
    RoutingView r(p);
    const int64_t n = r.T * r.k;
    std::vector<float> pair_out(size_t(n * H), 0.f);
    const size_t es = dtype_size(p.hidden.dtype());
    const char* hid = static_cast<const char*>(p.hidden.raw());
#pragma omp parallel
    {
      std::vector<float> x(static_cast<size_t>(H)), scratch;
#pragma omp for schedule(dynamic, 1)
      for (int64_t q = 0; q < n; ++q) {
        const int64_t t = q / r.k, e = r.id(t, q % r.k);
        if (e >= r.E) continue;  // sentinel
        load_floats(hid + size_t(t * H) * es, p.hidden.dtype(), H, x.data());
        expert_mlp_rows(s, *p.weights, e, x.data(), 1, pair_out.data() + q * H,
                        p.hidden.dtype(), scratch);
      }
    }
    combine(r, pair_out.data(), H, out);
  }

 private:
  // Hidden rows quantized once per token; each pair then runs its expert on its own thread.
  static void forward_quantized(const ExpertsProblem& p, Tensor& out) {
    const ExpertsSpec& s = *p.spec;
    const int64_t H = s.hidden;
    RoutingView r(p);
    const int64_t n = r.T * r.k;
    std::vector<float> pair_out(size_t(n * H), 0.f);
    QuantRows X;
    quantize_hidden(p, X);
#pragma omp parallel
    {
      QuantRows h;
      std::vector<float> scratch;
#pragma omp for schedule(dynamic, 1)
      for (int64_t q = 0; q < n; ++q) {
        const int64_t t = q / r.k, e = r.id(t, q % r.k);
        if (e >= r.E) continue;  // sentinel
        quant_expert_row(s, *p.weights, e, X, t, pair_out.data() + q * H, p.hidden.dtype(), h,
                         scratch);
      }
    }
    combine(r, pair_out.data(), H, out);
  }
};

MOEX_REGISTER_EXPERTS_BACKEND("batched_mm", BatchedMmCpu);

}  // namespace
}  // namespace moex::cpu
