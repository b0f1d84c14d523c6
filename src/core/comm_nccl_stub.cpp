// make_nccl_group in builds without CUDA (the NCCL communicator is src/cuda/comm_nccl.cu).
#include "moex/comm.hpp"

#if !defined(MOEX_WITH_CUDA)
namespace moex {

bool nccl_available() { return false; }

std::vector<std::unique_ptr<Communicator>> make_nccl_group(const std::vector<int>&, std::chrono::milliseconds) {
  throw Unsupported("make_nccl_group: this build of moex has no CUDA (configure with -DMOEX_CUDA=ON)");
}

std::unique_ptr<Communicator> make_nccl_rank(int, int, int, const std::string&, std::chrono::milliseconds) {
  throw Unsupported("make_nccl_rank: this build of moex has no CUDA (configure with -DMOEX_CUDA=ON)");
}

}  // namespace moex
#endif
