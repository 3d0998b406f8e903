#include "sla/fleet_utilization.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "common/ids.h"
#include "common/status.h"
#include "sla/runtime.h"
#include "spdlog/spdlog.h"

namespace sv::sla {

FleetUtilization::FleetUtilization(store::Database& db, const Clock& clock,
                                   absl::Duration flush_interval)
    : store_(db), clock_(clock), incarnation_(RandomToken(16)) {
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
  std::lock_guard<std::mutex> flushing(flush_mutex_);
  if (!unsent_key_.empty()) {
    SV_RETURN_IF_ERROR(store_.Add(unsent_key_, unsent_, clock_.Now() - kRetention, clock_.Now()));
    unsent_key_.clear();
    unsent_.clear();
  }
  std::map<std::pair<std::string, int64_t>, store::UtilizationSum> taken;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    taken.swap(pending_);
  }
  if (taken.empty()) return absl::OkStatus();
  std::vector<store::NodeUtilizationDelta> deltas;
  deltas.reserve(taken.size());
  for (const auto& [key, sum] : taken) {
    deltas.push_back({key.first, absl::FromUnixSeconds(key.second), sum});
  }
  const std::string key = absl::StrCat(incarnation_, ":", ++flush_sequence_);
  absl::Status status = store_.Add(key, deltas, clock_.Now() - kRetention, clock_.Now());
  if (!status.ok()) {
    // It may have been committed: keep it as it is, under its key.
    unsent_key_ = key;
    unsent_ = std::move(deltas);
  }
  return status;
}

void FleetUtilization::Start() { loop_->Start(); }
void FleetUtilization::Stop() { loop_->Stop(); }

}  // namespace sv::sla
