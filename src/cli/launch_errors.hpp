// The fatal errors of `moex launch`'s ranks, printed once each by the launcher.
//
// Every rank of a launched group meets the same bad input (the same checkpoint, flags and
// config), so N ranks printing their error line each gave N copies of it. Instead a launched
// rank (MOEX_RENDEZVOUS and RANK set) hands its error line to the launcher through a file beside
// the rendezvous file, and the launcher, once every rank has ended, prints each distinct line
// once, naming the ranks that gave it ("ranks 0-3: moex generate: error: ..."); a rank whose
// error differs (its own GPU, its own shard) keeps its own line. Only the one fatal line goes
// this way: warnings and progress still go to stderr as the rank writes them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moex::cli {

// In a launched rank: writes `line` (one error line, with or without its newline) where the
// launcher collects it and returns true; false when this process is not a launched rank or the
// file cannot be written (the caller then prints the line itself).
bool hand_error_to_launcher(const std::string& line);

// In the launcher: the lines its ranks handed over in `dir` (the rendezvous directory), each
// distinct line once, in the order of the first rank that gave it, prefixed with the ranks
// ("rank 2: ...", "ranks 0-1, 3: ...").
std::vector<std::string> collect_rank_errors(const std::string& dir, int64_t nranks);

}  // namespace moex::cli
