// CausalLM: the experts-implementation map (load-time and run-time), input validation, logits,
// and from_pretrained. Generation lives in generate.cpp.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <new>
#include <set>

#include <nlohmann/json.hpp>

#include "io/strict_json.hpp"
#include "model/architecture.hpp"
#include "model/kept_decode_graph.hpp"
#include "moex/checkpoint.hpp"
#include "moex/comm.hpp"
#include "moex/env_switches.hpp"
#include "moex/error.hpp"
#include "moex/experts.hpp"
#include "ops/ops.hpp"

namespace moex {

namespace {

constexpr const char* kDefaultBackend = "grouped_mm";  // what transformers 5.17 reports by default

std::string quoted_keys(const std::vector<std::string>& keys) {
  std::string s;
  for (const auto& k : keys) s += (s.empty() ? "" : ", ") + ("\"" + k + "\"");
  return s;
}

}  // namespace

ExpertsImplementation parse_experts_implementation(const std::string& spec) {
  size_t first = spec.find_first_not_of(" \t\n");
  if (first == std::string::npos)
    throw InvalidInput("empty experts implementation; give a backend name or a JSON object");
  if (spec[first] != '{') return {{"", spec}};
  // Strict: {"text_config": "eager", "text_config": "grouped_mm"} is an error, not last-wins.
  const nlohmann::json j =
      io::parse_json_strict(spec.data(), spec.size(), "experts implementation '" + spec + "'", 4);
  if (!j.is_object())
    throw InvalidInput("experts implementation '" + spec + "' must be a backend name or a JSON object");
  ExpertsImplementation m;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (!it.value().is_string())
      throw InvalidInput("experts implementation for key \"" + it.key() +
                         "\" must be a backend name (a string)");
    m[it.key()] = it.value().get<std::string>();
  }
  return m;
}

std::string experts_implementation_json(const ExpertsImplementation& map) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [k, v] : map) j[k] = v;
  return j.dump();
}

LoadOptions make_load_options(const std::string& dtype, const std::string& device,
                              const std::string& experts_spec) {
  LoadOptions o;
  if (!dtype.empty()) o.dtype = parse_dtype(dtype);
  if (!device.empty()) o.device = parse_device(device);
  if (!experts_spec.empty()) o.experts_implementation = parse_experts_implementation(experts_spec);
  return o;
}

CausalLM::CausalLM() = default;
// Work the ops still run on their own threads for this model's calls ends with it
// (ops::finish_background_work says why).
CausalLM::~CausalLM() { ops::finish_background_work(); }

void CausalLM::release_decode_graph() { kept_decode_.reset(); }

const std::string& CausalLM::experts_backend(const std::string& key) const {
  auto it = impl_.find(key);
  if (it == impl_.end()) throw UnknownName("no experts implementation entry \"" + key + "\"");
  return it->second;
}

void CausalLM::register_experts_module(const std::string& key, const Experts* experts) {
  experts_modules_.emplace_back(key, experts);
}

ExpertsImplementation CausalLM::resolve(const ExpertsImplementation& requested,
                                        const ExpertsImplementation& base) const {
  std::vector<std::string> keys = {""};
  keys.insert(keys.end(), info_.sub_configs.begin(), info_.sub_configs.end());
  ExpertsImplementation out = base;
  // The documented meaning of "": the default for the model and every sub-config not named.
  if (auto it = requested.find(""); it != requested.end())
    for (const auto& k : keys) out[k] = it->second;
  for (const auto& [k, v] : requested) {
    if (k.empty()) continue;
    if (std::find(keys.begin(), keys.end(), k) == keys.end())
      throw UnknownName("unknown sub-config key \"" + k + "\" in experts implementation for " +
                        info_.model_type + "; valid keys: " + quoted_keys(keys));
    out[k] = v;
  }
  for (const auto& [k, v] : out) {
    auto backend = get_experts_backend(v);  // UnknownName listing the registered backends
    for (const auto& [key, module] : experts_modules_) {
      if (key != k) continue;
      const Device dev = module->device();
      if (std::string why = backend->unsupported_reason(module->spec(), info_.dtype, dev); !why.empty())
        throw Unsupported("experts backend '" + v + "' cannot serve " + info_.model_type +
                          (k.empty() ? "" : " " + k) + " experts (" + module->spec().str() + ", " +
                          std::string(dtype_name(info_.dtype)) + "): it " + why);
    }
  }
  return out;
}

void CausalLM::init_experts_implementation(const ExpertsImplementation& requested) {
  ExpertsImplementation base;
  base[""] = kDefaultBackend;
  for (const auto& s : info_.sub_configs) base[s] = kDefaultBackend;
  impl_ = resolve(requested, base);
}

