// The DRAM read ceiling `moex bench experts --device cpu` divides by (measure_dram_read_gbs: 1 GiB
// on huge pages, all OpenMP threads, best of 3 passes), called 8 times in a row: on a shared VM
// the readings move (docs/cpu.md, "The floor on this machine moves"), so a fraction of the floor
// is worth as much as the spread of these readings around it.
//
//   g++ -std=c++20 -O2 -fopenmp -Iinclude -Isrc lab/cpu/dram_read_ceiling.cpp -Lbuild -lmoex \
//       -Wl,-rpath,build -o build/dram_read_ceiling && OMP_NUM_THREADS=2 build/dram_read_ceiling
#include <cstdio>

#include "cpu/engine.hpp"

int main() {
  for (int i = 0; i < 8; ++i) std::printf("%.1f ", moex::cpu::measure_dram_read_gbs());
  std::printf("GB/s\n");
}
