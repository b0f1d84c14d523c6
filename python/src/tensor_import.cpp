// Zero-copy import of Python arrays (see tensor_import.hpp for the accepted protocols).
// Why the buffer protocol comes first: numpy exports read-only arrays (np.load of a mapped file,
// broadcast views) through it but refuses them through DLPack, and it needs no capsule handshake.
#include "tensor_import.hpp"

#include <memory>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#ifdef MOEX_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

#include "dlpack.hpp"
#include "moex/error.hpp"

namespace py = pybind11;

namespace moex::python {
namespace {

// Runs `fn` with the GIL held: a moex tensor may drop its last reference on a thread that does
// not hold it (a call runs with the GIL released).
void with_gil(const std::function<void()>& fn) {
  if (!Py_IsInitialized()) return;  // interpreter shutting down: the owner is gone already
  PyGILState_STATE s = PyGILState_Ensure();
  fn();
  PyGILState_Release(s);
}

[[noreturn]] void type_error(const std::string& name, const std::string& what) {
  throw py::type_error(name + ": " + what);
}
[[noreturn]] void value_error(const std::string& name, const std::string& what) {
  throw py::value_error(name + ": " + what);
}

std::string supported_dtypes() {
  return "float32, bfloat16, float16, float64, int64, int32, int16, int8, uint8 or bool";
}

// One element type from its kind ('f', 'i', 'u', 'b' for bool, 'B' for bfloat16) and byte size.
DType dtype_of(char kind, size_t bytes, const std::string& name, const std::string& spelled) {
  switch (kind) {
    case 'f':
      if (bytes == 4) return DType::kF32;
      if (bytes == 2) return DType::kF16;
      if (bytes == 8) return DType::kF64;
      break;
    case 'B':
      if (bytes == 2) return DType::kBF16;
      break;
    case 'i':
      if (bytes == 8) return DType::kI64;
      if (bytes == 4) return DType::kI32;
      if (bytes == 2) return DType::kI16;
      if (bytes == 1) return DType::kI8;
      break;
    case 'u':
      if (bytes == 1) return DType::kU8;
      break;
    case 'b':
      if (bytes == 1) return DType::kBool;
      break;
  }
  type_error(name, "unsupported element type " + spelled + "; moex takes " + supported_dtypes());
}

// A struct-module format of one native little-endian scalar ("f", "<q", "=e", "?").
DType dtype_of_format(std::string_view fmt, size_t itemsize, const std::string& name) {
  std::string spelled = "'" + std::string(fmt) + "'";
  if (!fmt.empty() && (fmt[0] == '>' || fmt[0] == '!')) type_error(name, "big-endian data (" + spelled + ")");
  if (!fmt.empty() && (fmt[0] == '@' || fmt[0] == '=' || fmt[0] == '<')) fmt.remove_prefix(1);
  if (fmt.size() != 1)
    type_error(name, "unsupported element type (buffer format " + spelled + "); moex takes " + supported_dtypes());
  switch (fmt[0]) {
    case 'f': case 'd': case 'e': return dtype_of('f', itemsize, name, spelled);
    case 'b': case 'h': case 'i': case 'l': case 'q': return dtype_of('i', itemsize, name, spelled);
    case 'B': return dtype_of('u', itemsize, name, spelled);
    case '?': return dtype_of('b', itemsize, name, spelled);
  }
  type_error(name, "unsupported element type (buffer format " + spelled + "); moex takes " + supported_dtypes());
}

// An array-interface typestr ("<f4", "|u1", "|b1").
DType dtype_of_typestr(const std::string& ts, const std::string& name) {
  if (ts.size() < 3) type_error(name, "malformed typestr '" + ts + "'");
  if (ts[0] == '>') type_error(name, "big-endian data ('" + ts + "')");
  size_t bytes = 0;
  try {
    bytes = std::stoul(ts.substr(2));
  } catch (const std::exception&) {
    type_error(name, "malformed typestr '" + ts + "'");
  }
  return dtype_of(ts[1], bytes, name, "'" + ts + "'");
}

// Byte strides -> element strides; rejects what moex cannot address.
Shape element_strides(const std::vector<int64_t>& byte_strides, size_t itemsize,
                      const std::string& name) {
  Shape out;
  for (int64_t b : byte_strides) {
    if (b < 0) value_error(name, "negative strides (a reversed view) are not supported; pass a copy");
    if (b % int64_t(itemsize)) value_error(name, "strides are not multiples of the element size");
    out.push_back(b / int64_t(itemsize));
  }
  return out;
}

// Builds the view; `release` runs (once) also when the view cannot be built.
Tensor view(void* data, DType dt, Shape shape, Shape strides, Device dev,
            std::function<void()> release) {
  try {
    return Tensor::from_blob(data, dt, std::move(shape), std::move(strides), dev, release);
  } catch (...) {
    release();
    throw;
  }
}

Device cuda_device_of(const void* ptr, const std::string& name) {
#ifdef MOEX_WITH_CUDA
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, ptr) != cudaSuccess || attr.device < 0) {
    cudaGetLastError();
    value_error(name, "__cuda_array_interface__ points at memory the CUDA runtime does not know");
  }
  return Device::cuda(attr.device);
#else
  (void)ptr;
  throw Unsupported(name + ": a CUDA array, but this moex module was built without CUDA "
                    "(rebuild with -DMOEX_CUDA=ON)");
#endif
}