void CausalLM::prepare_experts(const ExpertsImplementation& map) const {
  for (const auto& [key, module] : experts_modules_) {
    auto it = map.find(key);
    if (it == map.end()) continue;
    module->prepare(it->second, info_.dtype);  // the model's activations (quantized weights too)
    // "auto" resolves its table at the first call of a shape and k (measuring it the first time
    // on a device): make that call now, outside any clock or graph capture.
    const int64_t k = std::min(info_.experts_per_token, module->spec().num_experts);
    if (it->second == "auto" && k > 0) {
      const Device dev = module->device();
      std::vector<int64_t> ids(static_cast<size_t>(k));
      for (int64_t j = 0; j < k; ++j) ids[size_t(j)] = j;
      (void)module->forward("auto", Tensor::zeros({1, module->spec().hidden}, info_.dtype, dev),
                            Tensor::from_ints(ids, {1, k}).to(dev),
                            Tensor::from_floats(std::vector<float>(size_t(k), 1.0f / float(k)), {1, k}).to(dev));
    }
  }
}

void CausalLM::set_experts_implementation(const std::string& backend) {
  impl_ = resolve({{"", backend}}, impl_);
}

void CausalLM::set_experts_implementation(const ExpertsImplementation& map) {
  impl_ = resolve(map, impl_);
}

void CausalLM::validate_ids(const Tensor& input_ids) const {
  if (!input_ids.defined() || input_ids.dim() != 2)
    throw InvalidInput("input_ids must be a 2-D integer tensor [batch, tokens], got " +
                       (input_ids.defined() ? input_ids.str() : std::string("nothing")));
  if (input_ids.dtype() != DType::kI64 && input_ids.dtype() != DType::kI32)
    throw InvalidInput("input_ids must be int64 or int32, got " + input_ids.str());
  if (input_ids.size(0) == 0 || input_ids.size(1) == 0)
    throw InvalidInput("empty prompt: input_ids is " + shape_str(input_ids.shape()) +
                       "; give at least one token per sequence");
  const auto ids = input_ids.to_int_vector();
  const int64_t T = input_ids.size(1);
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= info_.vocab_size)
      throw InvalidInput("token id " + std::to_string(ids[i]) + " at input_ids[" + std::to_string(int64_t(i) / T) +
                         ", " + std::to_string(int64_t(i) % T) + "] is outside the vocabulary [0, " +
                         std::to_string(info_.vocab_size) + ")");
}

std::vector<int64_t> CausalLM::left_padding(const Tensor& input_ids, const Tensor& attention_mask) const {
  if (!attention_mask.defined()) return {};
  const DType t = attention_mask.dtype();
  if (is_floating(t) || t == DType::kFP4x2)
    throw InvalidInput("attention_mask must be an integer or bool tensor of 0 and 1, got " + attention_mask.str());
  if (attention_mask.shape() != input_ids.shape())
    throw InvalidInput("attention_mask must have the shape of input_ids " + shape_str(input_ids.shape()) +
                       ", got " + shape_str(attention_mask.shape()));
  const int64_t B = input_ids.size(0), T = input_ids.size(1);
  const auto mask = attention_mask.to_int_vector();
  std::vector<int64_t> pad(size_t(B), 0);
  bool any = false;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t* m = mask.data() + b * T;
    const std::string row = "attention_mask row " + std::to_string(b);
    for (int64_t t = 0; t < T; ++t)
      if (m[t] != 0 && m[t] != 1)
        throw InvalidInput(row + " holds " + std::to_string(m[t]) + " at column " + std::to_string(t) +
                           "; the mask holds only 0 (padding) and 1 (token)");
    int64_t p = 0;
    while (p < T && m[p] == 0) ++p;
    if (p == T) throw InvalidInput(row + " has no token (all zeros); every sequence needs at least one");
    for (int64_t t = p; t < T; ++t)
      if (m[t] == 0)
        throw InvalidInput(row + " is not left padding: 0 at column " + std::to_string(t) + " after a 1 at column " +
                           std::to_string(p) + " (pad on the left: zeros, then ones)");
    pad[size_t(b)] = p;
    any = any || p > 0;
  }
  // No padded row: the unpadded path exactly.
  return any ? pad : std::vector<int64_t>{};
}

void CausalLM::check_positions(int64_t positions, const std::string& what) const {
  const int64_t max = info_.max_position_embeddings;
  if (max > 0 && positions > max)
    throw InvalidInput(what + " = " + std::to_string(positions) + " positions, more than the " +
                       std::to_string(max) + " of max_position_embeddings in the model's config.json");
}

void CausalLM::check_finite(const Tensor& logits, const std::string& what) const {
  const float* p = logits.data<float>();
  const int64_t n = logits.numel(), V = logits.size(logits.dim() - 1);
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(p[i]))
      throw Error("the forward gave a non-finite logit (" + std::to_string(p[i]) + " at row " +
                  std::to_string(i / V) + ", token id " + std::to_string(i % V) + ") " + what +
                  "; the checkpoint's weights or config values (rope, rms_norm_eps) overflow");
}

