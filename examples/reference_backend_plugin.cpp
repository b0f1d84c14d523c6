// A user-defined experts backend, registered from outside the library.
//
// Build it as a shared library linked against libmoex; `moex --plugin libX.so ...` (or
// MOEX_PLUGINS=libX.so) loads it, its static initialiser registers the backend, and from then on
// the backend is selectable by name everywhere: `moex bench experts --backends reference`,
// `--experts-implementation reference`, moex::experts_forward("reference", ...).
//
// This one evaluates the float64 reference formula and rounds the result to the activation
// dtype: slow, but exact, which makes it a useful oracle when debugging another backend.
#include <memory>

#include "moex/experts.hpp"

namespace {

class ReferenceBackend final : public moex::ExpertsBackend {
 public:
  moex::BackendCaps caps() const override {
    moex::BackendCaps c;
    c.devices = {moex::DeviceKind::kCPU};
    c.dtypes = {moex::DType::kF32, moex::DType::kBF16, moex::DType::kF16};
    c.description = "float64 reference (example plugin)";
    return c;
  }
  void forward(const moex::ExpertsProblem& p, moex::Tensor& out,
               const moex::ExecContext&) const override {
    moex::Tensor ref = moex::experts_reference_f64(*p.spec, *p.weights, p.hidden, p.top_k_index,
                                                   p.top_k_weights);
    moex::convert_floats(ref.raw(), moex::DType::kF64, out.raw(), out.dtype(), ref.numel());
  }
};

const bool registered = [] {
  moex::register_experts_backend("reference", std::make_shared<ReferenceBackend>());
  return true;
}();

}  // namespace
