#include "model/hf_tokenizer.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <unordered_map>
#include <vector>

#include "model/unicode.h"

namespace tessera::model {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

const std::string kSpmSpace = "\xE2\x96\x81";  // U+2581 "▁"

// The split expressions of the byte-level pre-tokenizers tokenizer.h implements,
// as tokenizer.json writes them (pre_tokenizer.cc spells out what they match).
constexpr std::string_view kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// GGUF token types (tokenizer.h's TokenType).
constexpr int32_t kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6;

// Every object with "type" == `type` in `node` (a component or a Sequence of them).
void FindComponents(const json& node, std::string_view type, std::vector<const json*>* out) {
  if (node.is_array()) {
    for (const json& e : node) FindComponents(e, type, out);
    return;
  }
  if (!node.is_object()) return;
  const auto t = node.find("type");
  if (t != node.end() && t->is_string() && t->get<std::string>() == type) out->push_back(&node);
  for (const char* key : {"pretokenizers", "normalizers", "processors", "decoders"}) {
    const auto it = node.find(key);
    if (it != node.end()) FindComponents(*it, type, out);
  }
}

std::vector<const json*> Components(const json& node, std::string_view type) {
  std::vector<const json*> out;
  FindComponents(node, type, &out);
  return out;
}

const json& Member(const json& object, const char* key) {
  static const json kNull;
  if (!object.is_object()) return kNull;
  const auto it = object.find(key);
  return it == object.end() ? kNull : *it;
}

// A token named in tokenizer_config.json: "<s>" or {"content": "<s>", …}; "" if none.
std::string TokenText(const json& value) {
  if (value.is_string()) return value.get<std::string>();
  const json& content = Member(value, "content");
  return content.is_string() ? content.get<std::string>() : "";
}

// Characters of `t` as SentencePiece splits text (by each lead byte's length).
size_t CharCount(std::string_view t) {
  size_t n = 0;
  for (size_t pos = 0; pos < t.size(); ++n) pos += Utf8SequenceLength(static_cast<uint8_t>(t[pos]));
  return n;
}

bool IsByteToken(std::string_view t) {
  auto hex = [](char c) { return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'F'); };
  return t.size() == 6 && t.starts_with("<0x") && t.back() == '>' && hex(t[3]) && hex(t[4]);
}

}  // namespace

