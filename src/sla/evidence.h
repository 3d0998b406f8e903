#ifndef SV_SLA_EVIDENCE_H_
#define SV_SLA_EVIDENCE_H_

// The storage form of an instance-hour's evidence (SlaWindowEvidence in
// proto/sv/v1/sla.proto): what checkpoints and judged windows keep. GPU
// slots are stored as runs, so a healthy hour costs a few bytes per GPU.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "sla/window.h"

namespace sv::sla {

struct Evidence {
  InstanceHourWindow window;
  std::vector<std::string> node_names;  // Nodes that reported for the window.
  int64_t late_samples_ignored = 0;
};

std::string EncodeEvidence(const Evidence& evidence);
// INVALID_ARGUMENT for bytes that are not a valid evidence record.
absl::StatusOr<Evidence> DecodeEvidence(absl::Time hour_start, const std::string& bytes);

// Merges `from` into `into` (windows of one instance-hour, e.g. from two
// replicas); GPU counts may differ after a resize (see Monitor).
void MergeEvidence(Evidence& into, const Evidence& from);

// A copy of `w` with `gpu_count` GPUs: GPUs that go keep nothing; GPUs that
// come inherit the slots the others reported before `since_slot`, so growing
// an instance mid-hour is not a breach of the time before it grew.
InstanceHourWindow ResizeWindow(const InstanceHourWindow& w, int gpu_count, int since_slot);

}  // namespace sv::sla

#endif  // SV_SLA_EVIDENCE_H_
