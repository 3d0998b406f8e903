#ifndef SV_COMMON_MONEY_H_
#define SV_COMMON_MONEY_H_

#include <cstdint>
#include <string>

namespace sv {

// An amount of micro-yuan for people, exact: "10.56 CNY", "0.264 CNY",
// "-3.00 CNY" (at least two decimals, more only where the micros need
// them). For messages; APIs carry the int64 micros.
std::string Yuan(int64_t micros);

}  // namespace sv

#endif  // SV_COMMON_MONEY_H_
