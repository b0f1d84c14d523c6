// Python arrays -> moex::Tensor, without copies.
//
// Any object exporting one of these is accepted, tried in this order:
//   1. the buffer protocol (numpy, memoryview, array.array): host memory; read-only buffers are
//      accepted for inputs and refused for outputs;
//   2. DLPack (`__dlpack__` / `__dlpack_device__`: torch, cupy, jax, numpy): host or CUDA memory;
//      on CUDA the producer is asked to make its data ready on the caller's stream;
//   3. `__cuda_array_interface__` (numba, cupy, older libraries): CUDA memory;
//   4. `__array_interface__`: host memory.
// torch tensors take a shorter road: their pointer, shape, strides, dtype and device are read
// as attributes (about a microsecond, against ~10 us for a DLPack export on CUDA, where torch
// runs Python stream bookkeeping per tensor). On CUDA that road is taken only when the call runs
// on torch's current stream of the tensor's device (`ImportOptions::on_torch_stream`), where
// torch's pending work on the tensor is already ordered before the call; otherwise DLPack.
// The resulting tensor views the object's memory and keeps the object (or the DLPack tensor)
// alive until the last moex view of it is gone. Nothing is converted: a dtype moex does not know
// is a TypeError, a reversed (negative-stride) view a ValueError.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>

#include "moex/tensor.hpp"

namespace moex::python {

struct ImportOptions {
  // The stream the call will run on, in DLPack's encoding (1 = legacy default, 2 = per-thread
  // default, else a cudaStream_t): producers of CUDA arrays order their pending work before it.
  int64_t stream = 1;
  bool writable = false;  // the call writes the array (an output)
  // `stream` is torch's current stream of the arrays' device (see above).
  bool on_torch_stream = false;
};

// `name` appears in every error ("top_k_index: ...").
Tensor import_tensor(pybind11::handle obj, const std::string& name, const ImportOptions& opt);

// "float32" for a tensor; used in error messages and by the module's tests.
std::string describe(const Tensor& t);

}  // namespace moex::python
