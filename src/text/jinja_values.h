// How the chat template's Jinja expressions print values, reproduced natively: `tojson` as the
// transformers chat-template environment defines it (json.dumps with ensure_ascii=False, ", " and ": "
// separators, keys in insertion order), `| string` as Python's str(), and `| trim` as Python's strip().
// Non-ASCII text is written as is, never as \u escapes.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace ds::text {

std::string jinja_tojson(const nlohmann::ordered_json& value);
// str(value) for scalars: strings unquoted, True/False/None, Python float repr.
std::string jinja_string(const nlohmann::ordered_json& value);
// Python str.strip(): removes Unicode whitespace (str.isspace) from both ends.
std::string_view python_strip(std::string_view s);

}  // namespace ds::text
