#ifndef SV_STORE_UTILIZATION_STORE_H_
#define SV_STORE_UTILIZATION_STORE_H_

// Hourly GPU utilization per node (migration 0050), for the operator
// dashboard: what the agents' GPU samples said, summed per node and hour.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "store/database.h"

namespace sv::store {

// A sum of utilization percents over sample_count GPU samples.
struct UtilizationSum {
  int64_t utilization_sum = 0;
  int64_t sample_count = 0;
  // The mean in whole percent, rounded down; -1 without samples.
  int MeanPct() const {
    return sample_count > 0 ? static_cast<int>(utilization_sum / sample_count) : -1;
  }
};

struct NodeUtilizationDelta {
  std::string node_name;
  absl::Time hour;  // Start of the hour (UTC).
  UtilizationSum sum;
};

struct UtilizationPoint {
  absl::Time hour;
  UtilizationSum sum;
};

class UtilizationStore {
 public:
  explicit UtilizationStore(Database& db) : db_(db) {}

  // Adds the deltas to their rows in one statement, once per `flush_key`:
  // a key already applied adds nothing, so a flush whose commit was in
  // doubt may be sent again with the same key and the same deltas. Drops
  // hours before `keep_from`, and keys older than a day.
  absl::Status Add(const std::string& flush_key, const std::vector<NodeUtilizationDelta>& deltas,
                   absl::Time keep_from, absl::Time now);
  // Per node name, the sums over the hours starting in [from, to).
  absl::StatusOr<std::map<std::string, UtilizationSum>> ByNode(absl::Time from, absl::Time to);
  // The fleet's sums per hour starting in [from, to), oldest first; hours
  // without samples are left out.
  absl::StatusOr<std::vector<UtilizationPoint>> Series(absl::Time from, absl::Time to);

 private:
  Database& db_;
};

}  // namespace sv::store

#endif  // SV_STORE_UTILIZATION_STORE_H_
