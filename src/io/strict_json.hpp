// JSON parsing for untrusted input (safetensors headers, config.json, index files).
//
// nlohmann::json keeps the last of two equal keys silently; in a safetensors header or an index
// weight_map that would hide a tensor listed twice, so duplicates are an error here. Nesting is
// capped so that a hostile file cannot make the parser build a huge tree of empty arrays.
// Every failure is a moex::InvalidInput that starts with `label` (the file it came from).
#pragma once

#include <cstddef>
#include <string>

#include <nlohmann/json.hpp>

namespace moex::io {

// Parses [data, data + size). Throws InvalidInput "<label>: invalid JSON: ..." for syntax errors
// (with the byte position), "<label>: duplicate key 'k'" and "<label>: JSON nested deeper than
// max_depth". Does not require the top level to be an object (callers check what they need).
nlohmann::json parse_json_strict(const char* data, size_t size, const std::string& label,
                                 int max_depth = 64);

// Reads a whole (small) file and parses it as above. Throws InvalidInput when the file cannot be
// read, naming the path and the reason.
nlohmann::json read_json_file(const std::string& path, int max_depth = 64);

// The type of a JSON value as error messages name it ("string", "integer", "array", ...).
std::string json_type_name(const nlohmann::json& j);

// A name from a file (tensor, shard, key) as an error message can show it: control bytes (a NUL
// would cut the message where C strings end) become \xNN, and so does a backslash; the rest is
// unchanged.
std::string printable(const std::string& s);

}  // namespace moex::io