Status HfTokenizerToGguf(const json& tok, const json& tok_config, const json& config,
                         int64_t vocab_rows, const std::string& name, GgufWriter& out) {
  auto error = [&name](const std::string& what) {
    return InvalidArgumentError("tokenizer '" + name + "': " + what);
  };
  if (!tok.is_object()) return error("not a JSON object");
  const json& model = Member(tok, "model");
  const json& type = Member(model, "type");
  if (!type.is_string() || type.get<std::string>() != "BPE") {
    return error("model type " + type.dump() +
                 " is not supported (BPE is: byte-level as GPT-2/Llama 3/Qwen2, or "
                 "SentencePiece-converted as Llama 2)");
  }
  const json& vocab = Member(model, "vocab");
  if (!vocab.is_object() || vocab.empty()) return error("model.vocab is not a non-empty object");
  const json& added = Member(tok, "added_tokens");
  if (!added.is_null() && !added.is_array()) return error("added_tokens is not an array");

  // Ids: the vocabulary's and the added tokens', up to the embedding's rows.
  constexpr int64_t kMaxTokens = int64_t{1} << 24;
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  std::vector<bool> present;
  auto place = [&](const json& id_json, const std::string& text, int32_t token_type) -> Status {
    if (!id_json.is_number_integer() || id_json.get<int64_t>() < 0 ||
        id_json.get<int64_t>() >= kMaxTokens) {
      return error("token '" + text + "' has id " + id_json.dump() + " (expected 0.." +
                   std::to_string(kMaxTokens - 1) + ")");
    }
    const auto id = static_cast<size_t>(id_json.get<uint64_t>());
    if (id >= tokens.size()) {
      tokens.resize(id + 1);
      types.resize(id + 1, kUnused);
      present.resize(id + 1, false);
    }
    if (present[id] && tokens[id] != text) {
      return error("id " + std::to_string(id) + " is given to both '" + tokens[id] + "' and '" +
                   text + "'");
    }
    tokens[id] = text;
    present[id] = true;
    if (token_type != kNormal || types[id] == kUnused) types[id] = token_type;
    return Status::Ok();
  };
  for (const auto& [text, id] : vocab.items()) TESSERA_RETURN_IF_ERROR(place(id, text, kNormal));
  const json& unk_json = Member(model, "unk_token");
  const std::string unk_text = unk_json.is_string() ? unk_json.get<std::string>() : "";
  if (added.is_array()) {
    for (const json& a : added) {
      const json& content = Member(a, "content");
      if (!content.is_string()) return error("an added token has no content string");
      const std::string text = content.get<std::string>();
      const bool special = Member(a, "special").is_boolean() && Member(a, "special").get<bool>();
      const int32_t t = !special ? kUserDefined : text == unk_text ? kUnknown : kControl;
      TESSERA_RETURN_IF_ERROR(place(Member(a, "id"), text, t));
    }
  }
  if (static_cast<int64_t>(tokens.size()) > vocab_rows) {
    return error("token ids reach " + std::to_string(tokens.size() - 1) +
                 " but the embedding has " + std::to_string(vocab_rows) + " rows");
  }
  tokens.resize(static_cast<size_t>(vocab_rows));
  types.resize(static_cast<size_t>(vocab_rows), kUnused);
  present.resize(static_cast<size_t>(vocab_rows), false);
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (!present[i]) tokens[i] = "[PAD" + std::to_string(i) + "]";
  }
  std::unordered_map<std::string_view, int32_t> ids;
  for (size_t i = 0; i < tokens.size(); ++i) ids.emplace(tokens[i], static_cast<int32_t>(i));

  // Merges: "left right" strings or [left, right] pairs.
  const json& merges_json = Member(model, "merges");
  if (!merges_json.is_array()) return error("model.merges is not an array");
  std::vector<std::pair<std::string, std::string>> merges;
  merges.reserve(merges_json.size());
  for (const json& m : merges_json) {
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t space = s.find(' ', 1);
      if (space == std::string::npos || space + 1 >= s.size() ||
          s.find(' ', space + 1) != std::string::npos) {
        return error("merge '" + s + "' is not 'left right'");
      }
      merges.emplace_back(s.substr(0, space), s.substr(space + 1));
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    } else {
      return error("merge " + m.dump() + " is neither 'left right' nor [left, right]");
    }
  }

  // Which vocabulary: byte-level BPE, or SentencePiece converted to BPE.
  const json& pre = Member(tok, "pre_tokenizer");
  const json& normalizer = Member(tok, "normalizer");
  const std::vector<const json*> byte_level = Components(pre, "ByteLevel");
  const std::vector<const json*> metaspace = Components(pre, "Metaspace");
  bool spm_space = !metaspace.empty();
  bool prepend = false;
  for (const json* n : Components(normalizer, "Replace")) {
    if (Member(*n, "content") == kSpmSpace) spm_space = true;
  }
  for (const json* n : Components(normalizer, "Prepend")) {
    if (Member(*n, "prepend") == kSpmSpace) prepend = true;
  }
  for (const json* m : metaspace) {
    const json& scheme = Member(*m, "prepend_scheme");
    const json& add_prefix = Member(*m, "add_prefix_space");
    if ((scheme.is_string() && scheme.get<std::string>() != "never") ||
        (add_prefix.is_boolean() && add_prefix.get<bool>())) {
      prepend = true;
    }
    if (Member(*m, "split").is_boolean() && Member(*m, "split").get<bool>()) {
      return error("a Metaspace pre-tokenizer that splits words is not supported");
    }
  }
  const bool byte_fallback =
      Member(model, "byte_fallback").is_boolean() && Member(model, "byte_fallback").get<bool>();
  std::string pre_name;
  std::vector<float> scores;
  if (!byte_level.empty()) {
    for (const json* b : byte_level) {
      if (Member(*b, "add_prefix_space").is_boolean() &&
          Member(*b, "add_prefix_space").get<bool>()) {
        return error("a ByteLevel pre-tokenizer with add_prefix_space is not supported");
      }
    }
    const std::vector<const json*> splits = Components(pre, "Split");
    if (splits.empty()) {
      pre_name = "gpt2";  // ByteLevel's own (GPT-2) expression
    } else {
      const json& regex = Member(Member(*splits.front(), "pattern"), "Regex");
      const std::string pattern = regex.is_string() ? regex.get<std::string>() : "";
      if (splits.size() == 1 && pattern == kLlama3Regex) {
        pre_name = "llama-bpe";
      } else if (splits.size() == 1 && pattern == kQwen2Regex) {
        pre_name = "qwen2";
      } else {
        return error("pre-tokenizer split " + Member(*splits.front(), "pattern").dump() +
                     " is not one tessera implements (GPT-2's, Llama 3's, Qwen2's)");
      }
    }
    for (const auto& [left, right] : merges) {
      if (left.find(' ') != std::string::npos || right.find(' ') != std::string::npos) {
        return error("merge ['" + left + "', '" + right + "'] holds a space");
      }
    }
  } else if (spm_space || byte_fallback) {
    // SentencePiece: the merge order is the merged piece's score order.
    scores.assign(tokens.size(), 0.0f);
    std::vector<bool> scored(tokens.size(), false);
    for (size_t rank = 0; rank < merges.size(); ++rank) {
      const auto it = ids.find(merges[rank].first + merges[rank].second);
      if (it == ids.end()) continue;
      if (!scored[it->second]) scores[it->second] = -static_cast<float>(rank);
      scored[it->second] = true;
    }
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (!scored[i] && types[i] == kNormal && IsByteToken(tokens[i])) types[i] = kByte;
      // A piece no merge builds merges last (SentencePiece never builds it either).
      if (!scored[i] && types[i] == kNormal && CharCount(tokens[i]) > 1) {
        scores[i] = -static_cast<float>(merges.size() + 1);
      }
    }
  } else {
    return error(
        "a BPE model that is neither byte-level (a ByteLevel pre-tokenizer) nor "
        "SentencePiece-style (\"▁\" for spaces, byte fallback) is not supported");
  }

  // Special ids: tokenizer_config.json's, else config.json's.
  auto lookup = [&ids](const std::string& text) -> int64_t {
    const auto it = ids.find(text);
    return text.empty() || it == ids.end() ? -1 : it->second;
  };
  auto config_id = [&config](const char* key) -> int64_t {
    json v = Member(config, key);
    if (v.is_array() && !v.empty()) v = v[0];
    return v.is_number_unsigned() ? static_cast<int64_t>(v.get<uint64_t>()) : -1;
  };
  int64_t bos = lookup(TokenText(Member(tok_config, "bos_token")));
  if (bos < 0) bos = config_id("bos_token_id");
  int64_t eos = lookup(TokenText(Member(tok_config, "eos_token")));
  if (eos < 0) eos = config_id("eos_token_id");
  const int64_t unk = lookup(unk_text);
  const int64_t pad = lookup(TokenText(Member(tok_config, "pad_token")));
  // BOS added: tokenizer_config.json says, else the post-processor's template.
  bool add_bos = false;
  if (Member(tok_config, "add_bos_token").is_boolean()) {
    add_bos = Member(tok_config, "add_bos_token").get<bool>();
  } else if (bos >= 0) {
    for (const json* t : Components(Member(tok, "post_processor"), "TemplateProcessing")) {
      const json& single = Member(*t, "single");
      if (single.is_array() && !single.empty()) {
        const json& first = Member(Member(single[0], "SpecialToken"), "id");
        if (first.is_string() && lookup(first.get<std::string>()) == bos) add_bos = true;
      }
    }
  }
  const bool add_eos = Member(tok_config, "add_eos_token").is_boolean() &&
                       Member(tok_config, "add_eos_token").get<bool>();

  if (!byte_level.empty()) {
    out.SetString("tokenizer.ggml.model", "gpt2");
    out.SetString("tokenizer.ggml.pre", pre_name);
  } else {
    out.SetString("tokenizer.ggml.model", "llama");
  }
  out.SetStringArray("tokenizer.ggml.tokens", tokens);
  if (!scores.empty()) out.SetF32Array("tokenizer.ggml.scores", scores);
  out.SetI32Array("tokenizer.ggml.token_type", types);
  if (!byte_level.empty()) {
    std::vector<std::string> joined;
    joined.reserve(merges.size());
    for (const auto& [left, right] : merges) joined.push_back(left + " " + right);
    out.SetStringArray("tokenizer.ggml.merges", joined);
  }
  // u32 -1 means "none" to the GGUF reader (tokenizer.cc).
  auto id = [](int64_t v) {
    return v < 0 ? std::numeric_limits<uint32_t>::max() : static_cast<uint32_t>(v);
  };
  out.SetU32("tokenizer.ggml.bos_token_id", id(bos));
  out.SetU32("tokenizer.ggml.eos_token_id", id(eos));
  out.SetU32("tokenizer.ggml.unknown_token_id", id(unk));
  if (pad >= 0) out.SetU32("tokenizer.ggml.padding_token_id", id(pad));
  out.SetBool("tokenizer.ggml.add_bos_token", add_bos);
  out.SetBool("tokenizer.ggml.add_eos_token", add_eos);
  if (byte_level.empty()) out.SetBool("tokenizer.ggml.add_space_prefix", prepend);

  // The chat template: a string, or a list of named ones ("default" first).
  const json& tmpl = Member(tok_config, "chat_template");
  if (tmpl.is_string()) {
    out.SetString("tokenizer.chat_template", tmpl.get<std::string>());
  } else if (tmpl.is_array()) {
    const json* chosen = nullptr;
    for (const json& t : tmpl) {
      if (Member(t, "name") == "default" || chosen == nullptr) chosen = &t;
    }
    if (chosen != nullptr && Member(*chosen, "template").is_string()) {
      out.SetString("tokenizer.chat_template", Member(*chosen, "template").get<std::string>());
    }
  }
  return Status::Ok();
}

