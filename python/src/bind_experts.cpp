// moex._moex.Experts: one experts module (weights + layout) over the caller's arrays, and its
// forward on the caller's stream. The Python layer (moex/_experts.py) builds the functional
// `experts_forward` and the transformers integration on it.
//
// Boundary rules (docs/python.md): every array is imported without a copy, so every array must
// already be what the kernels read: contiguous row-major, one device, a dtype moex knows.
// Anything else is a ValueError / TypeError naming the argument, before any work starts.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <string>

#include "moex/env_switches.hpp"
#include "moex/experts.hpp"
#include "tensor_import.hpp"

namespace py = pybind11;

namespace moex::python {
namespace {

[[noreturn]] void value_error(const std::string& msg) { throw py::value_error(msg); }

void require_contiguous(const Tensor& t, const std::string& name) {
  if (!t.is_contiguous())
    value_error(name + " must be contiguous (row-major), got strides " + shape_str(t.strides()) +
                " for shape " + shape_str(t.shape()) +
                "; moex never copies its inputs: pass .contiguous() / numpy.ascontiguousarray()");
}

void require_device(const Tensor& t, const std::string& name, Device dev) {
  if (t.device() != dev)
    value_error(name + " is on " + t.device().str() + " but the expert weights are on " + dev.str());
}

// DLPack's stream encoding -> ExecContext::stream. 0 (what torch reports for the default stream)
// means the legacy default stream, which is not moex's own current stream: pass its handle.
void* context_stream(int64_t s) { return reinterpret_cast<void*>(s == 0 ? int64_t(1) : s); }
int64_t dlpack_stream(int64_t s) { return s == 0 ? 1 : s; }

class PyExperts {
 public:
  PyExperts(py::handle gate_up, py::handle down, py::handle gate_up_bias, py::handle down_bias,
            bool has_gate, bool is_transposed, bool is_concatenated, const std::string& activation,
            float swiglu_limit, float swiglu_alpha, int64_t stream, bool torch_stream) {
    const ImportOptions in{dlpack_stream(stream), false, torch_stream};
    ExpertsWeights w;
    w.gate_up = import_tensor(gate_up, "gate_up_proj", in);
    w.down = import_tensor(down, "down_proj", in);
    if (!gate_up_bias.is_none()) w.gate_up_bias = import_tensor(gate_up_bias, "gate_up_proj_bias", in);
    if (!down_bias.is_none()) w.down_bias = import_tensor(down_bias, "down_proj_bias", in);
    if (w.gate_up_bias.defined() != w.down_bias.defined())
      value_error("give both gate_up_proj_bias and down_proj_bias, or neither");
    const char* layout = is_transposed ? "[E, H, R] (is_transposed)" : "[E, R, H]";
    if (w.gate_up.dim() != 3)
      value_error(std::string("gate_up_proj must be 3-D ") + layout + ", got " + shape_str(w.gate_up.shape()));
    if (w.down.dim() != 3)
      value_error(std::string("down_proj must be 3-D ") + (is_transposed ? "[E, I, H]" : "[E, H, I]") +
                  ", got " + shape_str(w.down.shape()));
    const Device dev = w.gate_up.device();
    for (auto [t, name] : {std::pair{&w.gate_up, "gate_up_proj"}, {&w.down, "down_proj"},
                           {&w.gate_up_bias, "gate_up_proj_bias"}, {&w.down_bias, "down_proj_bias"}}) {
      if (!t->defined()) continue;
      require_contiguous(*t, name);
      if (t->device() != dev)
        value_error(std::string(name) + " is on " + t->device().str() + " but gate_up_proj is on " + dev.str());
    }
    ExpertsSpec s;
    s.num_experts = w.gate_up.size(0);
    s.hidden = is_transposed ? w.gate_up.size(1) : w.gate_up.size(2);
    s.intermediate = is_transposed ? w.down.size(1) : w.down.size(2);
    s.has_gate = has_gate;
    s.has_bias = w.gate_up_bias.defined();
    s.is_transposed = is_transposed;
    s.is_concatenated = is_concatenated;
    s.act = parse_activation(activation);
    s.swiglu_limit = swiglu_limit;
    s.swiglu_alpha = swiglu_alpha;
    experts_ = std::make_unique<Experts>(s, std::move(w));  // validates shapes and dtypes
  }