Tensor CausalLM::logits(const Tensor& input_ids, const Tensor& attention_mask) {
  validate_ids(input_ids);
  const int64_t B = input_ids.size(0), T = input_ids.size(1);
  check_positions(T, "the input of " + std::to_string(T) + " tokens");
  model::KVCache cache(B, info_.num_layers, T);
  model::Step step{B, T, 0};
  step.pad = left_padding(input_ids, attention_mask);
  step.ids = input_ids.to_int_vector();
  // The public result is float32 on the host, whatever the device computed in.
  Tensor out = forward(step, cache, false).to(Device::cpu()).to(DType::kF32);
  finish_call();
  // Padding rows are not meaningful (and may hold anything): only real tokens' rows are checked.
  if (step.pad.empty()) check_finite(out, "in logits()");
  else
    for (int64_t b = 0; b < B; ++b)
      check_finite(out.slice(0, b * T + step.pad[size_t(b)], (b + 1) * T).contiguous(),
                   "in logits() for sequence " + std::to_string(b));
  return out.view({B, T, out.size(1)});
}

ExpertsImplementation decode_stage_experts_implementation(const ExpertsImplementation& map,
                                                          Device device, DecodeSwitch mode) {
  const bool applies =
      mode == DecodeSwitch::kOn || (mode == DecodeSwitch::kAuto && device.is_cuda());
  if (!applies) return map;
  ExpertsImplementation out = map;
  for (auto& [k, v] : out)
    if (v == "grouped_mm") v = "batched_mm";
  return out;
}

ScopedExpertsImplementation::ScopedExpertsImplementation(CausalLM& model,
                                                         const ExpertsImplementation& map)
    : model_(model), saved_(model.get_experts_implementation()) {
  model_.set_experts_implementation(map);
}

ScopedExpertsImplementation::~ScopedExpertsImplementation() {
  // The saved map was valid when taken and the registry does not shrink, so restoring cannot
  // fail; assign directly so that a destructor never throws.
  model_.impl_ = saved_;
}

std::vector<std::string> supported_model_types() {
  std::vector<std::string> v;
  for (const auto& e : model::architectures()) v.push_back(e.model_type);
  std::sort(v.begin(), v.end());
  return v;
}

std::unique_ptr<CausalLM> from_pretrained(const std::string& dir, const LoadOptions& options) {
  // Backend names and the environment's switches are checked before the (possibly long) load;
  // keys need the model's sub-configs and are checked when it is built.
  check_env_switches();
  for (const auto& [key, backend] : options.experts_implementation) (void)get_experts_backend(backend);
  auto ckpt = Checkpoint::open(dir);
  const std::string type = ckpt->model_type();
  LoadOptions o = options;
  if (!o.dtype) {
    // The checkpoint's own dtype, as transformers' dtype="auto" would pick.
    const auto& c = ckpt->config();
    std::string name = "float32";
    for (const char* key : {"dtype", "torch_dtype"}) {
      if (!c.contains(key) || c[key].is_null()) continue;
      if (!c[key].is_string())
        throw InvalidInput(dir + "/config.json: key '" + key + "' must be a string, got " +
                           io::json_type_name(c[key]));
      name = c[key].get<std::string>();
      break;
    }
    o.dtype = parse_dtype(name);
  }
  int64_t total = 0, done = 0;
  if (o.progress) {
    for (const auto& name : ckpt->names()) total += int64_t(ckpt->get(name).nbytes());
    ckpt->set_read_hook([&](int64_t bytes) { o.progress(done = std::min(total, done + bytes), total); });
  }
  for (const auto& e : model::architectures())
    if (type == e.model_type) {
      const auto t0 = std::chrono::steady_clock::now();
      std::unique_ptr<CausalLM> m;
      try {
        m = e.make(*ckpt, o);
      } catch (const std::bad_alloc&) {
        if (o.progress) ckpt->set_read_hook(nullptr);
        // Tensor allocations name their size themselves (moex::Error); this is any other one.
        throw Error("out of host memory while loading the " + type + " model from " + dir);
      } catch (...) {
        if (o.progress) ckpt->set_read_hook(nullptr);
        throw;
      }
      if (o.progress) {
        ckpt->set_read_hook(nullptr);  // it refers to this frame; the model may keep the checkpoint
        o.progress(total, total);
      }
      m->info_.load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const bool parallel = (o.ep_comm && o.ep_comm->size() > 1) || (o.tp_comm && o.tp_comm->size() > 1);
      if (!parallel) m->info_.unused_tensors = ckpt->unread();
      return m;
    }
  std::string list;
  for (const auto& t : supported_model_types()) list += (list.empty() ? "" : ", ") + t;
  throw UnknownName("unknown model_type '" + type + "' in " + dir + "/config.json; supported: " + list);
}

}  // namespace moex
