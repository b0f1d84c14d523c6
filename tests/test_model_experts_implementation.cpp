// The experts-implementation map: SPEC parsing, load-time and run-time choice, the documented
// meaning of "" (default for every sub-config not named), errors that list the valid names, and
// qwen3_vl_moe's cases from its meta.json (what transformers 5.17 returned).
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "moex/error.hpp"
#include "moex/model.hpp"
#include "moex/safetensors.hpp"
#include "support/test_support.hpp"

namespace moex {
namespace {

const std::string kVl = "hf-tiny/qwen3_vl_moe/";

nlohmann::json meta() {
  std::ifstream f(test::data_path(kVl + "meta.json"));
  return nlohmann::json::parse(f);
}

ExpertsImplementation from_json(const nlohmann::json& j) {
  ExpertsImplementation m;
  for (auto it = j.begin(); it != j.end(); ++it) m[it.key()] = it.value().get<std::string>();
  return m;
}

std::unique_ptr<CausalLM> load_vl(const ExpertsImplementation& impl) {
  LoadOptions o;
  o.experts_implementation = impl;
  return from_pretrained(test::data_path(kVl + "checkpoint_fp32"), o);
}

TEST(ParseExpertsImplementation, NameAndJsonObject) {
  EXPECT_EQ(parse_experts_implementation("eager"), (ExpertsImplementation{{"", "eager"}}));
  EXPECT_EQ(parse_experts_implementation(R"({"text_config":"grouped_mm","":"eager"})"),
            (ExpertsImplementation{{"", "eager"}, {"text_config", "grouped_mm"}}));
  EXPECT_EQ(parse_experts_implementation(" {}"), ExpertsImplementation{});
  EXPECT_THROW(parse_experts_implementation(""), InvalidInput);
  EXPECT_THROW(parse_experts_implementation("{\"a\": 1}"), InvalidInput);
  EXPECT_THROW(parse_experts_implementation("{\"a\": "), InvalidInput);
}

TEST(ExpertsImplementationJson, RoundTrips) {
  ExpertsImplementation m{{"", "eager"}, {"text_config", "batched_mm"}};
  EXPECT_EQ(parse_experts_implementation(experts_implementation_json(m)), m);
}

// Every SPEC transformers was asked for in meta.json gives the same map, except {"": x}, which
// follows the documented meaning and sets every entry.
TEST(Qwen3VlMoe, LoadTimeSpecsMatchTransformers) {
  const nlohmann::json m = meta();
  EXPECT_EQ(load_vl({})->get_experts_implementation(), from_json(m["default"]));
  EXPECT_EQ(load_vl(parse_experts_implementation("grouped_mm"))->get_experts_implementation(),
            from_json(m["\"grouped_mm\""]));
  const std::string mixed = R"({"text_config": "grouped_mm", "vision_config": "eager"})";
  EXPECT_EQ(load_vl(parse_experts_implementation(mixed))->get_experts_implementation(),
            from_json(m[mixed]));
  // transformers 5.17 reports {"": batched_mm, vision: grouped_mm, text: grouped_mm} here; the
  // documentation (which we follow) makes "" the default for every sub-config not named.
  const std::string empty_key = R"({"": "batched_mm"})";
  ASSERT_TRUE(m.contains(empty_key));
  EXPECT_EQ(from_json(m[empty_key]).at(""), "batched_mm");
  EXPECT_EQ(load_vl(parse_experts_implementation(empty_key))->get_experts_implementation(),
            (ExpertsImplementation{{"", "batched_mm"}, {"text_config", "batched_mm"},
                                   {"vision_config", "batched_mm"}}));
  // A named key still wins over "".
  EXPECT_EQ(load_vl({{"", "eager"}, {"text_config", "grouped_mm"}})->get_experts_implementation(),
            (ExpertsImplementation{{"", "eager"}, {"text_config", "grouped_mm"}, {"vision_config", "eager"}}));
}

TEST(Qwen3VlMoe, RunTimeSetMatchesTransformers) {
  const nlohmann::json m = meta();
  // transformers' state before its set() was {"": batched_mm, text/vision: grouped_mm}; reach the
  // same state explicitly, then apply the same set().
  auto lm = load_vl({{"", "batched_mm"}, {"text_config", "grouped_mm"}, {"vision_config", "grouped_mm"}});
  lm->set_experts_implementation(ExpertsImplementation{{"text_config", "eager"}});
  EXPECT_EQ(lm->get_experts_implementation(), from_json(m["after_set_text_eager"]));
  // A plain name sets every entry.
  lm->set_experts_implementation("batched_mm");
  for (const auto& [k, v] : lm->get_experts_implementation()) EXPECT_EQ(v, "batched_mm") << k;
}

TEST(Qwen3VlMoe, TextBackendDrivesTheTextExperts) {
  // The text experts follow the "text_config" entry: every choice gives the reference logits,
  // and a run-time switch needs no reload.
  auto ref = SafetensorsFile::open(test::data_path(kVl + "reference.safetensors"));
  auto lm = load_vl({{"", "eager"}});
  for (const char* b : {"grouped_mm", "batched_mm", "eager"}) {
    lm->set_experts_implementation(ExpertsImplementation{{"text_config", b}});
    EXPECT_LE(test::rel_l2_error(lm->logits(ref->get("input_ids")), ref->get("logits_fp32_text_only")), 1e-4)
        << b;
  }
}

TEST(ExpertsImplementationErrors, UnknownKeyListsValidKeys) {
  try {
    load_vl({{"audio_config", "eager"}});
    FAIL() << "expected UnknownName";
  } catch (const UnknownName& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("audio_config"), std::string::npos) << msg;
    EXPECT_NE(msg.find("text_config"), std::string::npos) << msg;
    EXPECT_NE(msg.find("vision_config"), std::string::npos) << msg;
  }
  // A model without sub-configs accepts only "".
  LoadOptions o;
  o.experts_implementation = {{"text_config", "eager"}};
  EXPECT_THROW(from_pretrained(test::data_path("hf-tiny/qwen2_moe/checkpoint_fp32"), o), UnknownName);
}

TEST(ExpertsImplementationErrors, UnknownBackendListsRegistered) {
  try {
    load_vl({{"text_config", "fastest"}});
    FAIL() << "expected UnknownName";
  } catch (const UnknownName& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("fastest"), std::string::npos) << msg;
    EXPECT_NE(msg.find("grouped_mm"), std::string::npos) << msg;
  }
}

TEST(ExpertsImplementationErrors, FailedSetChangesNothing) {
  auto lm = load_vl({{"", "eager"}});
  const auto before = lm->get_experts_implementation();
  EXPECT_THROW(lm->set_experts_implementation("fastest"), UnknownName);
  EXPECT_THROW(lm->set_experts_implementation(ExpertsImplementation{{"bogus", "eager"}}), UnknownName);
  EXPECT_THROW(lm->set_experts_implementation(
                   ExpertsImplementation{{"text_config", "batched_mm"}, {"vision_config", "nope"}}),
               UnknownName);
  EXPECT_EQ(lm->get_experts_implementation(), before);
}

TEST(ExpertsImplementation, PlainModelHasOnlyTheEmptyKey) {
  LoadOptions o;
  o.experts_implementation = {{"", "batched_mm"}};
  auto lm = from_pretrained(test::data_path("hf-tiny/mixtral/checkpoint_fp32"), o);
  EXPECT_EQ(lm->get_experts_implementation(), (ExpertsImplementation{{"", "batched_mm"}}));
  EXPECT_TRUE(lm->info().sub_configs.empty());
}

}  // namespace
}  // namespace moex
