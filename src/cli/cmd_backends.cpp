// `moex backends [--json]`: the registered experts backends, where they run and on which dtypes.
#include <cstdio>

#include <nlohmann/json.hpp>

#include "cli/args.hpp"
#include "cli/command.hpp"
#include "moex/experts.hpp"

namespace moex::cli {
namespace {

int run_backends(const std::vector<std::string>& argv) {
  static const Usage kUsage{"backends", "[--json]", "List the registered experts backends: devices, dtypes, graph capture, quantized weights, description.",
                            {{"json", "", "one JSON object per backend and line"}}};
  Args args(argv, kUsage);
  for (const auto& name : experts_backend_names()) {
    BackendCaps c = get_experts_backend(name)->caps();
    std::vector<std::string> devs, dts;
    for (auto d : c.devices) devs.push_back(Device{d, 0}.str());
    for (auto t : c.dtypes) dts.emplace_back(dtype_name(t));
    if (args.has("json")) {
      nlohmann::json j{{"name", name}, {"devices", devs}, {"dtypes", dts},
                       {"graph_capturable", c.graph_capturable},
                       {"quantized_weights", c.quantized_weights},
                       {"description", c.description}};
      std::printf("%s\n", j.dump().c_str());
    } else {
      std::string d, t;
      for (auto& s : devs) d += (d.empty() ? "" : ",") + s;
      for (auto& s : dts) t += (t.empty() ? "" : ",") + s;
      std::printf("%-17s devices=%-10s dtypes=%-24s graph=%-3s quantized=%-3s %s\n", name.c_str(), d.c_str(),
                  t.c_str(), c.graph_capturable ? "yes" : "no", c.quantized_weights ? "yes" : "no",
                  c.description.c_str());
    }
  }
  return 0;
}

Registration reg({"backends", "list the registered experts backends", run_backends});

}  // namespace
}  // namespace moex::cli
