// Strict JSON: a parser callback tracks the keys of every open object, so a repeated key is caught
// before nlohmann would overwrite the first value, and a depth counter stops runaway nesting.
#include "io/strict_json.hpp"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <vector>

#include "moex/error.hpp"

namespace moex::io {

namespace {

// nlohmann's message without its "[json.exception.<kind>.<id>] " tag and "parse error at " lead:
// "line 1, column 6: syntax error while parsing value - ...". The tag names the library, not the
// input, so the user sees what follows it.
std::string json_error_text(const nlohmann::json::exception& e) {
  std::string text = e.what();
  if (text.rfind("[json.exception.", 0) == 0) {
    const size_t end = text.find("] ");
    if (end != std::string::npos) text.erase(0, end + 2);
  }
  if (text.rfind("parse error at ", 0) == 0) text.erase(0, 15);
  return text;
}

}  // namespace

nlohmann::json parse_json_strict(const char* data, size_t size, const std::string& label,
                                 int max_depth) {
  // One set of seen keys per open object; arrays push nothing because only objects have keys.
  std::vector<std::set<std::string>> open_objects;
  auto callback = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    using E = nlohmann::json::parse_event_t;
    switch (event) {
      case E::object_start:
      case E::array_start:
        // `depth` is the number of containers already open around this one.
        if (depth >= max_depth)
          throw InvalidInput(label + ": JSON nested deeper than " + std::to_string(max_depth) +
                             " levels");
        if (event == E::object_start) open_objects.emplace_back();
        break;
      case E::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        break;
      case E::key: {
        const std::string& key = parsed.get_ref<const std::string&>();
        if (!open_objects.empty() && !open_objects.back().insert(key).second)
          throw InvalidInput(label + ": duplicate key '" + key + "'");
        break;
      }
      default:
        break;
    }
    return true;
  };
  try {
    return nlohmann::json::parse(data, data + size, callback, /*allow_exceptions=*/true,
                                 /*ignore_comments=*/false);
  } catch (const nlohmann::json::exception& e) {
    throw InvalidInput(label + ": invalid JSON: " + json_error_text(e));
  }
}

nlohmann::json read_json_file(const std::string& path, int max_depth) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InvalidInput(path + ": cannot open: " + std::strerror(errno));
  std::ostringstream buf;
  buf << in.rdbuf();
  if (in.bad()) throw InvalidInput(path + ": read error");
  const std::string text = buf.str();
  return parse_json_strict(text.data(), text.size(), path, max_depth);
}

std::string json_type_name(const nlohmann::json& j) {
  if (j.is_number_integer() || j.is_number_unsigned()) return "integer";
  if (j.is_number_float()) return "number";
  return j.type_name();
}

std::string printable(const std::string& s) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    if (c < 0x20 || c == 0x7f || c == '\\') {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    } else {
      out += char(c);
    }
  }
  return out;
}

}  // namespace moex::io
