// oneDNN comparison for the kernel choice (docs/cpu.md): one expert's gate_up product
// [m, K=2048] x [K, N=2816] in bf16 with fp32 output, weights reordered once into the layout
// oneDNN picks (format_tag::any), timed like experts_lab kernels (median of 7, cache-hot).
// Build: g++ -std=c++20 -O2 -fopenmp lab/cpu/onednn_lab.cpp -ldnnl -o build-cpu/onednn_lab
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "dnnl.hpp"

using namespace dnnl;

static double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int main() {
  engine eng(engine::kind::cpu, 0);
  stream st(eng);
  const memory::dim K = 2048, N = 2816;
  for (memory::dim m : {1, 4, 32, 64, 256}) {
    memory::desc a_md({m, K}, memory::data_type::bf16, memory::format_tag::ab);
    memory::desc b_any({K, N}, memory::data_type::bf16, memory::format_tag::any);
    memory::desc c_md({m, N}, memory::data_type::f32, memory::format_tag::ab);
    matmul::primitive_desc pd(matmul::desc(a_md, b_any, c_md), eng);
    memory a(a_md, eng), c(c_md, eng), b_plain({{K, N}, memory::data_type::bf16, memory::format_tag::ba}, eng);
    memory b(pd.weights_desc(), eng);
    std::fill_n(static_cast<uint16_t*>(a.get_data_handle()), m * K, uint16_t(0x3c00));
    std::fill_n(static_cast<uint16_t*>(b_plain.get_data_handle()), K * N, uint16_t(0x3c00));
    reorder(b_plain, b).execute(st, b_plain, b);
    matmul prim(pd);
    auto run = [&] { prim.execute(st, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}}); st.wait(); };
    run();
    std::vector<double> ts;
    for (int r = 0; r < 7; ++r) {
      double t0 = now_s();
      run();
      ts.push_back(now_s() - t0);
    }
    std::sort(ts.begin(), ts.end());
    std::printf("onednn bf16 m=%3ld  %8.1f GFLOP/s  %7.1f GB/s (weights, cache-hot)  impl=%s\n", long(m),
                2.0 * m * N * K / ts[3] / 1e9, 2.0 * K * N / ts[3] / 1e9, pd.impl_info_str());
  }
  return 0;
}
