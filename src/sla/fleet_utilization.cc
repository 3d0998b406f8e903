#include "sla/fleet_utilization.h"

#include <vector>

#include "sla/runtime.h"
#include "spdlog/spdlog.h"

namespace sv::sla {

FleetUtilization::FleetUtilization(store::Database& db, const Clock& clock,
                                   absl::Duration flush_interval)
    : store_(db), clock_(clock) {
  loop_ = std::make_unique<PeriodicLoop>(
      "fleet-utilization", flush_interval,
      [this] {
        absl::Status s = Flush();
        if (!s.ok()) spdlog::warn("fleet utilization: flush failed: {}", s.ToString());
      },
      [this] {
        absl::Status s = Flush();
        if (!s.ok()) spdlog::warn("fleet utilization: final flush failed: {}", s.ToString());
      });
}

FleetUtilization::~FleetUtilization() = default;

void FleetUtilization::Add(const std::string& node_name, absl::Time hour,
                           int64_t utilization_sum, int64_t sample_count) {
  if (sample_count <= 0) return;
  std::lock_guard<std::mutex> lock(mutex_);
  store::UtilizationSum& s = pending_[{node_name, absl::ToUnixSeconds(hour)}];
  s.utilization_sum += utilization_sum;
  s.sample_count += sample_count;
}

absl::Status FleetUtilization::Flush() {
  std::map<std::pair<std::string, int64_t>, store::UtilizationSum> taken;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    taken.swap(pending_);
  }
  std::vector<store::NodeUtilizationDelta> deltas;
  deltas.reserve(taken.size());
  for (const auto& [key, sum] : taken) {
    deltas.push_back({key.first, absl::FromUnixSeconds(key.second), sum});
  }
  absl::Status status = store_.Add(deltas, clock_.Now() - kRetention);
  if (!status.ok()) {
    // Put the sums back; the next flush adds them.
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [key, sum] : taken) {
      store::UtilizationSum& s = pending_[key];
      s.utilization_sum += sum.utilization_sum;
      s.sample_count += sum.sample_count;
    }
  }
  return status;
}

void FleetUtilization::Start() { loop_->Start(); }
void FleetUtilization::Stop() { loop_->Stop(); }

}  // namespace sv::sla
