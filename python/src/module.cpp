// The extension module moex._moex. The public package is python/moex (it re-exports these and
// adds what is easier in Python: allocating outputs with the caller's library, torch streams, the
// transformers integration).
#include <pybind11/pybind11.h>

#include "errors.hpp"

namespace py = pybind11;

namespace moex::python {
void bind_experts(py::module_& m);
void bind_model(py::module_& m);
}  // namespace moex::python

PYBIND11_MODULE(_moex, m) {
  m.doc() = "moex: Mixture-of-Experts layers and models (C++ core)";
  moex::python::register_errors(m);
  moex::python::bind_experts(m);
  moex::python::bind_model(m);
#ifdef MOEX_WITH_CUDA
  m.attr("built_with_cuda") = true;
#else
  m.attr("built_with_cuda") = false;
#endif
}
