#ifndef SV_AGENT_SUBPROCESS_H_
#define SV_AGENT_SUBPROCESS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace sv::agent {

struct CommandResult {
  int exit_code = -1;
  std::string out;  // stdout, cut at out_bytes_max.
};

// Runs argv[0] (searched in PATH) and waits at most `timeout`, then kills it.
absl::StatusOr<CommandResult> RunCommand(const std::vector<std::string>& argv,
                                         absl::Duration timeout,
                                         size_t out_bytes_max = 1 << 20);

}  // namespace sv::agent

#endif  // SV_AGENT_SUBPROCESS_H_