  // Writes out = experts(hidden, routing) with backend `implementation`, enqueued on `stream`
  // (CUDA; DLPack encoding) and returns once it is enqueued (host backends: once it is done).
  void forward(const std::string& implementation, py::handle hidden, py::handle top_k_index,
               py::handle top_k_weights, py::handle out, int64_t stream, bool capturing,
               bool torch_stream) const {
    const ImportOptions in{dlpack_stream(stream), false, torch_stream},
        wr{dlpack_stream(stream), true, torch_stream};
    Tensor h = import_tensor(hidden, "hidden", in);
    Tensor idx = import_tensor(top_k_index, "top_k_index", in);
    Tensor tw = import_tensor(top_k_weights, "top_k_weights", in);
    Tensor o = import_tensor(out, "out", wr);
    const Device dev = experts_->device();
    for (auto [t, name] : {std::pair{&h, "hidden"}, {&idx, "top_k_index"}, {&tw, "top_k_weights"}, {&o, "out"}}) {
      require_contiguous(*t, name);
      require_device(*t, name, dev);
    }
    ExecContext ctx;
    ctx.device = dev;
    ctx.stream = dev.is_cuda() ? context_stream(stream) : nullptr;
    ctx.capturing = capturing;
    py::gil_scoped_release nogil;
    experts_->forward(implementation, h, idx, tw, o, ctx);
  }

  void prepare(const std::string& implementation) const {
    py::gil_scoped_release nogil;
    experts_->prepare(implementation);
  }

  std::string spec() const { return experts_->spec().str(); }
  std::string device() const { return experts_->device().str(); }
  std::string dtype() const { return std::string(dtype_name(experts_->dtype())); }

 private:
  std::unique_ptr<Experts> experts_;
};

py::list backends() {
  py::list out;
  for (const std::string& name : experts_backend_names()) {
    for (const auto& impl : experts_backend_implementations(name)) {
      BackendCaps c = impl->caps();
      py::list devices, dtypes;
      for (DeviceKind k : c.devices) devices.append(k == DeviceKind::kCUDA ? "cuda" : "cpu");
      for (DType t : c.dtypes) dtypes.append(std::string(dtype_name(t)));
      py::dict d;
      d["name"] = name;
      d["devices"] = devices;
      d["dtypes"] = dtypes;
      d["graph_capturable"] = c.graph_capturable;
      d["description"] = c.description;
      out.append(d);
    }
  }
  return out;
}

py::list env_switches_list() {
  py::list out;
  for (const EnvSwitch& e : env_switches()) {
    py::dict d;
    d["name"] = e.name;
    d["value"] = e.value ? py::object(py::str(*e.value)) : py::object(py::none());
    d["accepts"] = e.accepts;
    d["unset"] = e.unset;
    d["meaning"] = e.meaning;
    d["measuring"] = e.measuring;
    out.append(d);
  }
  return out;
}

}  // namespace

void bind_experts(py::module_& m) {
  py::class_<PyExperts>(m, "Experts",
                        "An experts module over the caller's weight arrays (no copy). See "
                        "moex.experts_forward for the arguments.")
      .def(py::init<py::handle, py::handle, py::handle, py::handle, bool, bool, bool,
                    const std::string&, float, float, int64_t, bool>(),
           py::arg("gate_up_proj"), py::arg("down_proj"), py::arg("gate_up_proj_bias") = py::none(),
           py::arg("down_proj_bias") = py::none(), py::kw_only(), py::arg("has_gate") = true,
           py::arg("is_transposed") = false, py::arg("is_concatenated") = true,
           py::arg("activation") = "silu", py::arg("swiglu_limit") = 7.0f,
           py::arg("swiglu_alpha") = 1.702f, py::arg("stream") = 0, py::arg("torch_stream") = false)
      .def("forward", &PyExperts::forward, py::arg("implementation"), py::arg("hidden"),
           py::arg("top_k_index"), py::arg("top_k_weights"), py::arg("out"), py::kw_only(),
           py::arg("stream") = 0, py::arg("capturing") = false, py::arg("torch_stream") = false,
           "Writes the experts' output into `out` ([T, H], hidden's dtype and device). "
           "torch_stream=True says `stream` is torch's current stream of the arrays' device, so "
           "torch tensors are read without a DLPack export.")
      .def("prepare", &PyExperts::prepare, py::arg("implementation"),
           "Runs the backend's one-time preparation (weight packing) now.")
      .def_property_readonly("spec", &PyExperts::spec)
      .def_property_readonly("device", &PyExperts::device)
      .def_property_readonly("dtype", &PyExperts::dtype);
  m.def("backends", &backends,
        "Registered experts backends: one dict per (name, implementation) with its devices, "
        "dtypes, graph_capturable and description.");
  m.def("env_switches", &env_switches_list,
        "The MOEX_* environment variables the library reads: one dict each with name, value (None "
        "when unset), accepts, unset (what happens then), meaning and measuring (whether it changes "
        "which kernels run). A value it does not accept raises InvalidInput where work starts.");
}

}  // namespace moex::python
