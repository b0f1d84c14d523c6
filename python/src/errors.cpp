#include "errors.hpp"

#include <exception>

#include "moex/error.hpp"

namespace py = pybind11;

namespace moex::python {
namespace {

PyObject* g_error = nullptr;
PyObject* g_invalid = nullptr;
PyObject* g_unknown = nullptr;
PyObject* g_unsupported = nullptr;
PyObject* g_device = nullptr;

PyObject* make(py::module_& m, const char* name, PyObject* base, PyObject* second = nullptr) {
  std::string full = std::string("moex.") + name;
  PyObject* bases = second ? PyTuple_Pack(2, base, second) : PyTuple_Pack(1, base);
  PyObject* type = PyErr_NewException(full.c_str(), bases, nullptr);
  Py_DECREF(bases);
  if (!type) throw py::error_already_set();
  m.add_object(name, py::handle(type));  // the module keeps a reference for the process
  return type;
}

}  // namespace

void register_errors(py::module_& m) {
  g_error = make(m, "Error", PyExc_RuntimeError);
  g_invalid = make(m, "InvalidInput", g_error, PyExc_ValueError);
  g_unknown = make(m, "UnknownName", g_error, PyExc_ValueError);
  g_unsupported = make(m, "Unsupported", g_error, PyExc_NotImplementedError);
  g_device = make(m, "DeviceError", g_error);
  // Most specific first; anything else propagates to pybind11's own translators.
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const InvalidInput& e) {
      PyErr_SetString(g_invalid, e.what());
    } catch (const UnknownName& e) {
      PyErr_SetString(g_unknown, e.what());
    } catch (const Unsupported& e) {
      PyErr_SetString(g_unsupported, e.what());
    } catch (const DeviceError& e) {
      PyErr_SetString(g_device, e.what());
    } catch (const Error& e) {
      PyErr_SetString(g_error, e.what());
    }
  });
}

}  // namespace moex::python
