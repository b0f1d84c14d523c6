// Tokenizer: loads tokenizer.json into the stage objects (components.hpp, bpe.hpp) and runs the
// encode / decode pipelines described in include/moex/tokenizer.hpp.
#include "moex/tokenizer.hpp"

#include <algorithm>
#include <filesystem>
#include <set>
#include <unordered_map>

#include <utf8proc.h>

#include "io/strict_json.hpp"
#include "moex/error.hpp"
#include "text/bpe.hpp"
#include "text/components.hpp"
#include "text/utf8.hpp"

namespace moex {

using text::json;
using text::Where;

namespace {

struct AddedToken {
  int64_t id;
  std::string content;  // as matched: normalized tokens are matched in their normalized form
  bool special, lstrip, rstrip, single_word, normalized;
};

// Adds ids around the encoded sequence (TemplateProcessing, Bert/Roberta single-sequence form);
// ByteLevel only moves offsets, which moex does not report, so it adds nothing.
struct PostProcessor {
  std::vector<std::vector<int64_t>> parts;  // an empty part stands for the sequence itself
  bool active = false;
};

bool is_space(char32_t c) {
  return (c >= 9 && c <= 13) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

bool is_word_char(char32_t c) {
  const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) ||
         (cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO);
}

char32_t last_char(std::string_view s) {
  size_t i = s.size();
  while (i > 0 && (static_cast<unsigned char>(s[i - 1]) & 0xC0) == 0x80) --i;
  size_t len = 0;
  return i > 0 ? text::utf8_decode(s, i - 1, &len) : 0;
}

}  // namespace

struct TokenizerImpl {
  std::string file;
  std::unique_ptr<text::Normalizer> normalizer;
  std::unique_ptr<text::PreTokenizer> pre_tokenizer;
  std::unique_ptr<text::Bpe> model;
  std::unique_ptr<text::DecodeStep> decoder;
  PostProcessor post;
  std::vector<AddedToken> raw_added, normalized_added;
  std::unordered_map<int64_t, std::string> id_to_token;  // added tokens override the model vocab
  std::unordered_map<std::string, int64_t> token_to_id;
  std::set<int64_t> special;
  std::optional<int64_t> bos, eos, pad, unk;
  bool byte_fallback_decoder = false;  // the decoder chain has a ByteFallback step

