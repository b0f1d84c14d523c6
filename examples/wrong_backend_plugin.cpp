// A deliberately wrong experts backend, loaded as a plugin by the CLI tests: it counts every
// expert's contribution twice (out = 2 x the exact result). `moex bench experts --backends wrong`
// must refuse to time it and exit non-zero naming the failed check (tests/test_cli_bench.cpp);
// a benchmark that timed it would report a fast, wrong backend.
#include <memory>

#include "moex/experts.hpp"

namespace {

class WrongBackend final : public moex::ExpertsBackend {
 public:
  moex::BackendCaps caps() const override {
    moex::BackendCaps c;
    c.devices = {moex::DeviceKind::kCPU};
    c.dtypes = {moex::DType::kF32, moex::DType::kBF16, moex::DType::kF16};
    c.description = "deliberately wrong: every contribution counted twice (test plugin)";
    return c;
  }
  void forward(const moex::ExpertsProblem& p, moex::Tensor& out,
               const moex::ExecContext&) const override {
    moex::Tensor ref = moex::experts_reference_f64(*p.spec, *p.weights, p.hidden, p.top_k_index,
                                                   p.top_k_weights);
    double* v = ref.data<double>();
    for (int64_t i = 0; i < ref.numel(); ++i) v[i] *= 2;
    moex::convert_floats(ref.raw(), moex::DType::kF64, out.raw(), out.dtype(), ref.numel());
  }
};

const bool registered = [] {
  moex::register_experts_backend("wrong", std::make_shared<WrongBackend>());
  return true;
}();

}  // namespace
