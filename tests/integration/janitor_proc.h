#ifndef SV_TESTS_INTEGRATION_JANITOR_PROC_H_
#define SV_TESTS_INTEGRATION_JANITOR_PROC_H_

#include <sys/types.h>

#include <fstream>
#include <sstream>
#include <string>

namespace sv::testing::janitor {

// When process `pid` started, in clock ticks since boot (field 22 of
// /proc/<pid>/stat); -1 if it does not exist or is a zombie.
inline long long StartTicks(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(in, stat)) return -1;
  // The command name (field 2) is in parentheses and may hold spaces.
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos) return -1;
  std::istringstream fields(stat.substr(paren + 1));
  std::string state;
  fields >> state;  // field 3
  if (state == "Z" || state == "X") return -1;
  std::string skipped;
  for (int field = 4; field < 22; ++field) fields >> skipped;
  long long ticks = -1;
  fields >> ticks;
  return fields ? ticks : -1;
}

}  // namespace sv::testing::janitor

#endif  // SV_TESTS_INTEGRATION_JANITOR_PROC_H_
