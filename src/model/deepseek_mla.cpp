// See deepseek_mla.hpp.
#include "model/deepseek_mla.hpp"

#include <cmath>

#include "moex/error.hpp"

namespace moex::model {
namespace {

// get_mscale of DeepSeek's yarn: 0.1 * m * ln(s) + 1 for s > 1.
double yarn_get_mscale(double scale, double mscale) {
  return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

// The rope parameter object of a config (transformers 5 "rope_parameters" or the older
// "rope_scaling"); null when neither is present.
nlohmann::json rope_params(const nlohmann::json& config) {
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    auto it = config.find(key);
    if (it != config.end() && it->is_object()) return *it;
  }
  return nlohmann::json();
}

}  // namespace

float mla_softmax_scale(const nlohmann::json& config, int64_t qk_head_dim, const std::string& where) {
  double scale = 1.0 / std::sqrt(double(qk_head_dim));
  const nlohmann::json rp = rope_params(config);
  if (rp.is_null()) return float(scale);
  std::string type = "default";
  if (rp.contains("rope_type") && rp["rope_type"].is_string()) type = rp["rope_type"];
  else if (rp.contains("type") && rp["type"].is_string()) type = rp["type"];
  if (type == "default") return float(scale);
  const double mscale_all_dim =
      rp.contains("mscale_all_dim") && rp["mscale_all_dim"].is_number() ? rp["mscale_all_dim"].get<double>() : 0.0;
  if (mscale_all_dim != 0.0) {
    if (!rp.contains("factor") || !rp["factor"].is_number())
      throw InvalidInput(where + ": rope parameters of type '" + type + "' need a numeric 'factor'");
    const double m = yarn_get_mscale(rp["factor"].get<double>(), mscale_all_dim);
    scale *= m * m;
  }
  return float(scale);
}

}  // namespace moex::model
