// Hugging Face checkpoints: the safetensors reader and the checkpoint loader
// against malformed input (each error names the problem), and tokenizer.json
// against the GGUF tokenizer it was written from (the llama SPM test vectors, the
// stories260K vocabulary, a byte-level BPE vocabulary with special tokens).
#include "model/hf_checkpoint.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/gguf_writer.h"
#include "model/hf_tokenizer.h"
#include "model/safetensors.h"
#include "model/synth.h"
#include "model/tokenizer.h"
#include "model/tokenizer_impl.h"
#include "model/unicode.h"
#include "test_util.h"

namespace tessera::model {
namespace {

using nlohmann::json;

std::string SharedModel(const std::string& name) {
  return std::string(TESSERA_SHARED_DIR) + "/models/" + name;
}

// A safetensors image: header JSON text, then `data` bytes.
std::vector<uint8_t> Image(const std::string& header, size_t data_bytes) {
  std::vector<uint8_t> out(8 + header.size() + data_bytes, 0);
  const uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  std::memcpy(out.data() + 8, header.data(), header.size());
  return out;
}

std::string ParseError(const std::vector<uint8_t>& bytes) {
  Result<SafetensorsFile> f = SafetensorsFile::FromBytes(bytes, "t.safetensors");
  return f.ok() ? "" : f.status().message();
}

TEST(SafetensorsTest, MalformedFilesAreClearErrors) {
  struct Case {
    std::vector<uint8_t> bytes;
    std::string fragment;
  };
  std::vector<uint8_t> huge_length = Image("{}", 0);
  huge_length[5] = 1;  // header length 2^40 + 2
  const std::vector<Case> cases = {
      {{1, 2, 3}, "too short for the 8-byte header length"},
      {huge_length, "exceeds the 2 bytes after it"},
      {Image("{\"a\": ", 0), "the header is not valid JSON (at byte"},
      {Image("[1, 2]", 0), "not a JSON object"},
      {Image(R"({"w": {"shape": [2], "data_offsets": [0, 8]}})", 8), "tensor 'w' has no dtype"},
      {Image(R"({"w": {"dtype": "F32", "data_offsets": [0, 8]}})", 8), "has no shape array"},
      {Image(R"({"w": {"dtype": "F32", "shape": [2]}})", 8), "has no data_offsets"},
      {Image(R"({"w": {"dtype": "Q9", "shape": [2], "data_offsets": [0, 8]}})", 8),
       "unknown dtype 'Q9'"},
      {Image(R"({"w": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})", 8),
       "has shape entry -2"},
      {Image(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 16]}})", 8),
       "outside the 8 data bytes"},
      {Image(R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", 8),
       "holds 8 bytes, but F32 of its shape needs 12"},
      {Image(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                 "b": {"dtype": "F16", "shape": [2], "data_offsets": [4, 8]}})",
             8),
       "overlap"},
  };
  for (const Case& c : cases) {
    const std::string message = ParseError(c.bytes);
    EXPECT_NE(message.find(c.fragment), std::string::npos)
        << "expected '" << c.fragment << "', got '" << message << "'";
    EXPECT_NE(message.find("t.safetensors"), std::string::npos) << message;
  }
}

TEST(SafetensorsTest, WrittenFileReadsBack) {
  const std::string path = testing::TempPath("rt.safetensors");
  const std::vector<float> values = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, 8.0f};
  ASSERT_TRUE(WriteSafetensors(path, {{"b",
                                       "F32",
                                       {2, 3},
                                       [&](std::string* out) {
                                         out->append(reinterpret_cast<const char*>(values.data()),
                                                     24);
                                         return Status::Ok();
                                       }},
                                      {"a",
                                       "BF16",
                                       {1},
                                       [](std::string* out) {
                                         out->append("\x80\x3f", 2);
                                         return Status::Ok();
                                       }}})
                  .ok());
  Result<SafetensorsFile> f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  ASSERT_EQ(f->tensors().size(), 2u);
  const SafetensorsTensor* b = f->Find("b");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(0, std::memcmp(b->data.data(), values.data(), 24));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b->data.data()) % 8, 0u);  // data 8-byte aligned
  EXPECT_EQ(f->Find("a")->dtype, "BF16");
  // A writer whose data does not match its declaration removes the file.
  EXPECT_FALSE(WriteSafetensors(path, {{"c",
                                        "F32",
                                        {2},
                                        [](std::string* out) {
                                          out->append("1234");
                                          return Status::Ok();
                                        }}})
                   .ok());
  EXPECT_FALSE(std::filesystem::exists(path));
}