// Makes `consumer` wait for the work pending on `producer` (both in DLPack's stream encoding).
void order_streams(int64_t producer, int64_t consumer) {
#ifdef MOEX_WITH_CUDA
  if (producer == consumer) return;
  auto decode = [](int64_t s) {
    if (s == dlpack::kStreamLegacyDefault) return cudaStreamLegacy;
    if (s == dlpack::kStreamPerThreadDefault) return cudaStreamPerThread;
    return reinterpret_cast<cudaStream_t>(s);
  };
  cudaEvent_t ev = nullptr;
  if (cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) != cudaSuccess ||
      cudaEventRecord(ev, decode(producer)) != cudaSuccess ||
      cudaStreamWaitEvent(decode(consumer), ev, 0) != cudaSuccess) {
    cudaError_t e = cudaGetLastError();
    if (ev) cudaEventDestroy(ev);
    throw DeviceError(std::string("ordering a __cuda_array_interface__ stream: ") + cudaGetErrorString(e));
  }
  cudaEventDestroy(ev);
#else
  (void)producer;
  (void)consumer;
#endif
}

Tensor from_buffer(py::handle obj, const std::string& name, const ImportOptions& opt) {
  auto buf = std::make_unique<Py_buffer>();
  if (PyObject_GetBuffer(obj.ptr(), buf.get(), PyBUF_RECORDS_RO) != 0) throw py::error_already_set();
  Py_buffer* b = buf.release();
  auto release = [b] { with_gil([b] { PyBuffer_Release(b); delete b; }); };
  if (opt.writable && b->readonly) {
    release();
    value_error(name, "the array is read-only but moex writes its result there");
  }
  DType dt;
  Shape shape, strides;
  try {
    dt = dtype_of_format(b->format ? b->format : "B", size_t(b->itemsize), name);
    shape.assign(b->shape, b->shape + b->ndim);
    strides = element_strides(std::vector<int64_t>(b->strides, b->strides + b->ndim),
                              size_t(b->itemsize), name);
  } catch (...) {
    release();
    throw;
  }
  return view(b->buf, dt, std::move(shape), std::move(strides), Device::cpu(), release);
}

