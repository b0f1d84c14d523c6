// libFuzzer target for tokenizer.json as Tokenizer::from_file reads it: the strict JSON parser,
// the component tables (normalizers, pre-tokenizers, BPE model, post-processor, decoders) and
// the regex compilation, then encode and decode of a short fixed text with whatever loaded.
//
// Loading must succeed or throw moex::InvalidInput / moex::Unsupported; encoding the fixed text
// (valid UTF-8) must succeed, and decoding its ids must give valid UTF-8 (or, for ids the
// tokenizer cannot spell, InvalidInput). Any other exception escapes, and libFuzzer reports it as
// a crash; so do sanitizer findings and hangs.
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "fuzz_folder.hpp"
#include "moex/error.hpp"
#include "moex/tokenizer.hpp"
#include "text/utf8.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = moex::fuzz::scratch_dir() + "/tokenizer.json";
  moex::fuzz::write_file(path, data, size);
  std::optional<moex::Tokenizer> tok;
  try {
    tok.emplace(moex::Tokenizer::from_file(path));
  } catch (const moex::InvalidInput&) {
    return 0;
  } catch (const moex::Unsupported&) {
    return 0;
  }
  // ASCII, a multi-byte character, digits, spaces and a newline: the usual regex branches.
  static const std::string kText = "Hello, world! 123  caf\xC3\xA9\n\xE4\xB8\xAD";
  const std::vector<int64_t> ids = tok->encode(kText);
  for (bool skip : {false, true}) {
    try {
      const std::string text = tok->decode(ids, skip);
      if (moex::text::utf8_first_invalid(text) != std::string::npos) std::abort();
    } catch (const moex::InvalidInput&) {
    }
  }
  return 0;
}