// A small checkpoint directory (synthetic f16 llama), fresh for each caller.
std::string WriteCheckpoint(const std::string& name, int64_t max_shard_bytes = 0) {
  const std::string gguf = testing::TempPath(name + ".gguf");
  SynthOptions o{.dim = 64,
                 .num_layers = 2,
                 .num_heads = 4,
                 .num_kv_heads = 2,
                 .ffn_dim = 96,
                 .vocab_size = 320,
                 .seed = 3};
  EXPECT_TRUE(WriteSynthModel(o, gguf).ok());
  Result<GgufFile> file = GgufFile::Open(gguf);
  EXPECT_TRUE(file.ok());
  const std::string dir = testing::TempPath(name);
  std::filesystem::remove_all(dir);
  Status s = ExportHfCheckpoint(*file, dir, {.max_shard_bytes = max_shard_bytes});
  EXPECT_TRUE(s.ok()) << s.ToString();
  return dir;
}

// Opens the checkpoint and validates it as a load does; the error message or "".
std::string LoadError(const std::string& dir) {
  Result<GgufFile> file = OpenModelFile(dir);
  if (!file.ok()) return file.status().message();
  Result<ModelConfig> config = ModelConfigFromGguf(*file);
  if (!config.ok()) return config.status().message();
  Status s = ValidateModelTensors(*file, *config);
  if (!s.ok()) return s.message();
  Result<Tokenizer> tok = Tokenizer::FromGguf(*file);
  return tok.ok() ? "" : tok.status().message();
}

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

json ReadJsonFile(const std::string& path) {
  std::ifstream in(path);
  return json::parse(in);
}

void ExpectError(const std::string& dir, const std::string& fragment) {
  const std::string message = LoadError(dir);
  EXPECT_NE(message.find(fragment), std::string::npos)
      << "expected '" << fragment << "', got '" << message << "'";
}

TEST(HfCheckpointTest, WrittenCheckpointLoads) {
  const std::string dir = WriteCheckpoint("ok");
  EXPECT_EQ(LoadError(dir), "");
  Result<GgufFile> file = OpenModelFile(dir);
  ASSERT_TRUE(file.ok());
  Result<ModelConfig> c = ModelConfigFromGguf(*file);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->dim, 64);
  EXPECT_EQ(c->num_kv_heads, 2);
  EXPECT_EQ(c->vocab_size, 320);
  // Query/key rows are marked for reordering, nothing else.
  EXPECT_EQ(file->FindTensor("blk.1.attn_q.weight")->rope_halves_head, 16);
  EXPECT_EQ(file->FindTensor("blk.1.attn_k.weight")->rope_halves_head, 16);
  EXPECT_EQ(file->FindTensor("blk.1.attn_v.weight")->rope_halves_head, 0);
  EXPECT_EQ(file->FindTensor("token_embd.weight")->type, kernels::WeightType::kF16);
}

TEST(HfCheckpointTest, ChatTemplateComesFromTokenizerConfigOrItsFile) {
  const std::string dir = WriteCheckpoint("chat");
  json cfg = ReadJsonFile(dir + "/tokenizer_config.json");
  cfg["chat_template"] = json::array({{{"name", "tool_use"}, {"template", "T"}},
                                      {{"name", "default"}, {"template", "{{ bos_token }}"}}});
  WriteText(dir + "/tokenizer_config.json", cfg.dump());
  Result<GgufFile> file = OpenModelFile(dir);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ(*file->GetStringOr("tokenizer.chat_template", ""), "{{ bos_token }}");
  cfg.erase("chat_template");
  WriteText(dir + "/tokenizer_config.json", cfg.dump());
  WriteText(dir + "/chat_template.jinja", "{% for m in messages %}{{ m.content }}{% endfor %}");
  file = OpenModelFile(dir);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ(*file->GetStringOr("tokenizer.chat_template", ""),
            "{% for m in messages %}{{ m.content }}{% endfor %}");
}

