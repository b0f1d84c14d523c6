// The CPU experts backends, composed with their CUDA counterparts in src/core/builtin_backends.cpp.
#pragma once

#include <memory>

#include "moex/experts.hpp"

namespace moex::cpu {

std::shared_ptr<const ExpertsBackend> make_eager_backend();
std::shared_ptr<const ExpertsBackend> make_batched_mm_backend();
std::shared_ptr<const ExpertsBackend> make_grouped_mm_backend();

// Capabilities shared by the CPU implementations (CPU + the fake GPU used by policy tests).
BackendCaps cpu_caps(std::string description);

}  // namespace moex::cpu