Status GgufTokenizerToHf(const GgufFile& file, std::string* tokenizer_json,
                         std::string* tokenizer_config_json) {
  auto error = [&file](const std::string& what) {
    return InvalidArgumentError("GGUF '" + file.name() + "': " + what);
  };
  TESSERA_ASSIGN_OR_RETURN(std::string_view kind, file.GetString("tokenizer.ggml.model"));
  if (kind != "llama" && kind != "gpt2") {
    return error("tokenizer.ggml.model '" + std::string(kind) +
                 "' cannot be exported (llama, gpt2 can)");
  }
  const bool spm = kind == "llama";
  TESSERA_ASSIGN_OR_RETURN(std::span<const std::string_view> tokens,
                           file.GetStringArray("tokenizer.ggml.tokens"));
  std::vector<int32_t> types(tokens.size(), kNormal);
  if (file.Has("tokenizer.ggml.token_type")) {
    TESSERA_ASSIGN_OR_RETURN(types, file.GetI32Array("tokenizer.ggml.token_type"));
  }
  std::vector<float> scores;
  if (file.Has("tokenizer.ggml.scores")) {
    TESSERA_ASSIGN_OR_RETURN(scores, file.GetF32Array("tokenizer.ggml.scores"));
  }
  if (types.size() != tokens.size() || (spm && scores.size() != tokens.size())) {
    return error("token types or scores do not match the tokens");
  }
  auto id_of = [&file, &tokens](const char* key) -> int64_t {
    Result<int64_t> v = file.GetIntOr(key, -1);
    return v.ok() && *v >= 0 && *v < static_cast<int64_t>(tokens.size()) ? *v : -1;
  };
  const int64_t bos = id_of("tokenizer.ggml.bos_token_id");
  const int64_t eos = id_of("tokenizer.ggml.eos_token_id");
  const int64_t unk = id_of("tokenizer.ggml.unknown_token_id");
  const int64_t pad = id_of("tokenizer.ggml.padding_token_id");
  TESSERA_ASSIGN_OR_RETURN(bool add_bos, file.GetBoolOr("tokenizer.ggml.add_bos_token", spm));
  TESSERA_ASSIGN_OR_RETURN(bool add_eos, file.GetBoolOr("tokenizer.ggml.add_eos_token", false));
  TESSERA_ASSIGN_OR_RETURN(bool space_prefix,
                           file.GetBoolOr("tokenizer.ggml.add_space_prefix", spm));

  std::unordered_map<std::string_view, int64_t> ids;
  ordered_json vocab = ordered_json::object();
  ordered_json added = ordered_json::array();
  for (size_t i = 0; i < tokens.size(); ++i) {
    const std::string_view t = tokens[i];
    if (types[i] == kUnused && t == "[PAD" + std::to_string(i) + "]") continue;  // a hole
    if (!ids.emplace(t, static_cast<int64_t>(i)).second) {
      return error("token text '" + std::string(t) + "' appears twice (ids " +
                   std::to_string(ids[t]) + " and " + std::to_string(i) +
                   "); tokenizer.json maps each text to one id");
    }
    vocab[std::string(t)] = i;
    if (types[i] == kControl || types[i] == kUnknown || types[i] == kUserDefined) {
      added.push_back({{"id", i},
                       {"content", std::string(t)},
                       {"single_word", false},
                       {"lstrip", false},
                       {"rstrip", false},
                       {"normalized", false},
                       {"special", types[i] != kUserDefined}});
    }
  }
  ordered_json merges = ordered_json::array();
  if (spm) {
    // Every split of a piece into two pieces, ordered by the piece's score.
    struct Merge {
      float score;
      int64_t piece, left, right;
    };
    std::vector<Merge> list;
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (types[i] != kNormal && types[i] != kUserDefined) continue;
      const std::string_view t = tokens[i];
      for (size_t pos = 0;;) {
        pos += Utf8SequenceLength(static_cast<uint8_t>(t[pos]));
        if (pos >= t.size()) break;
        const auto l = ids.find(t.substr(0, pos));
        const auto r = ids.find(t.substr(pos));
        if (l != ids.end() && r != ids.end() && types[l->second] != kControl &&
            types[r->second] != kControl) {
          list.push_back({scores[i], static_cast<int64_t>(i), l->second, r->second});
        }
      }
    }
    std::stable_sort(list.begin(), list.end(), [](const Merge& a, const Merge& b) {
      if (a.score != b.score) return a.score > b.score;
      return a.piece < b.piece;
    });
    for (const Merge& m : list) {
      merges.push_back({std::string(tokens[m.left]), std::string(tokens[m.right])});
    }
  } else {
    TESSERA_ASSIGN_OR_RETURN(std::span<const std::string_view> gguf_merges,
                             file.GetStringArray("tokenizer.ggml.merges"));
    for (std::string_view m : gguf_merges) merges.push_back(std::string(m));
  }

  std::string pre;
  if (!spm) {
    TESSERA_ASSIGN_OR_RETURN(std::string_view p, file.GetStringOr("tokenizer.ggml.pre", "gpt2"));
    pre = std::string(p);
  }
  ordered_json tok = ordered_json::object();
  tok["version"] = "1.0";
  tok["truncation"] = nullptr;
  tok["padding"] = nullptr;
  tok["added_tokens"] = added;
  const ordered_json byte_level = {{"type", "ByteLevel"},
                                   {"add_prefix_space", false},
                                   {"trim_offsets", true},
                                   {"use_regex", true}};
  if (spm) {
    ordered_json normalizers = ordered_json::array();
    if (space_prefix) normalizers.push_back({{"type", "Prepend"}, {"prepend", kSpmSpace}});
    normalizers.push_back(
        {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", kSpmSpace}});
    tok["normalizer"] = {{"type", "Sequence"}, {"normalizers", normalizers}};
    tok["pre_tokenizer"] = nullptr;
  } else {
    tok["normalizer"] = nullptr;
    if (pre == "gpt2" || pre == "default" || pre == "gpt-2") {
      tok["pre_tokenizer"] = byte_level;
    } else {
      std::string_view regex;
      if (pre == "llama3" || pre == "llama-bpe" || pre == "llama-v3" || pre == "smaug-bpe") {
        regex = kLlama3Regex;
      } else if (pre == "qwen2") {
        regex = kQwen2Regex;
      } else {
        return error("pre-tokenizer '" + pre + "' cannot be exported");
      }
      ordered_json no_regex = byte_level;
      no_regex["use_regex"] = false;
      tok["pre_tokenizer"] = {{"type", "Sequence"},
                              {"pretokenizers",
                               {{{"type", "Split"},
                                 {"pattern", {{"Regex", std::string(regex)}}},
                                 {"behavior", "Isolated"},
                                 {"invert", false}},
                                no_regex}}};
    }
  }
  if (add_bos && bos >= 0) {
    const std::string b(tokens[static_cast<size_t>(bos)]);
    tok["post_processor"] = {
        {"type", "TemplateProcessing"},
        {"single",
         {{{"SpecialToken", {{"id", b}, {"type_id", 0}}}},
          {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
        {"pair",
         {{{"SpecialToken", {{"id", b}, {"type_id", 0}}}},
          {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
          {{"SpecialToken", {{"id", b}, {"type_id", 1}}}},
          {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}}},
        {"special_tokens", {{b, {{"id", b}, {"ids", {bos}}, {"tokens", {b}}}}}}};
  } else {
    tok["post_processor"] = nullptr;
  }
  if (spm) {
    tok["decoder"] = {
        {"type", "Sequence"},
        {"decoders",
         {{{"type", "Replace"}, {"pattern", {{"String", kSpmSpace}}}, {"content", " "}},
          {{"type", "ByteFallback"}},
          {{"type", "Fuse"}},
          {{"type", "Strip"}, {"content", " "}, {"start", space_prefix ? 1 : 0}, {"stop", 0}}}}};
  } else {
    tok["decoder"] = byte_level;
  }
  tok["model"] = {{"type", "BPE"},
                  {"dropout", nullptr},
                  {"unk_token", unk >= 0 ? ordered_json(std::string(tokens[unk])) : ordered_json()},
                  {"continuing_subword_prefix", nullptr},
                  {"end_of_word_suffix", nullptr},
                  {"fuse_unk", spm},
                  {"byte_fallback", spm},
                  {"ignore_merges", pre == "llama3" || pre == "llama-bpe" || pre == "llama-v3" ||
                                        pre == "smaug-bpe"},
                  {"vocab", vocab},
                  {"merges", merges}};
  *tokenizer_json = tok.dump();

  ordered_json cfg = ordered_json::object();
  cfg["add_bos_token"] = add_bos;
  cfg["add_eos_token"] = add_eos;
  auto text = [&tokens](int64_t id) {
    return id >= 0 ? ordered_json(std::string(tokens[static_cast<size_t>(id)])) : ordered_json();
  };
  cfg["bos_token"] = text(bos);
  cfg["eos_token"] = text(eos);
  cfg["unk_token"] = text(unk);
  cfg["pad_token"] = text(pad);
  cfg["clean_up_tokenization_spaces"] = false;
  cfg["tokenizer_class"] = "PreTrainedTokenizerFast";
  TESSERA_ASSIGN_OR_RETURN(std::string_view tmpl, file.GetStringOr("tokenizer.chat_template", ""));
  if (!tmpl.empty()) cfg["chat_template"] = std::string(tmpl);
  *tokenizer_config_json = cfg.dump(2);
  return Status::Ok();
}

}  // namespace tessera::model
