#include "cli/text_stream.hpp"

#include <algorithm>

#include "moex/error.hpp"

namespace moex::cli {

TextStream::TextStream(const Tokenizer& tokenizer, std::vector<int64_t> stop_ids,
                       std::function<void(const std::string&)> sink)
    : tokenizer_(tokenizer),
      decoder_(tokenizer, /*skip_special_tokens=*/true),
      stop_ids_(std::move(stop_ids)),
      sink_(std::move(sink)) {}

void TextStream::step(int64_t id) {
  if (stopped_) return;
  if (std::find(stop_ids_.begin(), stop_ids_.end(), id) != stop_ids_.end()) {
    stopped_ = true;
    return;
  }
  try {
    (void)tokenizer_.id_to_token(id);
  } catch (const InvalidInput&) {
    return;  // no token for this id: nothing to print (tokenizers' decode drops it too)
  }
  emit(decoder_.step(id));
}

void TextStream::finish() { emit(decoder_.finish()); }

void TextStream::emit(const std::string& piece) {
  if (piece.empty()) return;
  text_ += piece;
  sink_(piece);
}

}  // namespace moex::cli
