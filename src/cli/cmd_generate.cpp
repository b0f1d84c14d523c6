// `moex generate`: greedy or sampled continuation of one text prompt, streamed as text, or of one
// prompt or a batch of prompts given as ids, printed as JSON (sequences, timing, tokens/s); the
// sequences can also be written to FILE.safetensors as int64 `sequences` [B, T + N].
//
// A batch ("1,2,3;4,5") of prompts of different lengths is left-padded to the longest with the
// model's pad token and run with an attention mask, as transformers' tokenizer(padding_side=
// "left") + generate do; the output keeps the padding where it was.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <utility>

#include <nlohmann/json.hpp>

#include "cli/args.hpp"
#include "cli/command.hpp"
#include "cli/load_progress.hpp"
#include "cli/seed.hpp"
#include "cli/text_stream.hpp"
#include "moex/checkpoint.hpp"
#include "moex/error.hpp"
#include "moex/model.hpp"
#include "moex/safetensors.hpp"
#include "moex/tokenizer.hpp"

namespace moex::cli {
namespace {

// "1,2,3;4,5" -> {{1,2,3},{4,5}}. Every sequence needs at least one id; one empty string is an
// empty prompt (reported by the library, as for a single prompt).
std::vector<std::vector<int64_t>> parse_prompts(const std::string& text) {
  if (text.empty()) return {{}};
  std::vector<std::vector<int64_t>> out;
  size_t start = 0;
  while (true) {
    const size_t end = text.find(';', start);
    const std::string item = text.substr(start, end == std::string::npos ? std::string::npos : end - start);
    const std::string which = "sequence " + std::to_string(out.size()) + " of --prompt-ids";
    if (item.empty())
      throw InvalidInput("empty " + which + " '" + text + "'; separate non-empty sequences of ids with ';'");
    std::vector<int64_t> ids;
    size_t s = 0;
    while (true) {
      const size_t c = item.find(',', s);
      const std::string tok = item.substr(s, c == std::string::npos ? std::string::npos : c - s);
      if (tok.empty()) throw InvalidInput("empty id in " + which + " '" + item + "'");
      ids.push_back(parse_int(tok, which));
      if (c == std::string::npos) break;
      s = c + 1;
    }
    out.push_back(std::move(ids));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return out;
}

// The id that pads shorter prompts, and where it came from: generation_config.json's
// pad_token_id, else config.json's (or its text_config's), else the first stop token (what
// transformers' generate falls back to), else 0.
// A pad_token_id that is present but not an id of the vocabulary (a string, a float, a negative
// or too large number) is an error naming the file and key, not a silent fallback.
std::pair<int64_t, std::string> pad_token(const std::string& dir, const CausalLM& lm) {
  auto ckpt = Checkpoint::open(dir);
  const int64_t vocab = lm.info().vocab_size;
  auto read = [&](const nlohmann::json& j, const std::string& where) -> std::optional<int64_t> {
    auto it = j.find("pad_token_id");
    if (it == j.end() || it->is_null()) return std::nullopt;
    const nlohmann::json& v = it->is_array() && !it->empty() ? (*it)[0] : *it;
    if (!v.is_number_integer())
      throw InvalidInput(dir + "/" + where + ": pad_token_id must be a token id (an integer or a "
                         "list of them), got " + it->dump());
    const int64_t id = v.get<int64_t>();
    if (id < 0 || (vocab > 0 && id >= vocab))
      throw InvalidInput(dir + "/" + where + ": pad_token_id " + std::to_string(id) +
                         " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
    return id;
  };
  if (auto id = read(ckpt->generation_config(), "generation_config.json"))
    return {*id, "generation_config.json pad_token_id"};
  const nlohmann::json& c = ckpt->config();
  if (auto id = read(c, "config.json")) return {*id, "config.json pad_token_id"};
  if (auto tc = c.find("text_config"); tc != c.end() && tc->is_object())
    if (auto id = read(*tc, "config.json (text_config)")) return {*id, "config.json text_config.pad_token_id"};
  if (!lm.default_eos_token_ids().empty()) return {lm.default_eos_token_ids()[0], "eos_token_id"};
  return {0, "default 0 (no pad_token_id or eos_token_id)"};
}

const Usage& generate_usage() {
  static const Usage usage = [] {
    Usage u{"generate", "--model DIR (--prompt TEXT | --prompt-file PATH | --prompt-ids IDS) [flags]",
            "Continue a prompt. A text prompt (--prompt, --prompt-file) is encoded with DIR/tokenizer.json\n"
            "(special tokens added, as tokenizers' encode does) and the continuation is printed as it is\n"
            "generated, then a newline; special tokens and the final stop token are not printed.\n"
            "--prompt-ids takes ids, a batch as \"1,2,3;4,5\" (left-padded with the pad token and masked),\n"
            "and prints a JSON summary. Generation stops at the checkpoint's stop tokens\n"
            "(generation_config.json eos_token_id, else config.json) or after --max-new-tokens.",
            load_flags()};
    u.flags.insert(u.flags.end(),
                   {{"prompt", "TEXT", "text prompt (UTF-8)", true},
                    {"prompt-file", "PATH", "text prompt read from a file, verbatim (- reads stdin)"},
                    {"prompt-ids", "IDS", "token ids \"1,2,3\", or a batch \"1,2,3;4,5\"; prints JSON", true},
                    {"max-new-tokens", "N", "at most N new tokens per sequence (default 20)"},
                    {"greedy", "", "argmax decoding (the default; excludes the sampling flags)"},
                    {"temperature", "T", "sample, with this temperature (> 0, default 1)"},
                    {"top-k", "K", "sample among the K most likely tokens (0 = all)"},
                    {"top-p", "P", "sample from the smallest set with probability >= P (default 1)"},
                    {"seed", "S", "sample, seeded with S (default 0)"},
                    {"json", "", "text prompt: print the JSON summary (with \"text\") instead of streaming"},
                    {"out", "FILE", "also write the int64 sequences [B, T + N] to FILE.safetensors"}});
    for (auto& f : decode_flags()) u.flags.push_back(f);
    for (auto& f : ep_flags()) u.flags.push_back(f);
    return u;
  }();
  return usage;
}

// The text prompt's bytes: --prompt as given, --prompt-file verbatim ("-" = stdin).
std::string read_text_prompt(const Args& a) {
  if (auto p = a.get("prompt")) return *p;
  const std::string path = a.require("prompt-file");
  std::ifstream file;
  std::istream* in = &std::cin;
  if (path != "-") {
    if (std::filesystem::is_directory(path)) throw InvalidInput("--prompt-file '" + path + "' is a directory");
    file.open(path, std::ios::binary);
    if (!file) throw InvalidInput("cannot open --prompt-file '" + path + "': " + std::strerror(errno));
    in = &file;
  }
  std::ostringstream buf;
  buf << in->rdbuf();
  if (in->bad()) throw InvalidInput("cannot read --prompt-file '" + path + "'");
  return buf.str();
}

// The checkpoint's tokenizer, checked to exist before the (possibly long) model load.
Tokenizer load_tokenizer(const std::string& dir) {
  if (!std::filesystem::exists(std::filesystem::path(dir) / "tokenizer.json"))
    throw InvalidInput(dir + " has no tokenizer.json: a text prompt needs the checkpoint's tokenizer "
                       "(or give token ids with --prompt-ids)");
  return Tokenizer::from_dir(dir);
}

int run_generate(const std::vector<std::string>& argv) {
  Args a(argv, generate_usage());
  const std::string dir = a.require("model");
  const int n_prompts = int(a.has("prompt")) + int(a.has("prompt-file")) + int(a.has("prompt-ids"));
  if (n_prompts != 1) throw InvalidInput("give exactly one of --prompt, --prompt-file and --prompt-ids");
  const bool text_mode = !a.has("prompt-ids");
  const bool json = a.has("json") || !text_mode;

  GenerationOptions g;
  g.max_new_tokens = a.get_int("max-new-tokens", 20);
  const bool sampling_flags = a.has("temperature") || a.has("top-k") || a.has("top-p") || a.has("seed");
  if (a.has("greedy") && sampling_flags)
    throw InvalidInput("--greedy cannot be combined with --temperature / --top-k / --top-p / --seed");
  g.do_sample = sampling_flags;
  g.temperature = float(a.get_double("temperature", 1.0));
  g.top_k = a.get_int("top-k", 0);
  g.top_p = float(a.get_double("top-p", 1.0));
  g.seed = parse_seed(a.get("seed"), 0);
  apply_decode_flags(a, g);

  // Text prompts: read and encode before the load, so that a missing tokenizer or an unreadable
  // file is reported at once.
  std::optional<Tokenizer> tok;
  std::vector<std::vector<int64_t>> prompts;
  if (text_mode) {
    tok = load_tokenizer(dir);
    prompts = {tok->encode(read_text_prompt(a), /*add_special_tokens=*/true)};
  } else {
    // An empty --prompt-ids reaches the library as an empty prompt, which reports it clearly.
    prompts = parse_prompts(a.require("prompt-ids"));
  }

  // Every rank (--ep-size) loads and generates the same; the lead alone prints.
  run_ep_ranks(a, load_options(a), [&](LoadOptions& o, bool lead) {
    std::unique_ptr<CausalLM> lm;
    {
      std::optional<LoadProgress> progress;
      if (lead) progress.emplace(o);
      lm = from_pretrained(dir, o);
    }
    note_unused_tensors(lm->info(), lead ? stderr : nullptr);
    GenerationOptions gr = g;
    const int64_t vocab = lm->info().vocab_size;
    if (tok)
      for (int64_t id : prompts[0])
        if (id < 0 || id >= vocab)
          throw InvalidInput("the prompt's token id " + std::to_string(id) + " (from " + dir +
                             "/tokenizer.json) is outside the model's vocabulary [0, " + std::to_string(vocab) +
                             "): the tokenizer does not belong to this checkpoint");
    const auto [pad_id, pad_source] = pad_token(dir, *lm);
    const int64_t B = int64_t(prompts.size());
    int64_t T = 0;
    for (const auto& p : prompts) T = std::max(T, int64_t(p.size()));
    std::vector<int64_t> ids, mask, padding;
    for (const auto& p : prompts) {
      const int64_t n_pad = T - int64_t(p.size());
      padding.push_back(n_pad);
      ids.insert(ids.end(), size_t(n_pad), pad_id);
      ids.insert(ids.end(), p.begin(), p.end());
      mask.insert(mask.end(), size_t(n_pad), 0);
      mask.insert(mask.end(), p.size(), 1);
    }
    // Checked here so that a pad id the vocabulary lacks is not reported as a prompt id.
    if (T > 0 && *std::max_element(padding.begin(), padding.end()) > 0 && (pad_id < 0 || pad_id >= vocab))
      throw InvalidInput("pad token id " + std::to_string(pad_id) + " (" + pad_source +
                         ") is outside the vocabulary [0, " + std::to_string(vocab) + ")");

    // Text: every step's id goes through the streaming decoder; printed and flushed at once unless
    // the summary is asked for instead.
    std::optional<TextStream> stream;
    if (tok && lead) {
      stream.emplace(*tok, gr.eos_token_ids.value_or(lm->default_eos_token_ids()), [json](const std::string& piece) {
        if (json) return;
        std::fwrite(piece.data(), 1, piece.size(), stdout);
        std::fflush(stdout);
      });
      gr.on_step = [&stream](std::span<const int64_t> step_ids) { stream->step(step_ids[0]); };
    }
    Tensor seq = lm->generate(Tensor::from_ints(ids, {B, T}), gr, Tensor::from_ints(mask, {B, T}));
    if (!lead) return;
    if (stream) {
      stream->finish();
      if (!json) std::printf("\n");
    }
    if (auto out = a.get("out")) save_safetensors(*out, {{"sequences", seq}});

    const GenerationStats& s = lm->last_generation_stats();
    if (!json) {
      if (isatty(fileno(stderr)))
        std::fprintf(stderr, "moex generate: %lld prompt + %lld new tokens; %.2f s to the first, then %.1f tokens/s\n",
                     (long long)s.prompt_tokens, (long long)s.new_tokens, s.prefill_seconds,
                     s.new_tokens > 1 && s.decode_seconds > 0 ? double(s.new_tokens - 1) / s.decode_seconds : 0.0);
      return;
    }
    nlohmann::json j;
    j["model_type"] = lm->info().model_type;
    j["dtype"] = std::string(dtype_name(lm->info().dtype));
    j["experts_implementation"] = lm->get_experts_implementation();
    j["decode_experts_implementation"] = s.decode_experts_implementation;
    if (!s.decode_switch_note.empty()) j["decode_switch_note"] = s.decode_switch_note;
    const std::vector<int64_t> flat = seq.to_int_vector();
    const int64_t L = seq.size(1);
    j["sequences"] = nlohmann::json::array();
    for (int64_t b = 0; b < B; ++b)
      j["sequences"].push_back(std::vector<int64_t>(flat.begin() + b * L, flat.begin() + (b + 1) * L));
    if (stream) j["text"] = stream->text();  // the continuation, as it would have been streamed
    j["prompt_tokens"] = s.prompt_tokens;  // per sequence, padding included
    j["padding"] = padding;                // left-padding columns of each sequence
    j["pad_token_id"] = pad_id;
    j["pad_token_id_source"] = pad_source;
    j["new_tokens"] = s.new_tokens;
    j["prepare_seconds"] = s.prepare_seconds;
    j["graph"] = s.graph;
    if (!s.graph_note.empty()) j["graph_note"] = s.graph_note;
    j["load_seconds"] = lm->info().load_seconds;
    j["load_gb_per_second"] =
        lm->info().load_seconds > 0 ? double(lm->info().weight_bytes) / lm->info().load_seconds / 1e9 : 0.0;
    j["prefill_seconds"] = s.prefill_seconds;
    j["decode_seconds"] = s.decode_seconds;
    // Decode rate: tokens after the first (which the prefill produced) over the decode time.
    j["decode_tokens_per_second"] =
        s.new_tokens > 1 && s.decode_seconds > 0 ? double(s.new_tokens - 1) / s.decode_seconds : 0.0;
    j["tokens_per_second"] = s.prefill_seconds + s.decode_seconds > 0
                                 ? double(s.new_tokens) / (s.prefill_seconds + s.decode_seconds)
                                 : 0.0;
    std::printf("%s\n", j.dump().c_str());
  });
  return 0;
}

const Registration kGenerate({"generate", "continue a text prompt (streamed) or token-id prompts (JSON)",
                              run_generate});

}  // namespace
}  // namespace moex::cli