  struct Segment {
    std::string text;
    int64_t id;  // -1: text still to tokenize
  };
  // Leftmost-longest matching of added tokens, as `tokenizers` does with Aho-Corasick.
  static std::vector<Segment> split_added(const std::string& s, const std::vector<AddedToken>& toks);
  void encode_segment(const std::string& s, std::vector<int64_t>& ids) const;
};

std::vector<TokenizerImpl::Segment> TokenizerImpl::split_added(const std::string& s,
                                                               const std::vector<AddedToken>& toks) {
  if (toks.empty()) return {{s, -1}};
  // Only positions whose byte can start some token are tried.
  bool first[256] = {};
  for (const AddedToken& t : toks)
    if (!t.content.empty()) first[static_cast<unsigned char>(t.content[0])] = true;
  std::vector<Segment> out;
  size_t emitted = 0, i = 0;
  while (i < s.size()) {
    if (!first[static_cast<unsigned char>(s[i])]) {
      ++i;
      continue;
    }
    const AddedToken* best = nullptr;
    for (const AddedToken& t : toks)
      if (!t.content.empty() && s.compare(i, t.content.size(), t.content) == 0 &&
          (!best || t.content.size() > best->content.size()))
        best = &t;
    if (!best) {
      i += std::max<size_t>(1, text::utf8_valid_len(s, i));
      continue;
    }
    size_t b = i, e = i + best->content.size();
    if (best->single_word) {
      size_t len = 0;
      const bool left_ok = b == 0 || !is_word_char(last_char(std::string_view(s).substr(0, b)));
      const bool right_ok = e == s.size() || !is_word_char(text::utf8_decode(s, e, &len));
      if (!left_ok || !right_ok) {
        i = e;  // the match is consumed without being used, as the matcher moves past it
        continue;
      }
    }
    if (best->lstrip)
      while (b > emitted) {
        const std::string_view head = std::string_view(s).substr(emitted, b - emitted);
        const char32_t c = last_char(head);
        if (!is_space(c)) break;
        std::string tmp;
        text::utf8_append(tmp, c);
        b -= tmp.size();
      }
    if (best->rstrip)
      while (e < s.size()) {
        size_t len = 0;
        if (!is_space(text::utf8_decode(s, e, &len))) break;
        e += len;
      }
    if (b > emitted) out.push_back({s.substr(emitted, b - emitted), -1});
    out.push_back({s.substr(b, e - b), best->id});
    emitted = i = e;
  }
  if (emitted < s.size()) out.push_back({s.substr(emitted), -1});
  return out;
}

void TokenizerImpl::encode_segment(const std::string& s, std::vector<int64_t>& ids) const {
  const std::string norm = normalizer ? normalizer->normalize(s) : s;
  for (Segment& sub : split_added(norm, normalized_added)) {
    if (sub.id >= 0) {
      ids.push_back(sub.id);
      continue;
    }
    if (sub.text.empty()) continue;
    std::vector<std::string> words{std::move(sub.text)};
    if (pre_tokenizer) pre_tokenizer->split(words);
    for (const std::string& w : words) model->encode_word(w, ids);
  }
}

namespace {

std::vector<int64_t> id_list(const json& j, const Where& w) {
  if (!j.is_array()) throw InvalidInput(w.str() + ": expected an array of ids");
  std::vector<int64_t> v;
  for (size_t i = 0; i < j.size(); ++i) {
    if (!j[i].is_number_integer()) throw InvalidInput(w.at(i).str() + ": expected an integer id");
    v.push_back(j[i].get<int64_t>());
  }
  return v;
}

// Reads a post-processor into the list of parts that surround a single sequence.
void load_post(const json& j, const Where& w, PostProcessor& p) {
  const std::string t = text::type_of(j, w);
  if (t == "ByteLevel") return;
  if (t == "Sequence") {
    const json& list = text::field(j, "processors", w);
    if (!list.is_array()) throw InvalidInput(w.at("processors").str() + ": expected an array");
    for (size_t i = 0; i < list.size(); ++i) load_post(list[i], w.at("processors").at(i), p);
    return;
  }
  if (p.active) text::unsupported(w, "a second post-processor that adds tokens ('" + t + "')");
  if (t == "TemplateProcessing") {
    const json& single = text::field(j, "single", w);
    const json& specials = text::object_at(text::field(j, "special_tokens", w), w.at("special_tokens"));
    if (!single.is_array()) throw InvalidInput(w.at("single").str() + ": expected an array");
    for (size_t i = 0; i < single.size(); ++i) {
      const Where wi = w.at("single").at(i);
      const json& item = text::object_at(single[i], wi);
      if (item.contains("Sequence")) {
        p.parts.emplace_back();
      } else if (item.contains("SpecialToken")) {
        const std::string name = text::string_field(item.at("SpecialToken"), "id", wi.at("SpecialToken"));
        if (!specials.contains(name))
          throw InvalidInput(w.at("special_tokens").str() + ": no entry for '" + name + "'");
        p.parts.push_back(id_list(text::field(specials.at(name), "ids", w.at("special_tokens").at(name)),
                                  w.at("special_tokens").at(name).at("ids")));
      } else {
        throw InvalidInput(wi.str() + ": expected \"Sequence\" or \"SpecialToken\"");
      }
    }
  } else if (t == "BertProcessing" || t == "RobertaProcessing") {
    auto pair_id = [&](const char* k) {
      const json& v = text::field(j, k, w);
      if (!v.is_array() || v.size() != 2 || !v[1].is_number_integer())
        throw InvalidInput(w.at(k).str() + ": expected [token, id]");
      return std::vector<int64_t>{v[1].get<int64_t>()};
    };
    p.parts = {pair_id("cls"), {}, pair_id("sep")};
  } else {
    text::unsupported(w, "post_processor type '" + t + "'");
  }
  p.active = true;
}

std::optional<int64_t> config_token(const json& cfg, const char* key, const TokenizerImpl& impl) {
  auto it = cfg.find(key);
  if (it == cfg.end()) return std::nullopt;
  std::string name;
  if (it->is_string()) name = it->get<std::string>();
  else if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
    name = (*it)["content"].get<std::string>();
  else return std::nullopt;
  auto t = impl.token_to_id.find(name);
  return t == impl.token_to_id.end() ? std::nullopt : std::optional<int64_t>(t->second);
}

}  // namespace

Tokenizer Tokenizer::from_file(const std::string& path) {
  const json root = io::read_json_file(path);
  const Where w{path, ""};
  text::object_at(root, w);
  auto impl = std::make_shared<TokenizerImpl>();
  impl->file = path;
  auto optional = [&](const char* k) -> const json* {
    auto it = root.find(k);
    return it == root.end() || it->is_null() ? nullptr : &*it;
  };
  if (const json* n = optional("normalizer")) impl->normalizer = text::make_normalizer(*n, w.at("normalizer"));
  if (const json* p = optional("pre_tokenizer")) impl->pre_tokenizer = text::make_pre_tokenizer(*p, w.at("pre_tokenizer"));
  const json& model = text::object_at(text::field(root, "model", w), w.at("model"));
  // Old files omit the model type; a "merges" list identifies BPE.
  const std::string mtype = model.contains("type") ? text::type_of(model, w.at("model"))
                            : model.contains("merges") ? "BPE" : "";
  if (mtype != "BPE") text::unsupported(w.at("model"), "model type '" + mtype + "'");
  impl->model = std::make_unique<text::Bpe>(model, w.at("model"));
  if (const json* p = optional("post_processor")) load_post(*p, w.at("post_processor"), impl->post);
  if (const json* d = optional("decoder")) {
    impl->decoder = text::make_decoder(*d, w.at("decoder"));
    impl->byte_fallback_decoder = d->dump().find("\"ByteFallback\"") != std::string::npos;
  }

  for (const auto& [tok, id] : impl->model->vocab()) {
    impl->id_to_token[id] = tok;
    impl->token_to_id[tok] = id;
  }
  if (const json* added = optional("added_tokens")) {
    if (!added->is_array()) throw InvalidInput(w.at("added_tokens").str() + ": expected an array");
    for (size_t i = 0; i < added->size(); ++i) {
      const Where wi = w.at("added_tokens").at(i);
      const json& a = text::object_at((*added)[i], wi);
      const json& idj = text::field(a, "id", wi);
      if (!idj.is_number_integer() || idj.get<int64_t>() < 0)
        throw InvalidInput(wi.at("id").str() + ": expected a non-negative integer");
      AddedToken t{idj.get<int64_t>(), text::string_field(a, "content", wi),
                   text::bool_field(a, "special", wi, false), text::bool_field(a, "lstrip", wi, false),
                   text::bool_field(a, "rstrip", wi, false), text::bool_field(a, "single_word", wi, false),
                   false};
      t.normalized = text::bool_field(a, "normalized", wi, !t.special);
      if (t.content.empty()) throw InvalidInput(wi.at("content").str() + ": empty token");
      impl->id_to_token[t.id] = t.content;
      impl->token_to_id[t.content] = t.id;
      if (t.special) impl->special.insert(t.id);
      if (t.normalized) {
        // Matched after normalization, so in the normalized spelling of its content.
        if (impl->normalizer) t.content = impl->normalizer->normalize(t.content);
        impl->normalized_added.push_back(std::move(t));
      } else {
        impl->raw_added.push_back(std::move(t));
      }
    }
  }
  return Tokenizer(std::move(impl));
}

Tokenizer Tokenizer::from_dir(const std::string& dir) {
  const std::filesystem::path d(dir);
  Tokenizer t = from_file((d / "tokenizer.json").string());
  const auto cfg_path = d / "tokenizer_config.json";
  if (std::filesystem::exists(cfg_path)) {
    const json cfg = io::read_json_file(cfg_path.string());
    text::object_at(cfg, Where{cfg_path.string(), ""});
    auto impl = std::const_pointer_cast<TokenizerImpl>(t.impl_);
    impl->bos = config_token(cfg, "bos_token", *impl);
    impl->eos = config_token(cfg, "eos_token", *impl);
    impl->pad = config_token(cfg, "pad_token", *impl);
    impl->unk = config_token(cfg, "unk_token", *impl);
  }
  return t;
}

std::vector<int64_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  const size_t bad = text::utf8_first_invalid(text);
  if (bad != std::string_view::npos)
    throw InvalidInput("tokenizer: text is not valid UTF-8 at byte " + std::to_string(bad));
  std::vector<int64_t> ids;
  for (const auto& seg : TokenizerImpl::split_added(std::string(text), impl_->raw_added)) {
    if (seg.id >= 0) ids.push_back(seg.id);
    else if (!seg.text.empty()) impl_->encode_segment(seg.text, ids);
  }
  if (!add_special_tokens || !impl_->post.active) return ids;
  std::vector<int64_t> out;
  for (const auto& part : impl_->post.parts) {
    if (part.empty()) out.insert(out.end(), ids.begin(), ids.end());
    else out.insert(out.end(), part.begin(), part.end());
  }
  return out;
}

