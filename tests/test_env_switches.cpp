// The MOEX_* environment switches (include/moex/env_switches.hpp): one table, values it does not
// accept refused with the variable's name, every name the sources read present in the table,
// and the set measuring switches carried by `moex info` and bench rows.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "core/env_switch_read.hpp"
#include "moex/env_switches.hpp"
#include "moex/error.hpp"
#include "moex/experts.hpp"
#include "moex/model.hpp"
#include "support/test_support.hpp"
#include "test_safetensors_util.hpp"

namespace moex {
namespace {

// Sets NAME=VALUE for one scope and restores what was there.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (old_) setenv(name_.c_str(), old_->c_str(), 1);
    else unsetenv(name_.c_str());
  }

 private:
  std::string name_;
  std::optional<std::string> old_;
};

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InvalidInput& e) {
    return e.what();
  }
  return "";
}

TEST(EnvSwitches, TheTableIsComplete) {
  const auto all = env_switches();
  ASSERT_GE(all.size(), 15u);
  std::set<std::string> names;
  for (const EnvSwitch& s : all) {
    EXPECT_EQ(s.name.rfind("MOEX_", 0), 0u) << s.name;
    EXPECT_TRUE(names.insert(s.name).second) << "twice: " << s.name;
    EXPECT_FALSE(s.accepts.empty()) << s.name;
    EXPECT_FALSE(s.unset.empty()) << s.name;
    EXPECT_FALSE(s.meaning.empty()) << s.name;
  }
  EXPECT_TRUE(names.count("MOEX_PDL"));
  EXPECT_TRUE(names.count("MOEX_CACHE_DIR"));
}

// Every MOEX_ name the library and the CLI read from the environment (getenv, env_int,
// env_switch_int, env_switch_text) is in the table, so none escapes the checks and the listing.
TEST(EnvSwitches, EveryNameTheSourcesReadIsInTheTable) {
  std::set<std::string> table;
  for (const EnvSwitch& s : env_switches()) table.insert(s.name);
  const std::filesystem::path src = std::filesystem::path(MOEX_TEST_DATA).parent_path().parent_path() / "src";
  ASSERT_TRUE(std::filesystem::is_directory(src)) << src;
  const std::regex read(R"((getenv|env_int|env_switch_int|env_switch_text)\(\s*"(MOEX_[A-Z0-9_]+)\")");
  int reads = 0;
  for (const auto& f : std::filesystem::recursive_directory_iterator(src)) {
    const std::string ext = f.path().extension().string();
    if (ext != ".cpp" && ext != ".cu" && ext != ".cuh" && ext != ".hpp") continue;
    std::ifstream in(f.path());
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();
    for (std::sregex_iterator it(text.begin(), text.end(), read), end; it != end; ++it) {
      ++reads;
      EXPECT_TRUE(table.count((*it)[2].str())) << (*it)[2].str() << " is read in " << f.path()
                                               << " but missing from src/core/env_switches.cpp";
    }
  }
  EXPECT_GE(reads, 15) << "the pattern no longer finds the readers";
}

TEST(EnvSwitches, FlagsTakeZeroOrOne) {
  EXPECT_EQ(env_switch_int("MOEX_PDL", 7), 7);  // unset: the caller's fallback
  {
    ScopedEnv e("MOEX_PDL", "0");
    EXPECT_EQ(env_switch_int("MOEX_PDL", 1), 0);
    EXPECT_NO_THROW(check_env_switches());
  }
  {
    ScopedEnv e("MOEX_PDL", "");  // empty is unset
    EXPECT_EQ(env_switch_int("MOEX_PDL", 1), 1);
  }
  for (const char* bad : {"off", "true", "2", " 0", "0 ", "-1"}) {
    ScopedEnv e("MOEX_PDL", bad);
    const std::string m = message_of([] { env_switch_int("MOEX_PDL", 1); });
    EXPECT_NE(m.find("MOEX_PDL=\"" + std::string(bad) + "\""), std::string::npos) << bad << ": " << m;
    EXPECT_NE(m.find("0 or 1"), std::string::npos) << m;
    EXPECT_EQ(message_of([] { check_env_switches(); }), m);
  }
}

TEST(EnvSwitches, CountsAndChoicesAreChecked) {
  {
    ScopedEnv e("MOEX_GEMV_BLOCKS_PER_SM", "3");
    EXPECT_EQ(env_switch_int("MOEX_GEMV_BLOCKS_PER_SM", -1), 3);
  }
  for (const char* bad : {"-1", "3.5", "x", "99999999999"}) {
    ScopedEnv e("MOEX_GEMV_BLOCKS_PER_SM", bad);
    EXPECT_NE(message_of([] { env_switch_int("MOEX_GEMV_BLOCKS_PER_SM", -1); }).find("an integer >= 0"),
              std::string::npos)
        << bad;
  }
  {
    ScopedEnv e("MOEX_BENCH_L2_FLUSH", "write");
    EXPECT_EQ(env_switch_int("MOEX_BENCH_L2_FLUSH", 0), 1);
  }
  {
    ScopedEnv e("MOEX_BENCH_L2_FLUSH", "Write");
    EXPECT_NE(message_of([] { check_env_switches(); }).find("read or write"), std::string::npos);
  }
  {
    // A place is any text.
    ScopedEnv e("MOEX_CACHE_DIR", "/tmp/some where");
    EXPECT_EQ(env_switch_text("MOEX_CACHE_DIR").value_or(""), "/tmp/some where");
    EXPECT_NO_THROW(check_env_switches());
  }
}

