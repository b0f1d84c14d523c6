// Text <-> token ids from a Hugging Face `tokenizer.json`, exact against the `tokenizers` library.
//
// encode(text) runs the `tokenizers` pipeline:
//   1. added tokens (tokenizer.json "added_tokens") with normalized=false are found in the raw
//      text, leftmost-longest, honouring lstrip / rstrip / single_word; each match is one id;
//   2. every other segment is normalized on its own (NFC, NFD, NFKC, NFKD, Prepend, Replace,
//      Sequence), then split on the added tokens with normalized=true;
//   3. the pre-tokenizer splits each remaining segment into words (Split with a Regex or String
//      pattern and behavior Isolated / Removed / MergedWithPrevious / MergedWithNext /
//      Contiguous, invert; ByteLevel with or without its GPT-2 regex; Sequence);
//   4. the BPE model turns each word into ids: characters (or, with byte_fallback, `<0xNN>` byte
//      tokens, or the unk token, fused when fuse_unk) merged pair by pair, lowest merge rank
//      first and leftmost among equal ranks; ignore_merges maps a word found whole in the vocab
//      to its id. Characters with no id, no byte fallback and no unk token are dropped, as
//      `tokenizers` drops them;
//   5. with add_special_tokens, the post-processor (TemplateProcessing; ByteLevel, which only
//      moves offsets; Sequence) adds its special tokens around the ids.
// decode(ids) maps ids to tokens (added tokens first, then the model vocab), drops special added
// tokens when skip_special_tokens, runs the decoder chain (ByteLevel, Replace, ByteFallback, Fuse,
// Strip, Sequence) and joins the pieces. Byte sequences that are not UTF-8 become U+FFFD, one per
// maximal invalid subpart (ByteLevel) or one per byte (ByteFallback), as `tokenizers` does.
//
// Regexes are compiled with PCRE2 in UTF + UCP mode; `$` matches before any newline, as in the
// Oniguruma (Ruby syntax) engine that `tokenizers` uses. "truncation" and "padding" in
// tokenizer.json are batch settings and are not applied: callers bound lengths themselves.
//
// Errors: InvalidInput for an unreadable or malformed tokenizer.json (the message names the file
// and the key, e.g. "tokenizer.json: model.merges[3]: ..."), for text that is not UTF-8 and for
// ids outside the vocabulary; Unsupported naming the component and its type for a normalizer,
// pre-tokenizer, model, post-processor or decoder kind (or option) that is not implemented.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace moex {

struct TokenizerImpl;

class Tokenizer {
 public:
  // Loads tokenizer.json. Throws as described above.
  static Tokenizer from_file(const std::string& path);
  // Loads DIR/tokenizer.json, and DIR/tokenizer_config.json when present for the names of the
  // bos / eos / pad / unk tokens (bos_token_id() and friends); encoding does not depend on it.
  static Tokenizer from_dir(const std::string& dir);

  // Ids of `text` (UTF-8; throws InvalidInput otherwise). Empty text gives only the special
  // tokens of the post-processor (or nothing without add_special_tokens).
  std::vector<int64_t> encode(std::string_view text, bool add_special_tokens = true) const;
  // The token string of each id (byte-level tokens stay in their byte-level spelling).
  std::vector<std::string> tokens(const std::vector<int64_t>& ids) const;
  // Text of `ids`, always valid UTF-8. Throws InvalidInput for an id with no token.
  std::string decode(const std::vector<int64_t>& ids, bool skip_special_tokens = false) const;

  // Number of distinct ids: the model vocab plus added tokens that are not in it.
  int64_t vocab_size() const;
  std::optional<int64_t> token_to_id(std::string_view token) const;
  // Throws InvalidInput for an id with no token.
  std::string id_to_token(int64_t id) const;
  bool is_special(int64_t id) const;
  // Ids of the added tokens marked special, ascending.
  std::vector<int64_t> special_token_ids() const;
  // From tokenizer_config.json (from_dir only); empty when absent or not in the vocab.
  std::optional<int64_t> bos_token_id() const;
  std::optional<int64_t> eos_token_id() const;
  std::optional<int64_t> pad_token_id() const;
  std::optional<int64_t> unk_token_id() const;

  // Streaming decode: feed ids one at a time, get the text they complete. Text is emitted only
  // when the decoded tail does not end in U+FFFD, so a character whose bytes span several tokens
  // comes out whole once its last byte arrives; with a ByteFallback decoder, a run of <0xNN>
  // tokens comes out when the first other token arrives (one invalid byte turns the whole run
  // into U+FFFDs, so its text is known only then). finish() flushes what is held back. The
  // concatenation of all step() results and finish() equals decode(all ids, skip_special_tokens).
  // Every returned string is valid UTF-8. finish() ends the stream; the decoder then starts a new
  // one. Unknown ids throw InvalidInput and leave the state unchanged. The decoder keeps its own
  // reference to the tokenizer's data.
  class Decoder {
   public:
    explicit Decoder(const Tokenizer& tokenizer, bool skip_special_tokens = false);
    std::string step(int64_t id);
    std::string finish();

   private:
    std::shared_ptr<const struct TokenizerImpl> impl_;
    bool skip_special_;
    std::vector<int64_t> ids_;  // from the start of the context window
    size_t read_ = 0;           // ids_[0, read_) are already emitted
    std::string prefix_;        // decode(ids_[0, read_))
  };

  // The loaded pipeline (src/text); opaque to users.
  explicit Tokenizer(std::shared_ptr<const TokenizerImpl> impl) : impl_(std::move(impl)) {}

 private:
  std::shared_ptr<const TokenizerImpl> impl_;
};

}  // namespace moex
