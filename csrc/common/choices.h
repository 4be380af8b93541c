#pragma once
// How an error names the values a setting takes, and the one wording of a
// bad value: every option, environment variable and codec argument that is
// refused says "<what>: <field> must be <expected>, got <value>". Plain C++.
#include <string>
#include <vector>

namespace fp8comm {

// "'a', 'b' or 'c'"; unquoted: "a, b or c"; `last` joins the last two.
inline std::string listed(const std::vector<std::string>& names, const char* last = "or", bool quoted = true) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += i + 1 == names.size() ? std::string(" ") + last + " " : ", ";
    out += quoted ? "'" + names[i] + "'" : names[i];
  }
  return out;
}

// "<what>: <field> must be <expected>, got <got>"; `got` as the user wrote it
// (a Python repr, or a variable's text quoted).
inline std::string must_be(const std::string& what, const std::string& field, const std::string& expected,
                           const std::string& got) {
  return what + ": " + field + " must be " + expected + ", got " + got;
}

}  // namespace fp8comm