TEST(HfCheckpointTest, MissingOrMalformedFilesAreClearErrors) {
  std::string dir = WriteCheckpoint("no_config");
  std::filesystem::remove(dir + "/config.json");
  ExpectError(dir, "not a Hugging Face checkpoint: config.json is missing");

  dir = WriteCheckpoint("bad_json");
  WriteText(dir + "/config.json", "{\"hidden_size\": 64,");
  ExpectError(dir, "config.json' is not valid JSON (at byte");

  dir = WriteCheckpoint("arch");
  json config = ReadJsonFile(dir + "/config.json");
  config["model_type"] = "gpt_neox";
  WriteText(dir + "/config.json", config.dump());
  ExpectError(dir, "model_type 'gpt_neox' is not supported");

  dir = WriteCheckpoint("not_int");
  config = ReadJsonFile(dir + "/config.json");
  config["num_attention_heads"] = "four";
  WriteText(dir + "/config.json", config.dump());
  ExpectError(dir, "num_attention_heads = \"four\" is not a positive integer");

  dir = WriteCheckpoint("shape");  // the config disagrees with the tensors
  config = ReadJsonFile(dir + "/config.json");
  config["intermediate_size"] = 128;
  WriteText(dir + "/config.json", config.dump());
  ExpectError(dir, "tensor blk.0.ffn_gate.weight has shape [64, 96], expected [64, 128]");

  dir = WriteCheckpoint("no_weights");
  std::filesystem::remove(dir + "/model.safetensors");
  ExpectError(dir, "holds neither model.safetensors nor model.safetensors.index.json");

  dir = WriteCheckpoint("no_tokenizer");
  std::filesystem::remove(dir + "/tokenizer.json");
  ExpectError(dir, "tokenizer.json' is missing");

  dir = WriteCheckpoint("truncated");
  std::filesystem::resize_file(dir + "/model.safetensors",
                               std::filesystem::file_size(dir + "/model.safetensors") - 100);
  ExpectError(dir, "data bytes (truncated file?)");
}

// Rewrites the checkpoint's single file through `edit` (which may rename, drop or
// retype tensors).
void RewriteWeights(const std::string& dir,
                    const std::function<void(std::vector<SafetensorsEntry>&)>& edit) {
  Result<SafetensorsFile> f = SafetensorsFile::Open(dir + "/model.safetensors");
  ASSERT_TRUE(f.ok());
  std::vector<SafetensorsEntry> entries;
  for (const SafetensorsTensor& t : f->tensors()) {
    entries.push_back({t.name, t.dtype, t.shape, [data = t.data](std::string* out) {
                         out->append(reinterpret_cast<const char*>(data.data()), data.size());
                         return Status::Ok();
                       }});
  }
  edit(entries);
  const std::string tmp = dir + "/model.safetensors.new";
  ASSERT_TRUE(WriteSafetensors(tmp, entries).ok());
  std::filesystem::rename(tmp, dir + "/model.safetensors");
}

