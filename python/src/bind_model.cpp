// moex._moex.CausalLM and from_pretrained: the model API with transformers' names. Token ids go
// in as int64 / int32 host arrays (the Python layer converts lists and torch tensors); logits and
// sequences come back as numpy arrays that own moex's result (no copy on the host).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <string>
#include <variant>

#include "moex/model.hpp"
#include "tensor_import.hpp"

namespace py = pybind11;

namespace moex::python {
namespace {

py::array to_numpy(Tensor t) {
  if (!t.device().host_accessible()) t = t.to(Device::cpu());
  if (t.dtype() == DType::kBF16 || t.dtype() == DType::kF16) t = t.to(DType::kF32);
  t = t.contiguous();
  py::dtype dt = t.dtype() == DType::kF32   ? py::dtype::of<float>()
                 : t.dtype() == DType::kF64 ? py::dtype::of<double>()
                 : t.dtype() == DType::kI64 ? py::dtype::of<int64_t>()
                 : t.dtype() == DType::kI32 ? py::dtype::of<int32_t>()
                                            : throw py::type_error("result dtype " + std::string(dtype_name(t.dtype())));
  std::vector<py::ssize_t> shape(t.shape().begin(), t.shape().end()), strides;
  for (int64_t s : t.strides()) strides.push_back(py::ssize_t(s * int64_t(dtype_size(t.dtype()))));
  auto* keep = new Tensor(t);
  py::capsule owner(keep, [](void* p) { delete static_cast<Tensor*>(p); });
  return py::array(dt, shape, strides, keep->raw(), owner);
}

Tensor host_ids(py::handle obj, const char* name) {
  if (obj.is_none()) return Tensor();
  return import_tensor(obj, name, ImportOptions{});
}

using ImplArg = std::optional<std::variant<std::string, std::map<std::string, std::string>>>;

ExpertsImplementation to_map(const std::variant<std::string, std::map<std::string, std::string>>& v) {
  if (const auto* s = std::get_if<std::string>(&v)) return parse_experts_implementation(*s);
  return std::get<std::map<std::string, std::string>>(v);
}

DecodeSwitch parse_switch(const std::string& s) {
  if (s == "auto") return DecodeSwitch::kAuto;
  if (s == "on") return DecodeSwitch::kOn;
  if (s == "off") return DecodeSwitch::kOff;
  throw py::value_error("decode_switch must be 'auto', 'on' or 'off', got '" + s + "'");
}

py::dict info_dict(const ModelInfo& i) {
  py::dict d;
  d["model_type"] = i.model_type;
  d["architecture"] = i.architecture;
  d["dtype"] = std::string(dtype_name(i.dtype));
  d["device"] = i.device.str();
  d["vocab_size"] = i.vocab_size;
  d["hidden_size"] = i.hidden_size;
  d["num_layers"] = i.num_layers;
  d["max_position_embeddings"] = i.max_position_embeddings;
  d["moe_layers"] = i.moe_layers;
  d["num_experts"] = i.num_experts;
  d["experts_per_token"] = i.experts_per_token;
  d["parameter_count"] = i.parameter_count;
  d["sub_configs"] = i.sub_configs;
  d["weight_bytes"] = i.weight_bytes;
  d["load_seconds"] = i.load_seconds;
  return d;
}

py::dict stats_dict(const GenerationStats& s) {
  py::dict d;
  d["batch"] = s.batch;
  d["prompt_tokens"] = s.prompt_tokens;
  d["new_tokens"] = s.new_tokens;
  d["prefill_seconds"] = s.prefill_seconds;
  d["decode_seconds"] = s.decode_seconds;
  d["prepare_seconds"] = s.prepare_seconds;
  d["graph"] = s.graph;
  d["graph_note"] = s.graph_note;
  d["graph_reused"] = s.graph_reused;
  // What the decode steps ran (the decode-stage switch), and why the switch did not apply.
  d["decode_experts_implementation"] = s.decode_experts_implementation;
  d["decode_switch_note"] = s.decode_switch_note;
  return d;
}

}  // namespace

void bind_model(py::module_& m) {
  py::class_<CausalLM>(m, "CausalLM", "A loaded Mixture-of-Experts causal language model.")
      .def_property_readonly("info", [](const CausalLM& lm) { return info_dict(lm.info()); })
      .def("logits",
           [](CausalLM& lm, py::handle input_ids, py::handle attention_mask) {
             Tensor ids = host_ids(input_ids, "input_ids"), mask = host_ids(attention_mask, "attention_mask");
             Tensor out;
             {
               py::gil_scoped_release nogil;
               out = lm.logits(ids, mask);
             }
             return to_numpy(out);
           },
           py::arg("input_ids"), py::arg("attention_mask") = py::none(),
           "int [B, T] -> float32 [B, T, vocab] (numpy).")
      .def("generate",
           [](CausalLM& lm, py::handle input_ids, py::handle attention_mask, int64_t max_new_tokens,
              bool do_sample, float temperature, int64_t top_k, float top_p, uint64_t seed,
              std::optional<std::vector<int64_t>> eos_token_id, const std::string& decode_switch,
              bool cuda_graph) {
             Tensor ids = host_ids(input_ids, "input_ids"), mask = host_ids(attention_mask, "attention_mask");
             GenerationOptions o;
             o.max_new_tokens = max_new_tokens;
             o.do_sample = do_sample;
             o.temperature = temperature;
             o.top_k = top_k;
             o.top_p = top_p;
             o.seed = seed;
             o.eos_token_ids = std::move(eos_token_id);
             o.decode_switch = parse_switch(decode_switch);
             o.cuda_graph = cuda_graph;
             Tensor out;
             {
               py::gil_scoped_release nogil;
               out = lm.generate(ids, o, mask);
             }
             return to_numpy(out);
           },
           py::arg("input_ids"), py::arg("attention_mask") = py::none(), py::kw_only(),
           py::arg("max_new_tokens") = 20, py::arg("do_sample") = false, py::arg("temperature") = 1.0f,
           py::arg("top_k") = 0, py::arg("top_p") = 1.0f, py::arg("seed") = 0,
           py::arg("eos_token_id") = py::none(), py::arg("decode_switch") = "auto",
           py::arg("cuda_graph") = true, "int [B, T] -> int64 [B, T + n] (numpy).")
      .def("get_experts_implementation", &CausalLM::get_experts_implementation)
      .def("set_experts_implementation",
           [](CausalLM& lm, const std::variant<std::string, std::map<std::string, std::string>>& v) {
             lm.set_experts_implementation(to_map(v));
           },
           py::arg("experts_implementation"))
      .def_property_readonly("last_generation_stats",
                             [](const CausalLM& lm) { return stats_dict(lm.last_generation_stats()); })
      .def_property_readonly("default_eos_token_ids", &CausalLM::default_eos_token_ids);

  m.def("from_pretrained",
        [](const std::string& path, const ImplArg& experts_implementation,
           const std::optional<std::string>& dtype, const std::optional<std::string>& device) {
          LoadOptions o = make_load_options(dtype.value_or(""), device.value_or(""), "");
          if (experts_implementation) o.experts_implementation = to_map(*experts_implementation);
          py::gil_scoped_release nogil;
          return from_pretrained(path, o);
        },
        py::arg("path"), py::kw_only(), py::arg("experts_implementation") = py::none(),
        py::arg("dtype") = py::none(), py::arg("device") = py::none(),
        "Loads a Hugging Face checkpoint folder (config.json + safetensors).");
  m.def("supported_model_types", &supported_model_types);
}

}  // namespace moex::python
