#include "common/money.h"

#include "absl/strings/str_cat.h"

namespace sv {

std::string Yuan(int64_t micros) {
  const bool negative = micros < 0;
  const uint64_t abs = negative ? 0 - static_cast<uint64_t>(micros) : micros;
  std::string frac = std::to_string(abs % 1'000'000);
  frac.insert(0, 6 - frac.size(), '0');
  while (frac.size() > 2 && frac.back() == '0') frac.pop_back();
  return absl::StrCat(negative ? "-" : "", abs / 1'000'000, ".", frac, " CNY");
}

}  // namespace sv
