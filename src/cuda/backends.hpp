// The CUDA experts backends (eager, batched_mm, grouped_mm). The registry composes each with the
// CPU implementation of the same name, so a call on a CUDA tensor lands here.
//
// Graph capture: batched_mm and grouped_mm launch a fixed sequence of kernels whose grids depend
// only on (T, k, E, H, I); per-expert sizes stay on the device. Their workspace belongs to the
// prepared state (one grow-only buffer per stream, kept until the prepared state dies), so a
// captured graph stays valid while the Experts module that prepared it lives; the first forward of
// a given size should run before capture (it may allocate). eager reads the per-expert offsets
// back to the host and is not capturable.
#pragma once

#include <memory>

#include "moex/experts.hpp"

namespace moex::cuda {

std::shared_ptr<const ExpertsBackend> make_eager_backend();
std::shared_ptr<const ExpertsBackend> make_batched_mm_backend();
std::shared_ptr<const ExpertsBackend> make_grouped_mm_backend();

}  // namespace moex::cuda
