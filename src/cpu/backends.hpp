// What the CPU experts backends (eager.cpp, batched_mm.cpp, grouped_mm.cpp) share. Each backend is
// one class in its own file with one registration line; the CUDA implementations of the same
// names register themselves from src/cuda, and the registry dispatches by device.
#pragma once

#include <string>

#include "moex/experts.hpp"

namespace moex::cpu {

// Capabilities shared by the CPU implementations.
BackendCaps cpu_caps(std::string description);

}  // namespace moex::cpu
