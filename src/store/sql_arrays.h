#ifndef SV_STORE_SQL_ARRAYS_H_
#define SV_STORE_SQL_ARRAYS_H_

// PostgreSQL array literals, so that one statement can carry a whole column
// (`unnest($1::text[])`) instead of one round trip per row.

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace sv::store {

// A text[] literal: every element double-quoted, `"` and `\` escaped, so any
// string survives (ids, names, keys).
inline std::string TextArrayLiteral(const std::vector<std::string>& values) {
  std::string out = "{";
  for (size_t i = 0; i < values.size(); ++i) {
    if (i > 0) out += ',';
    out += '"';
    for (char c : values[i]) {
      if (c == '"' || c == '\\') out += '\\';
      out += c;
    }
    out += '"';
  }
  return out + "}";
}

// An int[] or bigint[] literal.
template <typename Int>
std::string IntArrayLiteral(const std::vector<Int>& values) {
  return absl::StrCat("{", absl::StrJoin(values, ","), "}");
}

}  // namespace sv::store

#endif  // SV_STORE_SQL_ARRAYS_H_
