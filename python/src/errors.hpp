// moex's typed exceptions (moex/error.hpp) as Python exceptions.
//
//   moex.Error        (RuntimeError)                 every moex error
//   moex.InvalidInput (moex.Error, ValueError)       bad shapes, dtypes, ids, checkpoints, masks
//   moex.UnknownName  (moex.Error, ValueError)       unknown backend, model type, sub-config key
//   moex.Unsupported  (moex.Error, NotImplementedError)  a valid request this build/device cannot serve
//   moex.DeviceError  (moex.Error)                   CUDA runtime / cuBLAS failures
// So `except ValueError` catches bad input from Python's usual habits and `except moex.Error`
// catches everything the library reports; the message is moex's own.
#pragma once

#include <pybind11/pybind11.h>

namespace moex::python {

void register_errors(pybind11::module_& m);

}  // namespace moex::python