Tensor from_dlpack(py::handle obj, const std::string& name, const ImportOptions& opt) {
  auto dev = obj.attr("__dlpack_device__")().cast<std::pair<int, int>>();
  const bool cuda = dev.first == dlpack::kDLCUDA || dev.first == dlpack::kDLCUDAManaged;
  if (!cuda && dev.first != dlpack::kDLCPU && dev.first != dlpack::kDLCUDAHost)
    value_error(name, "DLPack device type " + std::to_string(dev.first) +
                          " is not supported (moex takes CPU and CUDA memory)");
#ifndef MOEX_WITH_CUDA
  if (cuda)
    throw Unsupported(name + ": a CUDA tensor, but this moex module was built without CUDA "
                      "(rebuild with -DMOEX_CUDA=ON)");
#endif
  py::object cap = cuda ? obj.attr("__dlpack__")(py::arg("stream") = opt.stream)
                        : obj.attr("__dlpack__")();
  if (!PyCapsule_IsValid(cap.ptr(), dlpack::kCapsuleName))
    type_error(name, "__dlpack__ did not return a fresh \"dltensor\" capsule");
  auto* m = static_cast<dlpack::DLManagedTensor*>(PyCapsule_GetPointer(cap.ptr(), dlpack::kCapsuleName));
  // From here on this code owns `m` (the capsule no longer deletes it).
  PyCapsule_SetName(cap.ptr(), dlpack::kUsedCapsuleName);
  auto release = [m] {
    if (m->deleter) with_gil([m] { m->deleter(m); });
  };
  const dlpack::DLTensor& t = m->dl_tensor;
  DType dt;
  Shape shape, strides;
  try {
    if (t.dtype.lanes != 1) type_error(name, "vector element types (lanes > 1) are not supported");
    const size_t bytes = t.dtype.bits / 8;
    std::string spelled = "DLPack (code " + std::to_string(t.dtype.code) + ", " +
                          std::to_string(t.dtype.bits) + " bits)";
    char kind = t.dtype.code == dlpack::kDLFloat    ? 'f'
                : t.dtype.code == dlpack::kDLBfloat ? 'B'
                : t.dtype.code == dlpack::kDLInt    ? 'i'
                : t.dtype.code == dlpack::kDLUInt   ? 'u'
                : t.dtype.code == dlpack::kDLBool   ? 'b'
                                                    : '?';
    if (t.dtype.bits % 8) kind = '?';
    dt = dtype_of(kind, bytes, name, spelled);
    shape.assign(t.shape, t.shape + t.ndim);
    if (t.strides) {
      for (int i = 0; i < t.ndim; ++i)
        if (t.strides[i] < 0)
          value_error(name, "negative strides (a reversed view) are not supported; pass a copy");
      strides.assign(t.strides, t.strides + t.ndim);
    } else {
      strides = contiguous_strides(shape);
    }
  } catch (...) {
    release();
    throw;
  }
  Device d = cuda ? Device::cuda(dev.second) : Device::cpu();
  return view(static_cast<char*>(t.data) + t.byte_offset, dt, std::move(shape), std::move(strides),
              d, release);
}

// torch.Tensor (and subclasses such as nn.Parameter), found without importing torch: only
// once the caller has imported it.
PyTypeObject* torch_tensor_type() {
  static PyTypeObject* type = nullptr;
  if (type) return type;
  PyObject* torch = PyImport_GetModule(py::str("torch").ptr());  // new reference or null
  if (!torch) {
    PyErr_Clear();
    return nullptr;
  }
  PyObject* t = PyObject_GetAttrString(torch, "Tensor");
  Py_DECREF(torch);
  if (!t || !PyType_Check(t)) {
    PyErr_Clear();
    Py_XDECREF(t);
    return nullptr;
  }
  type = reinterpret_cast<PyTypeObject*>(t);  // kept for the life of the process
  return type;
}

// torch dtype object -> moex DType, learned from the dtype's name once per dtype.
DType torch_dtype(py::handle dtype, const std::string& name) {
  static py::dict* known = new py::dict();  // leaked on purpose: outlives interpreter teardown order
  if (known->contains(dtype)) return DType((*known)[dtype].cast<int>());
  const std::string s = py::str(dtype);  // "torch.bfloat16"
  static const std::pair<const char*, DType> names[] = {
      {"torch.float32", DType::kF32}, {"torch.bfloat16", DType::kBF16}, {"torch.float16", DType::kF16},
      {"torch.float64", DType::kF64}, {"torch.int64", DType::kI64},     {"torch.int32", DType::kI32},
      {"torch.int16", DType::kI16},   {"torch.int8", DType::kI8},       {"torch.uint8", DType::kU8},
      {"torch.bool", DType::kBool}};
  for (const auto& [n, dt] : names)
    if (s == n) {
      (*known)[dtype] = int(dt);
      return dt;
    }
  type_error(name, "unsupported element type " + s + "; moex takes " + supported_dtypes());
}

// torch.Size / a stride tuple -> integers (pybind11's list caster refuses torch.Size).
Shape int_tuple(py::handle seq, const std::string& name) {
  if (!PyTuple_Check(seq.ptr())) type_error(name, "torch tensor shape / strides are not a tuple");
  Shape out(size_t(PyTuple_GET_SIZE(seq.ptr())));
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(seq.ptr(), Py_ssize_t(i)));
    if (out[i] == -1 && PyErr_Occurred()) throw py::error_already_set();
  }
  return out;
}

