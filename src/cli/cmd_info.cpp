// `moex info`: loads a checkpoint and prints what moex made of it as JSON: architecture, dtype,
// sizes, parameter count, MoE layers, get_experts_implementation() and the load statistics.
#include <cstdio>

#include <nlohmann/json.hpp>

#include "cli/args.hpp"
#include "cli/command.hpp"
#include "cli/load_progress.hpp"
#include "moex/env_switches.hpp"
#include "moex/experts_auto.hpp"
#include "moex/model.hpp"
#if MOEX_WITH_CUDA
#include "ops/cuda/attention_cudnn.hpp"
#endif

namespace moex::cli {
namespace {

int run_info(const std::vector<std::string>& argv) {
  static const Usage kUsage{"info", "--model DIR [flags]",
                            "Load a checkpoint and describe it as JSON: architecture, sizes, MoE layers, stop\n"
                            "tokens, the experts map, the weights held per module group (storage dtype,\n"
                            "block and scale format of quantized weights, bytes), the load's bytes,\n"
                            "seconds and GB/s, the MOEX_* environment switches and their values, and with\n"
                            "--experts-implementation auto the table of its choices (grouped_mm or\n"
                            "batched_mm per call size, both timed on the device).",
                            load_flags()};
  Args a(argv, kUsage);
  LoadOptions o = load_options(a);
  std::unique_ptr<CausalLM> lm;
  {
    LoadProgress progress(o);
    lm = from_pretrained(a.require("model"), o);
  }
  const ModelInfo& i = lm->info();
  nlohmann::json j;
  j["model_type"] = i.model_type;
  j["architecture"] = i.architecture;
  j["dtype"] = std::string(dtype_name(i.dtype));
  j["device"] = i.device.str();
  j["parameter_count"] = i.parameter_count;
  j["vocab_size"] = i.vocab_size;
  j["hidden_size"] = i.hidden_size;
  j["num_layers"] = i.num_layers;
  j["moe_layers"] = i.moe_layers;
  j["num_moe_layers"] = i.moe_layers.size();
  j["num_experts"] = i.num_experts;
  j["experts_per_token"] = i.experts_per_token;
  j["sub_configs"] = i.sub_configs;
  j["eos_token_ids"] = lm->default_eos_token_ids();
  j["experts_implementation"] = lm->get_experts_implementation();
  // "auto": the table of its choices per call size (measured on this device at the first use of
  // the shape, or read from the cache file), with both backends' times.
  bool uses_auto = false;
  for (const auto& [key, backend] : lm->get_experts_implementation()) uses_auto |= backend == "auto";
  if (uses_auto) {
    lm->prepare_experts();
    nlohmann::json tables = nlohmann::json::array();
    for (const ExpertsAutoTable& t : experts_auto_tables()) {
      nlohmann::json rows = nlohmann::json::array();
      for (const ExpertsAutoRow& r : t.rows) {
        nlohmann::json e = {{"tokens_up_to", r.tokens}, {"choice", r.choice}};
        if (r.grouped_mm_ms > 0) e["grouped_mm_ms"] = r.grouped_mm_ms;
        if (r.batched_mm_ms > 0) e["batched_mm_ms"] = r.batched_mm_ms;
        if (r.grouped_mm_ms > 0 && r.batched_mm_ms > 0) e["batched_over_grouped"] = r.batched_mm_ms / r.grouped_mm_ms;
        rows.push_back(e);
      }
      tables.push_back({{"key", t.key}, {"source", t.source}, {"rows", rows}});
    }
    j["experts_auto"] = {{"cache_file", experts_auto_cache_file()}, {"tables", tables}};
  }
#if MOEX_WITH_CUDA
  // Long prompts' attention: cuDNN's fused kernel when it loads, else the project's flash kernel.
  if (i.device.is_cuda()) j["prompt_attention"] = ops::cuda::cudnn_attention_status();
#endif
  // What the load made of each module group: storage dtype, block and scale format of quantized
  // weights, and the bytes held.
  j["quantized_checkpoint"] = i.quantized_checkpoint;
  j["dequantized"] = i.dequantized;
  nlohmann::json groups = nlohmann::json::array();
  for (const WeightGroupInfo& g : i.weight_groups) {
    nlohmann::json e = {{"group", g.group},     {"storage", g.storage}, {"tensors", g.tensors},
                        {"elements", g.elements}, {"bytes", g.bytes}};
    if (!g.block.empty()) {
      e["block"] = g.block;
      e["scale_format"] = g.scale_format;
    }
    groups.push_back(e);
  }
  j["weights"] = groups;
  // Checkpoint tensors the load did not use (not tracked under expert / tensor parallelism).
  j["unused_tensors"] = i.unused_tensors;
  // The load: bytes placed on the device, wall time, and the rate (file reads, dtype conversion
  // and host->device copies together).
  // Every MOEX_* environment variable the library reads, with its value here: a measuring switch
  // that is set changes which kernels run.
  nlohmann::json switches = nlohmann::json::array();
  for (const EnvSwitch& s : env_switches())
    switches.push_back({{"name", s.name},
                        {"value", s.value ? nlohmann::json(*s.value) : nlohmann::json()},
                        {"accepts", s.accepts},
                        {"unset", s.unset},
                        {"meaning", s.meaning},
                        {"measuring", s.measuring}});
  j["env_switches"] = switches;
  j["load"] = {{"weight_bytes", i.weight_bytes},
               {"seconds", i.load_seconds},
               {"gb_per_second", i.load_seconds > 0 ? double(i.weight_bytes) / i.load_seconds / 1e9 : 0.0}};
  std::printf("%s\n", j.dump(2).c_str());
  return 0;
}

const Registration kInfo({"info", "describe a checkpoint as JSON, load time and rate included", run_info});

}  // namespace
}  // namespace moex::cli
