// Exceptions and OpenMP: an exception that leaves a parallel region calls std::terminate, which
// kills the process instead of reporting (an allocation failing in a thread's scratch buffer was
// enough). Code inside a region that may throw runs under ParallelErrors::run, which keeps the
// first exception; rethrow() after the region throws it on the calling thread. Once one is
// kept, later run() calls skip their work (the region's result is discarded anyway).
//
//   ParallelErrors errors;
//   #pragma omp parallel
//   {
//     std::vector<float> scratch;
//     errors.run([&] { scratch.resize(n); });
//   #pragma omp for
//     for (int64_t i = 0; i < items; ++i) errors.run([&] { work(i, scratch); });
//   }
//   errors.rethrow();
//
// Every thread still reaches every worksharing construct (skipping is inside the loop body), as
// OpenMP requires.
#pragma once

#include <atomic>
#include <exception>
#include <mutex>

namespace moex {

class ParallelErrors {
 public:
  template <class F>
  void run(F&& f) noexcept {
    if (failed_.load(std::memory_order_relaxed)) return;
    try {
      f();
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!first_) first_ = std::current_exception();
      failed_.store(true, std::memory_order_relaxed);
    }
  }
  bool failed() const { return failed_.load(std::memory_order_relaxed); }
  void rethrow() const {
    if (first_) std::rethrow_exception(first_);
  }

 private:
  std::atomic<bool> failed_{false};
  std::mutex mutex_;
  std::exception_ptr first_;
};

}  // namespace moex
