// The text of generated ids as it is generated, for `moex generate --prompt`: each step's id goes
// through the tokenizer's streaming decoder, so only complete UTF-8 ever reaches the sink (a
// character whose bytes span several tokens comes out whole with its last byte).
//
// What is left out, as transformers' pipelines and TextStreamer print by default: special tokens
// (skip_special_tokens), and the stop token that ends the sequence (a stop signal, not text,
// even where it is not marked special). Ids that tokenizer.json has no token for (a model vocab
// padded past the tokenizer's) print nothing, as `tokenizers`' decode drops them.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "moex/tokenizer.hpp"

namespace moex::cli {

class TextStream {
 public:
  // `sink` receives each non-empty piece of text; `stop_ids` are the model's stop tokens.
  TextStream(const Tokenizer& tokenizer, std::vector<int64_t> stop_ids,
             std::function<void(const std::string&)> sink);
  // One generated id. After a stop id, later ids (the padding of a finished sequence) are ignored.
  void step(int64_t id);
  // Flushes what the decoder holds back (an incomplete character becomes U+FFFD).
  void finish();
  // Everything sent to the sink so far.
  const std::string& text() const { return text_; }

 private:
  void emit(const std::string& piece);

  const Tokenizer& tokenizer_;
  Tokenizer::Decoder decoder_;
  std::vector<int64_t> stop_ids_;
  std::function<void(const std::string&)> sink_;
  std::string text_;
  bool stopped_ = false;
};

}  // namespace moex::cli
