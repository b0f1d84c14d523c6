// The one table of architectures: model_type -> factory. Adding an architecture is adding its
// file (src/model/arch_<model_type>.cpp defining make_<model_type>) and one line here.
#include "model/architecture.hpp"

namespace moex::model {

const std::vector<ArchitectureEntry>& architectures() {
  static const std::vector<ArchitectureEntry> table = {
      {"deepseek_v3", make_deepseek_v3},
      {"gpt_oss", make_gpt_oss},
      {"mixtral", make_mixtral},
      {"olmoe", make_olmoe},
      {"qwen2_moe", make_qwen2_moe},
      {"qwen3_moe", make_qwen3_moe},
      {"qwen3_vl_moe", make_qwen3_vl_moe},
  };
  return table;
}

}  // namespace moex::model
