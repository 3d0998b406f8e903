#ifndef SV_TESTS_FUZZ_FUZZ_INPUT_H_
#define SV_TESTS_FUZZ_FUZZ_INPUT_H_

// Splitting one fuzz input into fields, shared by the targets.

#include <cstddef>
#include <cstdint>
#include <string>

namespace sv::fuzz {

// The bytes up to `end` (or the rest), consuming them and the separator.
inline std::string TakeField(const uint8_t*& data, size_t& size, uint8_t end) {
  std::string out;
  while (size > 0 && *data != end) {
    out.push_back(static_cast<char>(*data));
    ++data;
    --size;
  }
  if (size > 0) {
    ++data;
    --size;
  }
  return out;
}

}  // namespace sv::fuzz

#endif  // SV_TESTS_FUZZ_FUZZ_INPUT_H_