std::string Tokenizer::id_to_token(int64_t id) const {
  auto it = impl_->id_to_token.find(id);
  if (it == impl_->id_to_token.end())
    throw InvalidInput("tokenizer: id " + std::to_string(id) + " is not in the vocabulary of " + impl_->file);
  return it->second;
}

std::vector<std::string> Tokenizer::tokens(const std::vector<int64_t>& ids) const {
  std::vector<std::string> out;
  out.reserve(ids.size());
  for (int64_t id : ids) out.push_back(id_to_token(id));
  return out;
}

std::string Tokenizer::decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const {
  std::vector<std::string> toks;
  for (int64_t id : ids) {
    std::string t = id_to_token(id);
    if (!(skip_special_tokens && impl_->special.count(id))) toks.push_back(std::move(t));
  }
  std::string out;
  if (impl_->decoder) {
    for (const std::string& t : impl_->decoder->decode_chain(std::move(toks))) out += t;
  } else {
    // Without a decoder `tokenizers` joins the tokens with spaces.
    for (size_t i = 0; i < toks.size(); ++i) out += (i ? " " : "") + toks[i];
  }
  return text::utf8_lossy(out);
}

bool stream_holds(const TokenizerImpl& impl, int64_t id) {
  if (!impl.byte_fallback_decoder) return false;
  auto it = impl.id_to_token.find(id);
  return it != impl.id_to_token.end() && text::byte_token_value(it->second) >= 0;
}

int64_t Tokenizer::vocab_size() const { return static_cast<int64_t>(impl_->id_to_token.size()); }

std::optional<int64_t> Tokenizer::token_to_id(std::string_view token) const {
  auto it = impl_->token_to_id.find(std::string(token));
  return it == impl_->token_to_id.end() ? std::nullopt : std::optional<int64_t>(it->second);
}

bool Tokenizer::is_special(int64_t id) const { return impl_->special.count(id) > 0; }
std::vector<int64_t> Tokenizer::special_token_ids() const { return {impl_->special.begin(), impl_->special.end()}; }
std::optional<int64_t> Tokenizer::bos_token_id() const { return impl_->bos; }
std::optional<int64_t> Tokenizer::eos_token_id() const { return impl_->eos; }
std::optional<int64_t> Tokenizer::pad_token_id() const { return impl_->pad; }
std::optional<int64_t> Tokenizer::unk_token_id() const { return impl_->unk; }

}  // namespace moex
