// `moex logits`: reads int64 `input_ids` [B, T] and, optionally, an integer `attention_mask`
// [B, T] (left padding: each row zeros, then ones; what a tokenizer with padding_side="left"
// returns) from a safetensors file, runs the model and writes float32 `logits` [B, T, vocab];
// prints a one-line JSON summary. Logits at padding positions are not meaningful.
#include <cstdio>

#include <nlohmann/json.hpp>

#include "cli/args.hpp"
#include "cli/command.hpp"
#include "cli/load_progress.hpp"
#include "moex/error.hpp"
#include "moex/model.hpp"
#include "moex/safetensors.hpp"

namespace moex::cli {
namespace {

// The one-line JSON summary of a run.
void print_summary(const CausalLM& lm, const Tensor& logits, bool masked, const std::string& out) {
  nlohmann::json j;
  j["model_type"] = lm.info().model_type;
  j["dtype"] = std::string(dtype_name(lm.info().dtype));
  j["experts_implementation"] = lm.get_experts_implementation();
  j["logits_shape"] = logits.shape();
  j["attention_mask"] = masked;
  j["out"] = out;
  // File names are bytes, JSON text is UTF-8: a name that is not valid UTF-8 is shown with
  // U+FFFD in place of the bad bytes (the file itself was written under the name given).
  std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
}

int run_logits(const std::vector<std::string>& argv) {
  static const Usage kUsage = [] {
    Usage u{"logits", "--model DIR --inputs IN.safetensors --out OUT.safetensors [flags]",
            "Run the model on int64 input_ids [B, T] (and an optional left-padding attention_mask\n"
            "[B, T] of 0/1) read from IN and write float32 logits [B, T, vocab] to OUT.",
            load_flags()};
    u.flags.push_back({"inputs", "IN", "safetensors file with input_ids (and attention_mask)"});
    u.flags.push_back({"out", "OUT", "safetensors file to write the logits to"});
    for (auto& f : ep_flags()) u.flags.push_back(f);
    return u;
  }();
  Args a(argv, kUsage);
  const std::string dir = a.require("model"), inputs = a.require("inputs"), out = a.require("out");
  auto file = SafetensorsFile::open(inputs);
  if (!file->contains("input_ids"))
    throw InvalidInput("'" + inputs + "' has no tensor 'input_ids' (int64 [batch, tokens])");
  Tensor ids = file->get("input_ids");
  Tensor mask = file->contains("attention_mask") ? file->get("attention_mask") : Tensor();
  // Every rank (--ep-size) computes the same logits; the lead writes and prints them.
  run_ep_ranks(a, load_options(a), [&](LoadOptions& o, bool lead) {
    auto lm = from_pretrained(dir, o);
    note_unused_tensors(lm->info(), lead ? stderr : nullptr);
    Tensor logits = lm->logits(ids, mask);
    if (!lead) return;
    save_safetensors(out, {{"logits", logits}});
    print_summary(*lm, logits, mask.defined(), out);
  });
  return 0;
}

const Registration kLogits({"logits", "write float32 logits for int64 input_ids read from a safetensors file",
                            run_logits});

}  // namespace
}  // namespace moex::cli
