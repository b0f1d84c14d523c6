// `moex tokenize`: text -> ids and tokens, or ids -> text, with the tokenizer.json of a model
// directory (a directory holding only tokenizer.json is enough). Prints one JSON object.
#include <cstdio>

#include <nlohmann/json.hpp>

#include "cli/args.hpp"
#include "cli/command.hpp"
#include "moex/error.hpp"
#include "moex/tokenizer.hpp"

namespace moex::cli {
namespace {

int run_tokenize(const std::vector<std::string>& argv) {
  static const Usage kUsage{
      "tokenize",
      "--model DIR (--text T [--no-special-tokens] | --decode IDS [--skip-special-tokens])",
      "Encode text to ids and tokens, or decode ids to text, with DIR/tokenizer.json (a folder\n"
      "holding only tokenizer.json is enough). Prints one JSON object.",
      {{"model", "DIR", "folder holding tokenizer.json (and tokenizer_config.json, optional)"},
       {"text", "T", "text to encode (UTF-8); prints {\"ids\", \"tokens\"}", true},
       {"no-special-tokens", "", "encode without the post-processor's special tokens (BOS, ...)"},
       {"decode", "IDS", "comma-separated ids to decode; prints {\"text\"}"},
       {"skip-special-tokens", "", "decode without the special tokens"}}};
  Args a(argv, kUsage);
  const Tokenizer tok = Tokenizer::from_dir(a.require("model"));
  if (a.has("text") == a.has("decode")) throw InvalidInput("give exactly one of --text and --decode");
  nlohmann::json j;
  if (a.has("text")) {
    if (a.has("skip-special-tokens")) throw InvalidInput("--skip-special-tokens goes with --decode");
    const auto ids = tok.encode(*a.get("text"), !a.has("no-special-tokens"));
    j["ids"] = ids;
    j["tokens"] = tok.tokens(ids);
  } else {
    if (a.has("no-special-tokens")) throw InvalidInput("--no-special-tokens goes with --text");
    j["text"] = tok.decode(a.get_int_list("decode", {}), a.has("skip-special-tokens"));
  }
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

const Registration kTokenize({"tokenize", "encode text to ids or decode ids to text with tokenizer.json",
                              run_tokenize});

}  // namespace
}  // namespace moex::cli
