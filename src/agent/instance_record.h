#ifndef SV_AGENT_INSTANCE_RECORD_H_
#define SV_AGENT_INSTANCE_RECORD_H_

// What svagent knows of its instances beyond what the runtime keeps, in a
// file so that it outlives the svagent process:
// - the run (svd's start number) each instance was started under. A
//   restarted agent that knew none adopted whatever process it found as
//   the run svd asked for, even one svd had stopped and placed again
//   elsewhere on the node (other GPUs) while the agent was away;
// - the instances that ended by themselves while svd still wanted them.
//   The runtime forgets an ended instance once the agent has read its
//   exit, so an agent restarted before svd heard of the exit took the
//   instance for one to start, and ran the tenant's finished job again.

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace sv::agent {

struct EndedInstance {
  int64_t run = 0;  // The run the instance ended in.
  int exit_code = 0;
  std::string detail;
  absl::Time observed;  // When the agent saw it end.
  bool operator==(const EndedInstance&) const = default;
};

struct InstanceRecord {
  std::map<std::string, int64_t> runs;  // Instance id -> run.
  std::map<std::string, EndedInstance> ended;
  bool operator==(const InstanceRecord&) const = default;
};

// A missing file is an empty record.
absl::StatusOr<InstanceRecord> LoadInstanceRecord(const std::string& path);
// Replaces the file whole (a temporary file, fsync, rename), creating its
// directory; a crash leaves the old record or the new one, never a mix.
absl::Status SaveInstanceRecord(const std::string& path, const InstanceRecord& record);

}  // namespace sv::agent

#endif  // SV_AGENT_INSTANCE_RECORD_H_