TEST(EnvSwitches, ANameMissingFromTheTableIsALibraryBug) {
  EXPECT_THROW(env_switch_int("MOEX_NOT_A_SWITCH", 0), Error);
  try {
    env_switch_int("MOEX_NOT_A_SWITCH", 0);
  } catch (const InvalidInput&) {
    ADD_FAILURE() << "a reader's own mistake is not the user's bad input";
  } catch (const Error&) {
  }
}

TEST(EnvSwitches, MeasuringSwitchesSetAreListedPlacesAreNot) {
  ScopedEnv a("MOEX_ROPE_SPREAD", "0");
  ScopedEnv b("MOEX_BENCH_L2_FLUSH", "write");
  ScopedEnv c("MOEX_CACHE_DIR", "/tmp");
  EXPECT_EQ(measuring_switches_set(), "MOEX_ROPE_SPREAD=0 MOEX_BENCH_L2_FLUSH=write");
  for (const EnvSwitch& s : env_switches()) {
    if (s.name == "MOEX_ROPE_SPREAD") {
      EXPECT_TRUE(s.measuring);
      EXPECT_EQ(s.value.value_or(""), "0");
    }
    if (s.name == "MOEX_CACHE_DIR") EXPECT_FALSE(s.measuring);
    if (s.name == "MOEX_PDL") EXPECT_FALSE(s.value.has_value());
  }
}

// The library checks where work starts: a model load and an experts layer refuse a bad value
// before anything else, naming it.
TEST(EnvSwitches, LoadAndExpertsRefuseABadValue) {
  ScopedEnv e("MOEX_NORM_GEMV", "yes");
  const std::string dir = test::data_path("hf-tiny/qwen2_moe/checkpoint_fp32");
  const std::string m = message_of([&] { from_pretrained(dir, LoadOptions{}); });
  EXPECT_NE(m.find("MOEX_NORM_GEMV=\"yes\""), std::string::npos) << m;
  ExpertsSpec spec;
  spec.num_experts = 2;
  spec.hidden = 8;
  spec.intermediate = 8;
  const ExpertsWeights w = test::random_experts_weights(spec, DType::kF32, 1);
  EXPECT_NE(message_of([&] { Experts x(spec, w); }).find("MOEX_NORM_GEMV"), std::string::npos);
}

// The CLI: one error line naming the variable and exit 2, before the command runs; a measuring
// switch that is set appears in `moex info` and in every bench row.
TEST(EnvSwitchesCli, BadValueIsOneErrorAndExitTwo) {
  test::TempDir tmp;
  ScopedEnv e("MOEX_CPU_PROFILE", "on");
  const auto r = test::run_cli("backends", tmp.str());
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find("MOEX_CPU_PROFILE=\"on\""), std::string::npos) << r.err;
}

TEST(EnvSwitchesCli, InfoAndBenchRowsCarryTheSetSwitches) {
  test::TempDir tmp;
  ScopedEnv e("MOEX_ROPE_SPREAD", "0");
  const auto info = test::run_cli("info --model " + test::data_path("hf-tiny/qwen2_moe/checkpoint_fp32"), tmp.str());
  ASSERT_EQ(info.exit_code, 0) << info.err;
  const auto j = nlohmann::json::parse(info.out);
  ASSERT_TRUE(j["env_switches"].is_array());
  bool seen = false;
  for (const auto& s : j["env_switches"]) {
    if (s["name"] == "MOEX_ROPE_SPREAD") {
      seen = true;
      EXPECT_EQ(s["value"], "0");
      EXPECT_TRUE(s["measuring"].get<bool>());
    } else if (s["name"] == "MOEX_PDL") {
      EXPECT_TRUE(s["value"].is_null()) << s;
    }
  }
  EXPECT_TRUE(seen);

  const std::string bench =
      "bench experts --device cpu --experts 4 --top-k 2 --hidden 64 --intermediate 40 --tokens 3 --backends eager"
      " --min-iters 1 --budget-s 0.01 --bandwidth-gbs 10 --peak-tflops 1";
  const auto rows = test::run_cli(bench + " --json", tmp.str());
  ASSERT_EQ(rows.exit_code, 0) << rows.err;
  const auto row = nlohmann::json::parse(rows.out.substr(0, rows.out.find('\n')));
  EXPECT_EQ(row["measuring_switches"], "MOEX_ROPE_SPREAD=0") << row;
  const auto table = test::run_cli(bench, tmp.str());
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_NE(table.out.find("# measuring switches set: MOEX_ROPE_SPREAD=0\n"), std::string::npos) << table.out;
}

}  // namespace
}  // namespace moex
