// Streaming decode. The window ids_ holds the already-emitted context ids_[0, read_) and the ids
// not yet emitted. Decoding the window with its context and cutting off decode(context) gives the
// new text with the decoder's context effects intact (a Strip of the first space applies only at
// the true start, byte runs are completed across tokens). Text is held back while it ends in
// U+FFFD, i.e. while the last character may still be waiting for bytes, and, with a ByteFallback
// decoder, while the last token is a <0xNN> byte: the run's text is known only once the run ends,
// because one invalid byte turns the whole run into U+FFFDs.
#include "moex/error.hpp"
#include "moex/tokenizer.hpp"
#include "text/utf8.hpp"

namespace moex {

// tokenizer.cpp: whether `id` is a byte token that a ByteFallback decoder joins with what follows.
bool stream_holds(const TokenizerImpl& impl, int64_t id);

Tokenizer::Decoder::Decoder(const Tokenizer& tokenizer, bool skip_special_tokens)
    : impl_(tokenizer.impl_), skip_special_(skip_special_tokens) {}

std::string Tokenizer::Decoder::step(int64_t id) {
  const Tokenizer tok(impl_);
  tok.id_to_token(id);  // throws for an unknown id before the window changes
  ids_.push_back(id);
  if (stream_holds(*impl_, id)) return {};
  const std::string s = tok.decode(ids_, skip_special_);
  if (s.size() <= prefix_.size() || s.compare(0, prefix_.size(), prefix_) != 0 ||
      s.ends_with(text::kReplacementChar))
    return {};
  std::string out = s.substr(prefix_.size());
  // The emitted ids become the context: keep only those after the old context.
  ids_.erase(ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(read_));
  read_ = ids_.size();
  prefix_ = tok.decode(ids_, skip_special_);
  return out;
}

std::string Tokenizer::Decoder::finish() {
  const Tokenizer tok(impl_);
  const std::string s = tok.decode(ids_, skip_special_);
  std::string out = s.size() > prefix_.size() && s.compare(0, prefix_.size(), prefix_) == 0
                        ? s.substr(prefix_.size()) : std::string();
  ids_.clear();
  read_ = 0;
  prefix_.clear();
  return out;
}

}  // namespace moex