// A torch tensor read through its attributes; nullopt when it must take the DLPack road (a
// device other than CPU / CUDA, a CUDA tensor off torch's current stream, a lazily negated view).
std::optional<Tensor> from_torch(py::handle obj, const std::string& name, const ImportOptions& opt) {
  const bool cuda = obj.attr("is_cuda").cast<bool>();
  if (cuda ? !opt.on_torch_stream : !obj.attr("is_cpu").cast<bool>()) return std::nullopt;
  if (obj.attr("is_neg")().cast<bool>()) return std::nullopt;
  const DType dt = torch_dtype(obj.attr("dtype"), name);
  Shape shape = int_tuple(obj.attr("shape"), name), strides = int_tuple(obj.attr("stride")(), name);
  for (int64_t s : strides)
    if (s < 0) value_error(name, "negative strides (a reversed view) are not supported; pass a copy");
#ifndef MOEX_WITH_CUDA
  if (cuda)
    throw Unsupported(name + ": a CUDA tensor, but this moex module was built without CUDA "
                      "(rebuild with -DMOEX_CUDA=ON)");
#endif
  const Device dev = cuda ? Device::cuda(obj.attr("get_device")().cast<int>()) : Device::cpu();
  void* data = reinterpret_cast<void*>(obj.attr("data_ptr")().cast<uintptr_t>());
  PyObject* owner = obj.ptr();
  Py_INCREF(owner);
  return view(data, dt, std::move(shape), std::move(strides), dev,
              [owner] { with_gil([owner] { Py_DECREF(owner); }); });
}

// __cuda_array_interface__ / __array_interface__: a dict describing memory `obj` keeps alive.
Tensor from_interface(py::handle obj, const std::string& name, const ImportOptions& opt,
                      bool cuda) {
  py::dict d = obj.attr(cuda ? "__cuda_array_interface__" : "__array_interface__");
  auto data = d["data"];
  if (!py::isinstance<py::tuple>(data)) type_error(name, "array interface 'data' is not (pointer, read_only)");
  auto [ptr, readonly] = data.cast<std::pair<uintptr_t, bool>>();
  if (opt.writable && readonly) value_error(name, "the array is read-only but moex writes its result there");
  DType dt = dtype_of_typestr(d["typestr"].cast<std::string>(), name);
  Shape shape = d["shape"].cast<std::vector<int64_t>>();
  Shape strides = d.contains("strides") && !d["strides"].is_none()
                      ? element_strides(d["strides"].cast<std::vector<int64_t>>(), dtype_size(dt), name)
                      : contiguous_strides(shape);
  Device dev = Device::cpu();
  if (cuda) {
    dev = shape_numel(shape) ? cuda_device_of(reinterpret_cast<void*>(ptr), name) : Device::cuda(0);
    // Version 3: the producer's stream; its pending work must finish before the call's.
    if (d.contains("stream") && !d["stream"].is_none()) order_streams(d["stream"].cast<int64_t>(), opt.stream);
  }
  PyObject* owner = obj.ptr();
  Py_INCREF(owner);
  return view(reinterpret_cast<void*>(ptr), dt, std::move(shape), std::move(strides), dev,
              [owner] { with_gil([owner] { Py_DECREF(owner); }); });
}

}  // namespace

Tensor import_tensor(py::handle obj, const std::string& name, const ImportOptions& opt) {
  if (obj.is_none()) type_error(name, "expected an array, got None");
  if (PyTypeObject* tt = torch_tensor_type(); tt && PyObject_TypeCheck(obj.ptr(), tt))
    if (auto t = from_torch(obj, name, opt)) return std::move(*t);
  if (PyObject_CheckBuffer(obj.ptr())) return from_buffer(obj, name, opt);
  if (py::hasattr(obj, "__dlpack__") && py::hasattr(obj, "__dlpack_device__"))
    return from_dlpack(obj, name, opt);
  if (py::hasattr(obj, "__cuda_array_interface__")) return from_interface(obj, name, opt, true);
  if (py::hasattr(obj, "__array_interface__")) return from_interface(obj, name, opt, false);
  type_error(name, "expected an array (buffer protocol, DLPack, __cuda_array_interface__ or "
                   "__array_interface__), got " +
                       std::string(py::str(py::type::handle_of(obj).attr("__name__"))));
}

std::string describe(const Tensor& t) { return t.str(); }

}  // namespace moex::python
