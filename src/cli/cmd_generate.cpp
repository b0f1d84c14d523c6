// `moex generate`: greedy or sampled continuation of one prompt, printed as JSON (sequence,
// timing, tokens/s) and optionally written to FILE.safetensors as int64 `sequences` [1, T + N].
#include <cstdio>

#include <nlohmann/json.hpp>

#include "cli/args.hpp"
#include "cli/command.hpp"
#include "moex/error.hpp"
#include "moex/model.hpp"
#include "moex/safetensors.hpp"

namespace moex::cli {
namespace {

int run_generate(const std::vector<std::string>& argv) {
  Args a(argv,
         {"model", "prompt-ids", "max-new-tokens", "temperature", "top-k", "top-p", "seed", "dtype",
          "device", "experts-implementation", "decode-switch", "out"},
         {"greedy"});
  const std::string dir = a.require("model");
  // An empty --prompt-ids reaches the library as an empty prompt, which reports it clearly.
  const std::string ids_text = a.require("prompt-ids");
  std::vector<int64_t> ids;
  if (!ids_text.empty()) ids = a.get_int_list("prompt-ids", {});

  GenerationOptions g;
  g.max_new_tokens = a.get_int("max-new-tokens", 20);
  const bool sampling_flags = a.has("temperature") || a.has("top-k") || a.has("top-p") || a.has("seed");
  if (a.has("greedy") && sampling_flags)
    throw InvalidInput("--greedy cannot be combined with --temperature / --top-k / --top-p / --seed");
  g.do_sample = sampling_flags;
  g.temperature = float(a.get_double("temperature", 1.0));
  g.top_k = a.get_int("top-k", 0);
  g.top_p = float(a.get_double("top-p", 1.0));
  g.seed = uint64_t(a.get_int("seed", 0));
  // The decode-stage switch (grouped_mm -> batched_mm for the decode steps): auto = on GPUs only.
  const std::string sw = a.get_or("decode-switch", "auto");
  if (sw == "auto") g.decode_switch = DecodeSwitch::kAuto;
  else if (sw == "on") g.decode_switch = DecodeSwitch::kOn;
  else if (sw == "off") g.decode_switch = DecodeSwitch::kOff;
  else throw InvalidInput("--decode-switch must be auto, on or off, got '" + sw + "'");

  LoadOptions o = make_load_options(a.get_or("dtype", ""), a.get_or("device", ""),
                                    a.get_or("experts-implementation", ""));
  auto lm = from_pretrained(dir, o);
  Tensor prompt = Tensor::from_ints(ids, {1, int64_t(ids.size())});
  Tensor seq = lm->generate(prompt, g);
  if (auto out = a.get("out")) save_safetensors(*out, {{"sequences", seq}});

  const GenerationStats& s = lm->last_generation_stats();
  nlohmann::json j;
  j["model_type"] = lm->info().model_type;
  j["dtype"] = std::string(dtype_name(lm->info().dtype));
  j["experts_implementation"] = lm->get_experts_implementation();
  j["sequences"] = {seq.to_int_vector()};
  j["prompt_tokens"] = s.prompt_tokens;
  j["new_tokens"] = s.new_tokens;
  j["prepare_seconds"] = s.prepare_seconds;
  j["prefill_seconds"] = s.prefill_seconds;
  j["decode_seconds"] = s.decode_seconds;
  // Decode rate: tokens after the first (which the prefill produced) over the decode time.
  j["decode_tokens_per_second"] =
      s.new_tokens > 1 && s.decode_seconds > 0 ? double(s.new_tokens - 1) / s.decode_seconds : 0.0;
  j["tokens_per_second"] = s.prefill_seconds + s.decode_seconds > 0
                               ? double(s.new_tokens) / (s.prefill_seconds + s.decode_seconds)
                               : 0.0;
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

const Registration kGenerate({"generate",
                              "continue a prompt (--model DIR --prompt-ids 1,2,3 [--max-new-tokens N] "
                              "[--greedy | --temperature T --top-k K --top-p P --seed S] "
                              "[--decode-switch auto|on|off])",
                              run_generate});

}  // namespace
}  // namespace moex::cli