TEST(HfCheckpointTest, WrongTensorsAreClearErrors) {
  std::string dir = WriteCheckpoint("missing_tensor");
  RewriteWeights(dir, [](std::vector<SafetensorsEntry>& e) {
    std::erase_if(e, [](const SafetensorsEntry& x) {
      return x.name == "model.layers.1.mlp.down_proj.weight";
    });
  });
  ExpectError(dir, "tensor blk.1.ffn_down.weight is missing");

  dir = WriteCheckpoint("unknown_tensor");
  RewriteWeights(dir, [](std::vector<SafetensorsEntry>& e) {
    e[0].name = "model.layers.0.mlp.mystery.weight";
  });
  ExpectError(dir, "tensor 'model.layers.0.mlp.mystery.weight' is not one tessera knows");

  dir = WriteCheckpoint("past_layers");
  RewriteWeights(dir, [](std::vector<SafetensorsEntry>& e) {
    for (SafetensorsEntry& x : e) {
      if (x.name == "model.layers.1.mlp.up_proj.weight")
        x.name = "model.layers.7.mlp.up_proj.weight";
    }
  });
  ExpectError(dir, "is past the 2 layers config.json declares");

  dir = WriteCheckpoint("dtype");
  RewriteWeights(dir, [](std::vector<SafetensorsEntry>& e) {
    for (SafetensorsEntry& x : e) {
      if (x.name == "model.norm.weight") x.dtype = "I32";  // f32 bytes, I32 label
    }
  });
  ExpectError(dir, "tensor 'model.norm.weight' has dtype I32");
}

TEST(HfCheckpointTest, ShardIndexIsChecked) {
  const std::string dir = WriteCheckpoint("sharded", 40 << 10);
  EXPECT_EQ(LoadError(dir), "");
  const std::string index_path = dir + "/model.safetensors.index.json";
  const json index = ReadJsonFile(index_path);
  std::set<std::string> files;
  for (const auto& [tensor, file] : index["weight_map"].items()) files.insert(file);
  EXPECT_GE(files.size(), 3u);

  json bad = index;
  bad["weight_map"]["model.norm.weight"] = "../elsewhere.safetensors";
  WriteText(index_path, bad.dump());
  ExpectError(dir, "not a .safetensors file in the checkpoint directory");

  bad = index;
  bad["weight_map"]["model.layers.0.extra.weight"] = *files.begin();
  WriteText(index_path, bad.dump());
  ExpectError(dir, "lists tensor 'model.layers.0.extra.weight'");

  bad = index;
  bad["weight_map"].erase("model.norm.weight");
  WriteText(index_path, bad.dump());
  ExpectError(dir,
              "holds tensor 'model.norm.weight', which model.safetensors.index.json does not list");

  bad = index;
  std::filesystem::remove(dir + "/" + *files.begin());
  WriteText(index_path, index.dump());
  ExpectError(dir, *files.begin());
}

// The tokenizer of `gguf` through tokenizer.json / tokenizer_config.json and back.
Result<Tokenizer> ThroughHf(const GgufFile& gguf, int64_t rows, std::string* tokenizer_text) {
  std::string tok, cfg;
  TESSERA_RETURN_IF_ERROR(GgufTokenizerToHf(gguf, &tok, &cfg));
  if (tokenizer_text) *tokenizer_text = tok;
  GgufWriter meta;
  meta.SetString("general.architecture", "llama");
  TESSERA_RETURN_IF_ERROR(
      HfTokenizerToGguf(json::parse(tok), json::parse(cfg), json::object(), rows, "t", meta));
  static std::vector<std::unique_ptr<GgufFile>> keep;  // the tokenizer's views stay valid
  TESSERA_ASSIGN_OR_RETURN(GgufFile file, GgufFile::Assemble("hf", meta.MetadataImage(), {}, {}));
  keep.push_back(std::make_unique<GgufFile>(std::move(file)));
  return Tokenizer::FromGguf(*keep.back());
}

