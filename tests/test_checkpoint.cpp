// Checkpoint folders: the transformers fixtures (every model, fp32 and bf16, through the same
// lookups the models use), sharded indexes built here, and one test per broken folder.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "moex/checkpoint.hpp"
#include "moex/error.hpp"
#include "support/test_support.hpp"
#include "test_safetensors_util.hpp"

namespace moex {
namespace {

namespace fs = std::filesystem;
using test::expect_invalid;
using test::write_text;

const std::vector<std::string> kModels = {"qwen2_moe", "qwen3_moe", "mixtral", "olmoe",
                                          "deepseek_v3", "gpt_oss", "qwen3_vl_moe"};

// ---------------------------------------------------------------- fixtures from transformers

TEST(CheckpointFixtures, EveryModelOpensAndReadsEveryTensor) {
  for (const auto& model : kModels) {
    SCOPED_TRACE(model);
    auto ck = Checkpoint::open(test::data_path("hf-tiny/" + model + "/checkpoint_fp32"));
    EXPECT_EQ(ck->model_type(), model);
    EXPECT_TRUE(ck->config().contains("model_type"));
    EXPECT_TRUE(ck->generation_config().is_object());
    const auto names = ck->names();
    ASSERT_GT(names.size(), 10u);
    EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
    for (const auto& name : names) {
      ASSERT_TRUE(ck->has(name));
      const Tensor raw = ck->get(name);
      EXPECT_EQ(raw.dtype(), DType::kF32) << name;
      // Same dtype requested: the view of the mapping itself, no copy.
      const Tensor same = ck->get(name, raw.shape(), DType::kF32);
      EXPECT_EQ(same.raw(), raw.raw()) << name;
    }
    EXPECT_FALSE(ck->has("no.such.tensor"));
  }
}

// The bf16 checkpoints are the fp32 ones rounded by torch (nearest even), so converting them back
// to float32 must give exactly round_bf16 of the fp32 values; tensors kept in fp32 stay exact.
TEST(CheckpointFixtures, Bf16CheckpointConvertsToTheRoundedFp32Values) {
  for (const auto& model : kModels) {
    const std::string bf16_dir = test::data_path("hf-tiny/" + model + "/checkpoint_bf16");
    if (!fs::exists(bf16_dir)) continue;  // qwen3_vl_moe ships fp32 only
    SCOPED_TRACE(model);
    auto f32 = Checkpoint::open(test::data_path("hf-tiny/" + model + "/checkpoint_fp32"));
    auto b16 = Checkpoint::open(bf16_dir);
    ASSERT_EQ(f32->names(), b16->names());
    int converted = 0;
    for (const auto& name : f32->names()) {
      const Tensor ref = f32->get(name);
      const Tensor stored = b16->get(name);
      const Tensor got = b16->get(name, ref.shape(), DType::kF32);
      ASSERT_EQ(got.dtype(), DType::kF32);
      const auto a = ref.to_float_vector();
      const auto b = got.to_float_vector();
      ASSERT_EQ(a.size(), b.size());
      const bool rounded = stored.dtype() == DType::kBF16;
      converted += rounded;
      for (size_t i = 0; i < a.size(); ++i)
        ASSERT_EQ(float_bits(rounded ? round_bf16(a[i]) : a[i]), float_bits(b[i]))
            << name << " element " << i;
    }
    EXPECT_GT(converted, 0);
  }
}

TEST(CheckpointFixtures, ReferenceFilesHoldTheDocumentedTensors) {
  auto ref = SafetensorsFile::open(test::data_path("hf-tiny/mixtral/reference.safetensors"));
  EXPECT_EQ(ref->entry("input_ids").dtype, DType::kI64);
  EXPECT_EQ(ref->entry("input_ids").shape, (Shape{2, 11}));
  EXPECT_EQ(ref->entry("greedy_fp32").shape, (Shape{1, 23}));
  const auto ids = ref->get("input_ids").to_int_vector();
  const auto greedy = ref->get("greedy_fp32").to_int_vector();
  // The greedy sequence starts with the first prompt.
  EXPECT_TRUE(std::equal(ids.begin(), ids.begin() + 11, greedy.begin()));
}

// FP8 weights, UE8M0 scales and FP4 pairs packed in int8, as the DeepSeek hub checkpoints store
// them (the fixture is part of tests/data: missing, the test fails).
TEST(CheckpointFixtures, QuantizedDeepseekDtypes) {
  const std::string dir = test::data_path("hf-tiny/deepseek_v3_fp4_experts_ue8m0/checkpoint");
  ASSERT_TRUE(fs::exists(dir)) << dir << " not in tests/data";
  auto ck = Checkpoint::open(dir);
  int fp8 = 0, e8m0 = 0, fp4 = 0;
  for (const auto& name : ck->names()) {
    const Tensor t = ck->get(name);
    if (t.dtype() == DType::kF8E4M3) ++fp8;
    if (t.dtype() == DType::kF8E8M0) {
      ++e8m0;
      const Tensor f = ck->get(name, t.shape(), DType::kF32);
      const auto v = f.to_float_vector();
      // Expected values computed here, not with e8m0_to_float (which the conversion itself
      // uses): code c is 2^(c - 127), code 0xFF is NaN.
      for (int64_t i = 0; i < t.numel(); ++i) {
        const int code = t.data<uint8_t>()[i];
        const float got = v[size_t(i)];
        if (code == 0xff) {
          ASSERT_TRUE(std::isnan(got)) << name << " code 0xff gave " << got;
        } else {
          ASSERT_EQ(got, std::ldexp(1.0f, code - 127)) << name << " code " << code;
          ASSERT_FALSE(std::signbit(got)) << name << " code " << code;
        }
      }
    }
    if (t.dtype() == DType::kI8) {
      ++fp4;
      const Tensor p = ck->get(name, t.shape(), DType::kFP4x2);
      EXPECT_EQ(p.dtype(), DType::kFP4x2);
      EXPECT_EQ(p.raw(), t.raw()) << "FP4 relabelling must not copy";
    }
  }
  EXPECT_GT(fp8, 0);
  EXPECT_GT(e8m0, 0);
  EXPECT_GT(fp4, 0);
}

// ---------------------------------------------------------------- folders built here

// config.json + model.safetensors with two small tensors.
void make_single(const test::TempDir& d, const std::string& config = R"({"model_type":"toy"})") {
  write_text(d.file("config.json"), config);
  Tensor packed = Tensor::empty({1, 2}, DType::kI8);
  packed.data<int8_t>()[0] = 0x21;
  packed.data<int8_t>()[1] = 0x43;
  save_safetensors(d.file("model.safetensors"),
                   {{"w", Tensor::from_floats({1, 2, 3, 4, 5, 6}, {2, 3}, DType::kBF16)},
                    {"ids", Tensor::from_ints({1, 2}, {2})},
                    {"packed", packed}});
}

TEST(Checkpoint, GetChecksShapeAndConvertsOnlyWhenAsked) {
  test::TempDir d;
  make_single(d);
  write_text(d.file("generation_config.json"), R"({"eos_token_id":[1,2]})");
  auto ck = Checkpoint::open(d.str());
  EXPECT_EQ(ck->dir(), d.str());
  EXPECT_EQ(ck->model_type(), "toy");
  EXPECT_EQ(ck->generation_config()["eos_token_id"][1], 2);
  EXPECT_EQ(ck->names(), (std::vector<std::string>{"ids", "packed", "w"}));
  const Tensor raw = ck->get("w");
  EXPECT_EQ(raw.dtype(), DType::kBF16);
  EXPECT_EQ(ck->get("w", {2, 3}, DType::kBF16).raw(), raw.raw());
  const Tensor f = ck->get("w", {2, 3}, DType::kF32);
  EXPECT_EQ(f.dtype(), DType::kF32);
  EXPECT_EQ(f.to_float_vector(), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  const Tensor p = ck->get("packed", {1, 2}, DType::kFP4x2);
  EXPECT_EQ(p.dtype(), DType::kFP4x2);
  EXPECT_EQ(p.raw(), ck->get("packed").raw());
}

TEST(CheckpointBad, MissingTensor) {
  test::TempDir d;
  make_single(d);
  auto ck = Checkpoint::open(d.str());
  expect_invalid([&] { ck->get("model.nope.weight"); }, {"missing tensor 'model.nope.weight'", d.str()});
  expect_invalid([&] { ck->get("model.nope.weight", {2}, DType::kF32); }, {"'model.nope.weight'"});
}

TEST(CheckpointBad, WrongShape) {
  test::TempDir d;
  make_single(d);
  auto ck = Checkpoint::open(d.str());
  expect_invalid([&] { ck->get("w", {3, 2}, DType::kF32); },
                 {"tensor 'w'", d.str(), "has shape [2, 3], expected [3, 2]"});
  expect_invalid([&] { ck->get("w", {6}, DType::kBF16); }, {"expected [6]"});
}

TEST(CheckpointBad, DtypeThatCannotBeConverted) {
  test::TempDir d;
  make_single(d);
  auto ck = Checkpoint::open(d.str());
  expect_invalid([&] { ck->get("ids", {2}, DType::kF32); }, {"tensor 'ids'", "int64", "cannot be converted"});
  expect_invalid([&] { ck->get("w", {2, 3}, DType::kI32); }, {"tensor 'w'", "cannot be converted"});
}

TEST(CheckpointBad, FolderAndConfig) {
  test::TempDir d;
  expect_invalid([&] { Checkpoint::open(d.file("absent")); }, {"absent", "does not exist"});
  expect_invalid([&] { Checkpoint::open(d.str()); }, {d.str(), "missing config.json"});
  write_text(d.file("config.json"), R"({"model_type": "toy",})");
  expect_invalid([&] { Checkpoint::open(d.str()); }, {"config.json", "invalid JSON"});
  // Where the input breaks, in the input's terms; not the JSON library's own exception tag.
  write_text(d.file("config.json"), "{\"model_type\": \"toy\",\n \"hidden_size\": }");
  try {
    Checkpoint::open(d.str());
    ADD_FAILURE() << "a broken config.json loaded";
  } catch (const InvalidInput& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("config.json: invalid JSON: line 2, column 17: syntax error"), std::string::npos) << m;
    EXPECT_EQ(m.find("json.exception"), std::string::npos) << m;
    EXPECT_EQ(m.find("parse error at"), std::string::npos) << m;
  }
  write_text(d.file("config.json"), R"(["toy"])");
  expect_invalid([&] { Checkpoint::open(d.str()); }, {"config.json", "must be a JSON object"});
  write_text(d.file("config.json"), R"({"model_type":"a","model_type":"b"})");
  expect_invalid([&] { Checkpoint::open(d.str()); }, {"config.json", "duplicate key 'model_type'"});
  write_text(d.file("config.json"), R"({"hidden_size": 4})");
  expect_invalid([&] { Checkpoint::open(d.str()); }, {d.str(), "no model.safetensors"});
}

TEST(CheckpointBad, ConfigWithoutModelTypeAndBrokenGenerationConfig) {
  test::TempDir d;
  make_single(d, R"({"model_type": 3})");
  expect_invalid([&] { Checkpoint::open(d.str())->model_type(); }, {"config.json", "model_type"});
  write_text(d.file("generation_config.json"), "{");
  expect_invalid([&] { Checkpoint::open(d.str()); }, {"generation_config.json", "invalid JSON"});
}

TEST(CheckpointBad, BrokenWeightsFileNamesIt) {
  test::TempDir d;
  write_text(d.file("config.json"), R"({"model_type":"toy"})");
  test::write_bytes(d.file("model.safetensors"), {1, 2, 3});
  expect_invalid([&] { Checkpoint::open(d.str()); }, {"model.safetensors", "shorter than the 8-byte"});
}

// ---------------------------------------------------------------- sharded checkpoints

void make_shards(const test::TempDir& d) {
  write_text(d.file("config.json"), R"({"model_type":"toy"})");
  save_safetensors(d.file("model-00001-of-00002.safetensors"),
                   {{"a", Tensor::from_floats({1, 2}, {2})}, {"b", Tensor::from_floats({3}, {1})}});
  save_safetensors(d.file("model-00002-of-00002.safetensors"),
                   {{"c", Tensor::from_floats({4, 5, 6}, {3})}});
}
std::string index_json(const std::string& weight_map) {
  return R"({"metadata":{"total_size":24},"weight_map":)" + weight_map + "}";
}
const std::string kGoodMap =
    R"({"a":"model-00001-of-00002.safetensors","b":"model-00001-of-00002.safetensors",)"
    R"("c":"model-00002-of-00002.safetensors"})";

TEST(Checkpoint, ShardedIndexFindsTensorsInEveryShard) {
  test::TempDir d;
  make_shards(d);
  write_text(d.file("model.safetensors.index.json"), index_json(kGoodMap));
  auto ck = Checkpoint::open(d.str());
  EXPECT_EQ(ck->names(), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(ck->get("a", {2}, DType::kF32).to_float_vector(), (std::vector<float>{1, 2}));
  EXPECT_EQ(ck->get("c", {3}, DType::kF32).to_float_vector(), (std::vector<float>{4, 5, 6}));
  EXPECT_NE(ck->get("a").storage(), ck->get("c").storage());  // one mapping per shard
  EXPECT_EQ(ck->get("a").storage(), ck->get("b").storage());
}

TEST(Checkpoint, SingleFileWinsOverAnIndexLikeTransformers) {
  test::TempDir d;
  make_single(d);
  write_text(d.file("model.safetensors.index.json"), index_json(R"({"x":"missing.safetensors"})"));
  EXPECT_TRUE(Checkpoint::open(d.str())->has("w"));
}

TEST(CheckpointBad, ShardedIndexWithMissingShard) {
  test::TempDir d;
  make_shards(d);
  write_text(d.file("model.safetensors.index.json"),
             index_json(R"({"a":"model-00001-of-00002.safetensors","c":"model-00003-of-00003.safetensors"})"));
  expect_invalid([&] { Checkpoint::open(d.str()); },
                 {"model.safetensors.index.json", "tensor 'c'", "model-00003-of-00003.safetensors", "does not exist"});
}

TEST(CheckpointBad, ShardedIndexListingATensorTwice) {
  test::TempDir d;
  make_shards(d);
  write_text(d.file("model.safetensors.index.json"),
             index_json(R"({"a":"model-00001-of-00002.safetensors","a":"model-00002-of-00002.safetensors"})"));
  expect_invalid([&] { Checkpoint::open(d.str()); }, {"model.safetensors.index.json", "duplicate key 'a'"});
}

TEST(CheckpointBad, ShardedTensorStoredInTwoShards) {
  test::TempDir d;
  make_shards(d);
  save_safetensors(d.file("model-00002-of-00002.safetensors"),
                   {{"a", Tensor::from_floats({9, 9}, {2})}, {"c", Tensor::from_floats({4, 5, 6}, {3})}});
  write_text(d.file("model.safetensors.index.json"), index_json(kGoodMap));
  expect_invalid([&] { Checkpoint::open(d.str()); }, {"tensor 'a'", "stored in both"});
}

TEST(CheckpointBad, ShardedIndexNamingTheWrongShard) {
  test::TempDir d;
  make_shards(d);
  write_text(d.file("model.safetensors.index.json"),
             index_json(R"({"a":"model-00002-of-00002.safetensors","c":"model-00002-of-00002.safetensors"})"));
  expect_invalid([&] { Checkpoint::open(d.str()); }, {"tensor 'a'", "does not contain it"});
}

TEST(CheckpointBad, ShardedIndexMalformed) {
  test::TempDir d;
  make_shards(d);
  const std::string idx = d.file("model.safetensors.index.json");
  write_text(idx, R"({"metadata":{}})");
  expect_invalid([&] { Checkpoint::open(d.str()); }, {idx, "weight_map"});
  write_text(idx, index_json(R"({"a": 1})"));
  expect_invalid([&] { Checkpoint::open(d.str()); }, {"tensor 'a'", "integer"});
  write_text(idx, index_json(R"({"a":"../model-00001-of-00002.safetensors"})"));
  expect_invalid([&] { Checkpoint::open(d.str()); }, {"tensor 'a'", "not a file name inside the folder"});
  write_text(idx, index_json(R"({"a":"/etc/passwd"})"));
  expect_invalid([&] { Checkpoint::open(d.str()); }, {"not a file name inside the folder"});
  write_text(idx, "{\"weight_map\": ");
  expect_invalid([&] { Checkpoint::open(d.str()); }, {idx, "invalid JSON"});
}

}  // namespace
}  // namespace moex
