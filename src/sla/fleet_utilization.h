#ifndef SV_SLA_FLEET_UTILIZATION_H_
#define SV_SLA_FLEET_UTILIZATION_H_

// GPU utilization per node and hour, for the operator dashboard's fleet
// charts. Unlike the SLA windows (per instance, health not activity), this
// is raw activity: every GPU sample an agent streams, held or idle, adds its
// utilization percent to its node's hour. Sums stay in memory and are added
// to node_gpu_utilization_hourly every flush interval and at Stop(); a crash
// loses at most one interval of samples, which only thins a chart. Each
// flush carries a key; one that failed (its commit perhaps in doubt) is
// sent again as it was, with its key, before anything newer, so no sample
// is counted twice.

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "store/database.h"
#include "store/utilization_store.h"

namespace sv {
class PeriodicLoop;
}  // namespace sv

namespace sv::sla {

class FleetUtilization {
 public:
  FleetUtilization(store::Database& db, const Clock& clock,
                   absl::Duration flush_interval = absl::Seconds(10));
  ~FleetUtilization();

  // Thread-safe; one call per telemetry batch and hour.
  void Add(const std::string& node_name, absl::Time hour, int64_t utilization_sum,
           int64_t sample_count);
  // Writes what was added since the last flush; on failure keeps it.
  absl::Status Flush();

  void Start();
  void Stop();

  // Rows older than this are dropped at each flush.
  static constexpr absl::Duration kRetention = absl::Hours(24 * 35);

 private:
  store::UtilizationStore store_;
  const Clock& clock_;
  std::mutex mutex_;
  std::map<std::pair<std::string, int64_t>, store::UtilizationSum> pending_;
  // Serializes flushes; guards the fields below.
  std::mutex flush_mutex_;
  const std::string incarnation_;  // random, one per process
  int64_t flush_sequence_ = 0;
  // A flush that failed, to be sent again with the same key and deltas.
  std::string unsent_key_;
  std::vector<store::NodeUtilizationDelta> unsent_;
  std::unique_ptr<PeriodicLoop> loop_;
};

}  // namespace sv::sla

#endif  // SV_SLA_FLEET_UTILIZATION_H_