std::vector<std::string> VocabTestInputs() {
  std::ifstream in(SharedModel("vocab/ggml-vocab-llama-spm.gguf.inp"), std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  const std::string inp = text.str(), separator = "\n__ggml_vocab_test__\n";
  std::vector<std::string> inputs;
  for (size_t start = 0, end; (end = inp.find(separator, start)) != std::string::npos;
       start = end + separator.size()) {
    inputs.push_back(inp.substr(start, end - start));
  }
  return inputs;
}

TEST(HfTokenizerTest, LlamaSpmVocabularyEncodesAsItsGguf) {
  const std::string path = SharedModel("vocab/ggml-vocab-llama-spm.gguf");
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "no shared models";
  Result<GgufFile> gguf = GgufFile::Open(path);
  ASSERT_TRUE(gguf.ok());
  Result<Tokenizer> expected = Tokenizer::FromGguf(*gguf);
  ASSERT_TRUE(expected.ok());
  std::string text;
  Result<Tokenizer> hf = ThroughHf(*gguf, expected->vocab_size(), &text);
  ASSERT_TRUE(hf.ok()) << hf.status().ToString();
  const json tokenizer = json::parse(text);
  EXPECT_EQ(tokenizer["model"]["byte_fallback"], true);
  EXPECT_GT(tokenizer["model"]["merges"].size(), 60000u);
  EXPECT_EQ(hf->kind(), VocabKind::kSpm);
  EXPECT_EQ(hf->bos_id(), 1);
  EXPECT_EQ(hf->GetTokenType(0), TokenType::kUnknown);
  EXPECT_EQ(hf->GetTokenType(2), TokenType::kControl);
  EXPECT_EQ(hf->GetTokenType(3 + 0x41), TokenType::kByte);
  std::vector<std::string> inputs = VocabTestInputs();
  ASSERT_EQ(inputs.size(), 46u);
  inputs.push_back("<s>Hello</s> world\n\n  tabs\tand ünïcödé 🦙");
  for (const std::string& in : inputs) {
    for (bool special : {false, true}) {
      const EncodeOptions o{.add_special = special, .parse_special = special};
      EXPECT_EQ(hf->Encode(in, o), expected->Encode(in, o)) << "'" << in << "'";
    }
  }
}

TEST(HfTokenizerTest, Stories260KVocabularyEncodesAsItsGguf) {
  const std::string path = SharedModel("stories260K.gguf");
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "no shared models";
  Result<GgufFile> gguf = GgufFile::Open(path);
  ASSERT_TRUE(gguf.ok());
  Result<Tokenizer> expected = Tokenizer::FromGguf(*gguf);
  ASSERT_TRUE(expected.ok());
  Result<Tokenizer> hf = ThroughHf(*gguf, expected->vocab_size(), nullptr);
  ASSERT_TRUE(hf.ok()) << hf.status().ToString();
  for (const std::string& in : VocabTestInputs()) {
    EXPECT_EQ(hf->Encode(in), expected->Encode(in)) << "'" << in << "'";
  }
  EXPECT_EQ(hf->Encode("Once upon a time, there was a little girl named Lily."),
            expected->Encode("Once upon a time, there was a little girl named Lily."));
}

// A byte-level BPE GGUF vocabulary: the 256 byte characters, merges, and special
// tokens (control and user-defined) at the end.
std::string WriteBpeVocab(const std::string& pre) {
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) {
    std::string s;
    AppendUtf8(ByteToCodepoint(static_cast<uint8_t>(b)), &s);
    tokens.push_back(s);
  }
  const std::string G = tokens[' '];
  const std::vector<std::string> merges = {"l l",  "e ll",     "h ell",   "hell o",     G + " w",
                                           "o r",  G + "w or", "l d",     G + "wor ld", "1 2",
                                           "12 3", G + " t",   G + "t h", "e r",        G + "th e"};
  for (std::string t :
       {std::string("ll"), std::string("ell"), std::string("hell"), std::string("hello"), G + "w",
        std::string("or"), G + "wor", std::string("ld"), G + "world", std::string("12"),
        std::string("123"), G + "t", G + "th", std::string("er"), G + "the"}) {
    tokens.push_back(t);
  }
  tokens.push_back("<|begin_of_text|>");
  tokens.push_back("<|end|>");
  tokens.push_back("<tool>");
  std::vector<int32_t> types(tokens.size(), 1);
  types[types.size() - 3] = 3;
  types[types.size() - 2] = 3;
  types[types.size() - 1] = 4;
  GgufWriter w;
  w.SetString("general.architecture", "llama");
  w.SetString("tokenizer.ggml.model", "gpt2");
  w.SetString("tokenizer.ggml.pre", pre);
  w.SetStringArray("tokenizer.ggml.tokens", tokens);
  w.SetI32Array("tokenizer.ggml.token_type", types);
  w.SetStringArray("tokenizer.ggml.merges", merges);
  w.SetU32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(tokens.size() - 3));
  w.SetU32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(tokens.size() - 2));
  w.SetBool("tokenizer.ggml.add_bos_token", pre == "llama-bpe");
  w.SetString("tokenizer.chat_template", "{{ messages }}");
  const std::string path = testing::TempPath("bpe_" + pre + ".gguf");
  EXPECT_TRUE(w.Open(path).ok());
  EXPECT_TRUE(w.Close().ok());
  return path;
}

