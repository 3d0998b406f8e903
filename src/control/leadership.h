#ifndef SV_CONTROL_LEADERSHIP_H_
#define SV_CONTROL_LEADERSHIP_H_

// Leader election through PostgreSQL (docs/reliability.md). Every svd
// replica runs a Leadership; at most one holds the lease row `control` at a
// time. The leader-only loops (scheduling, billing, node health, SLA) ask it
// through store::LeaderGate before each turn, and run the turn fenced with
// the lease's epoch, so writes of a deposed leader are rejected by the
// database.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "store/database.h"

namespace sv::control {

struct LeadershipOptions {
  // Names this replica in the lease row; unique per process.
  std::string replica_id;
  // A lease not renewed for this long (by the database's clock) may be
  // taken over. Takeover after a leader dies takes at most lease +
  // renew_interval.
  absl::Duration lease = absl::Seconds(5);
  absl::Duration renew_interval = absl::Seconds(1);
};

class Leadership : public store::LeaderGate {
 public:
  // `db` should be a small pool of its own, so a busy API pool can never
  // delay renewals.
  Leadership(store::Database& db, LeadershipOptions options);
  ~Leadership() override;
  Leadership(const Leadership&) = delete;
  Leadership& operator=(const Leadership&) = delete;

  // One election or renewal step now (Start runs one before its thread, so
  // a lone replica leads from its first request).
  absl::Status Step();
  void Start();
  // Stops campaigning and hands the lease back, so another replica takes
  // over at its next step instead of waiting for the lease to expire. Stop
  // the leader-only loops first.
  void Stop();

  // The epoch while this replica leads and its last renewal is younger than
  // the lease (less a margin), by the local monotonic clock.
  std::optional<int64_t> LeaderEpoch() const override;
  bool is_leader() const { return LeaderEpoch().has_value(); }
  const std::string& replica_id() const { return options_.replica_id; }

  struct View {
    bool leader = false;
    int64_t epoch = 0;          // Ours while leading, else the last seen.
    std::string holder;         // Last seen holder ('' = free).
    int64_t elections_won = 0;
    int64_t terms_lost = 0;     // Deposed or lease lapsed while leading.
  };
  View view() const;

  // A default replica id: host name, process id and a random suffix.
  static std::string DefaultReplicaId();

 private:
  absl::Status Campaign();
  absl::Status Renew();
  void Lose(const std::string& why);  // Call with mutex_ held.
  void Run();

  store::Database& db_;
  LeadershipOptions options_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread thread_;
  // Leading while epoch_ is set and valid_until_ lies ahead.
  std::optional<int64_t> epoch_;
  std::chrono::steady_clock::time_point valid_until_{};
  int64_t seen_epoch_ = 0;
  std::string seen_holder_;
  int64_t elections_won_ = 0;
  int64_t terms_lost_ = 0;
};

}  // namespace sv::control

#endif  // SV_CONTROL_LEADERSHIP_H_
