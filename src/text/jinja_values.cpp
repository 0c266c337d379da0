// Value printing for the native chat template. Floats print as the shortest round-trip form with the
// exponent rules of Python's repr (fixed notation for 1e-4 <= |x| < 1e16), so tool schemas with
// numbers render as transformers renders them.
#include "text/jinja_values.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include <fmt/format.h>

#include "text/unicode.h"

namespace ds::text {
namespace {

void append_string(std::string* out, const std::string& s) {
  out->push_back('"');
  for (unsigned char c : s) {
    switch (c) {
      case '"': *out += "\\\""; break;
      case '\\': *out += "\\\\"; break;
      case '\n': *out += "\\n"; break;
      case '\r': *out += "\\r"; break;
      case '\t': *out += "\\t"; break;
      case '\b': *out += "\\b"; break;
      case '\f': *out += "\\f"; break;
      default:
        if (c < 0x20) {
          *out += fmt::format("\\u{:04x}", c);
        } else {
          out->push_back(static_cast<char>(c));
        }
    }
  }
  out->push_back('"');
}

// Python repr(float): shortest digits that round-trip, fixed or exponent notation as repr chooses.
std::string python_float(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  if (v == 0) return std::signbit(v) ? "-0.0" : "0.0";
  // Shortest round-trip digits via %.{p}e.
  char buf[64];
  for (int precision = 0; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof(buf), "%.*e", precision, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  // buf = [-]d.ddddde[+-]XX
  std::string s(buf);
  bool negative = s[0] == '-';
  if (negative) s.erase(0, 1);
  size_t e = s.find('e');
  int exponent = std::atoi(s.c_str() + e + 1);
  std::string digits;
  for (size_t i = 0; i < e; ++i) {
    if (s[i] != '.') digits.push_back(s[i]);
  }
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  std::string out = negative ? "-" : "";
  if (exponent >= -4 && exponent < 16) {
    if (exponent < 0) {
      out += "0." + std::string(-exponent - 1, '0') + digits;
    } else if (static_cast<int>(digits.size()) <= exponent + 1) {
      out += digits + std::string(exponent + 1 - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, exponent + 1) + "." + digits.substr(exponent + 1);
    }
  } else {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    out += fmt::format("e{}{:02d}", exponent < 0 ? '-' : '+', std::abs(exponent));
  }
  return out;
}

void append_json(std::string* out, const nlohmann::ordered_json& v) {
  using T = nlohmann::ordered_json::value_t;
  switch (v.type()) {
    case T::null: *out += "null"; break;
    case T::boolean: *out += v.get<bool>() ? "true" : "false"; break;
    case T::number_integer: *out += std::to_string(v.get<int64_t>()); break;
    case T::number_unsigned: *out += std::to_string(v.get<uint64_t>()); break;
    case T::number_float: *out += python_float(v.get<double>()); break;
    case T::string: append_string(out, v.get_ref<const std::string&>()); break;
    case T::array: {
      out->push_back('[');
      bool first = true;
      for (const auto& e : v) {
        if (!first) *out += ", ";
        first = false;
        append_json(out, e);
      }
      out->push_back(']');
      break;
    }
    case T::object: {
      out->push_back('{');
      bool first = true;
      for (const auto& [key, e] : v.items()) {
        if (!first) *out += ", ";
        first = false;
        append_string(out, key);
        *out += ": ";
        append_json(out, e);
      }
      out->push_back('}');
      break;
    }
    default: *out += "null"; break;  // binary / discarded values do not come from JSON text
  }
}

bool python_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

}  // namespace

std::string jinja_tojson(const nlohmann::ordered_json& value) {
  std::string out;
  append_json(&out, value);
  return out;
}

std::string jinja_string(const nlohmann::ordered_json& value) {
  using T = nlohmann::ordered_json::value_t;
  switch (value.type()) {
    case T::string: return value.get<std::string>();
    case T::null: return "None";
    case T::boolean: return value.get<bool>() ? "True" : "False";
    case T::number_float: return python_float(value.get<double>());
    default: return jinja_tojson(value);
  }
}

std::string_view python_strip(std::string_view s) {
  size_t begin = 0;
  while (begin < s.size()) {
    size_t pos = begin;
    uint32_t cp = utf8_decode(s, &pos);
    if (cp == kInvalidCodePoint || !python_space(cp)) break;
    begin = pos;
  }
  size_t end = s.size();
  while (end > begin) {
    // Step back to the start of the last code point.
    size_t start = end - 1;
    while (start > begin && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80 && end - start < 4) --start;
    size_t pos = start;
    uint32_t cp = utf8_decode(s, &pos);
    if (pos != end || cp == kInvalidCodePoint || !python_space(cp)) break;
    end = start;
  }
  return s.substr(begin, end - begin);
}

}  // namespace ds::text