TEST(HfTokenizerTest, ByteLevelBpeEncodesAsItsGguf) {
  for (const std::string pre : {"gpt2", "llama-bpe", "qwen2"}) {
    Result<GgufFile> gguf = GgufFile::Open(WriteBpeVocab(pre));
    ASSERT_TRUE(gguf.ok());
    Result<Tokenizer> expected = Tokenizer::FromGguf(*gguf);
    ASSERT_TRUE(expected.ok()) << expected.status().ToString();
    std::string text;
    Result<Tokenizer> hf = ThroughHf(*gguf, expected->vocab_size() + 5, &text);
    ASSERT_TRUE(hf.ok()) << pre << ": " << hf.status().ToString();
    EXPECT_EQ(hf->pre_tokenizer(), expected->pre_tokenizer()) << pre;
    EXPECT_EQ(hf->vocab_size(), expected->vocab_size() + 5);  // padded to the embedding
    EXPECT_EQ(hf->GetTokenType(hf->vocab_size() - 1), TokenType::kUnused);
    EXPECT_EQ(hf->add_bos(), expected->add_bos());
    for (const std::string in :
         {"hello world", "Hello  world!! the 12345 other", "<|begin_of_text|>the<tool>x<|end|>",
          "  leading\tand\n\n trailing  ", "ünïcödé 🦙 12 123 1234", ""}) {
      for (bool special : {false, true}) {
        const EncodeOptions o{.add_special = special, .parse_special = special};
        EXPECT_EQ(hf->Encode(in, o), expected->Encode(in, o)) << pre << " '" << in << "'";
      }
    }
    const json tokenizer = json::parse(text);
    EXPECT_EQ(tokenizer["model"]["ignore_merges"], pre == "llama-bpe");
  }
}

TEST(HfTokenizerTest, UnsupportedTokenizersAreClearErrors) {
  Result<GgufFile> gguf = GgufFile::Open(WriteBpeVocab("llama-bpe"));
  ASSERT_TRUE(gguf.ok());
  std::string tok, cfg;
  ASSERT_TRUE(GgufTokenizerToHf(*gguf, &tok, &cfg).ok());
  auto error = [&](const json& t) {
    GgufWriter meta;
    Status s = HfTokenizerToGguf(t, json::parse(cfg), json::object(), 400, "tok.json", meta);
    return s.message();
  };
  json t = json::parse(tok);
  t["model"]["type"] = "Unigram";
  EXPECT_NE(error(t).find("model type \"Unigram\" is not supported"), std::string::npos);
  t = json::parse(tok);
  t["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\w+";
  EXPECT_NE(error(t).find("is not one tessera implements"), std::string::npos) << error(t);
  t = json::parse(tok);
  t["added_tokens"][0]["id"] = 3;
  EXPECT_NE(error(t).find("id 3 is given to both"), std::string::npos) << error(t);
  t = json::parse(tok);
  GgufWriter meta;
  Status s = HfTokenizerToGguf(t, json::parse(cfg), json::object(), 10, "tok.json", meta);
  EXPECT_NE(s.message().find("but the embedding has 10 rows"), std::string::npos) << s.message();
  t["model"]["merges"][0] = "nospace";
  EXPECT_NE(error(t).find("merge 'nospace' is not 'left right'"), std::string::npos) << error(t);
}

}  // namespace
}  // namespace tessera::model
