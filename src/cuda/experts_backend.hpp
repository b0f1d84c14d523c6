// What the CUDA experts backends (eager.cpp, batched_mm.cpp, grouped_mm.cpp) share: turning a
// validated ExpertsProblem into ExpertsArgs, the workspace, the common capabilities and limits.
// Each backend is one class deriving from CudaExpertsBackend in its own file, with one
// registration line; it supplies its plan, workspace size and op.
//
// Graph capture: batched_mm and grouped_mm launch a fixed sequence of kernels whose grids depend
// only on (T, k, E, H, I); per-expert sizes stay on the device. Scratch memory comes from the
// context's Workspace when the caller gives one, else from the prepared state (one grow-only
// buffer per stream, kept until the prepared state dies), so a captured graph stays valid while
// the Experts module that prepared it lives; the first forward of a given size should run before
// capture (it may allocate). eager reads the per-expert offsets back to the host and is not
// capturable.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <string>

#include "cuda/experts_ops.hpp"
#include "moex/backend_requirements.hpp"
#include "moex/experts.hpp"

namespace moex::cuda {

// The validated problem as raw pointers and sizes for the ops tier.
ExpertsArgs args_of(const ExpertsProblem& p, Tensor& out);

// What the requirement checks (moex/backend_requirements.hpp) know of CUDA device `device`.
DeviceDescription describe_cuda_device(int device);

class CudaExpertsBackend : public ExpertsBackend {
 public:
  BackendCaps caps() const override;
  std::string unsupported_reason(const ExpertsSpec& spec, DType dtype,
                                 Device device) const override;
  std::unique_ptr<PreparedExperts> prepare(const ExpertsSpec& spec,
                                           const ExpertsWeights& weights) const override;
  void forward(const ExpertsProblem& p, Tensor& out, const ExecContext& ctx) const final;

 protected:
  virtual std::string description() const = 0;
  virtual bool capturable() const { return true; }
  // The plan of this call (the default policy of each backend; tests override it).
  virtual ExpertsPlan plan(const ExpertsArgs& a, const DeviceTraits& d) const = 0;
  virtual size_t workspace_bytes(const ExpertsArgs& a, const ExpertsPlan& plan) const = 0;
  virtual void run(const ExpertsArgs& a, const ExpertsPlan& plan, void* workspace,
                   cudaStream_t stream) const = 0;
};

}  // namespace moex::cuda
