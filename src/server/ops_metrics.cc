#include "server/ops_metrics.h"

#include <pqxx/pqxx>

#include "metrics/metrics.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

namespace sv::server {
namespace {

// One round trip; each figure is cheap (indexed by state, or one row). Queue
// age and billing lag are measured against svd's clock ($1), the clock that
// wrote created_at and moves the billing cursor (a fake one under
// --fake-clock-start); the lease against PostgreSQL's, which it runs on.
constexpr char kOpsSql[] = R"sql(
SELECT
  (SELECT count(*) FROM instances WHERE state = 'PENDING'),
  (SELECT coalesce(extract(epoch from $1::timestamptz - min(created_at)), 0)
     FROM instances WHERE state = 'PENDING'),
  (SELECT extract(epoch from $1::timestamptz - to_timestamp(billed_before_minute * 60))
     FROM billing_cursor WHERE billed_before_minute IS NOT NULL LIMIT 1),
  (SELECT epoch FROM leader_lease WHERE name = 'control'),
  (SELECT coalesce(extract(epoch from expires_at - clock_timestamp()), -1)
     FROM leader_lease WHERE name = 'control' AND holder <> '')
)sql";

void Collect(store::Database& db, const control::Leadership& leadership, const Clock& clock,
             metrics::Registry& r) {
  const store::Database::PoolStats pool = db.Stats();
  r.SetGauge("sv_db_broken_connections", "Database connections dropped as broken since start.",
             {}, static_cast<double>(db.broken_connections()));
  r.SetGauge("sv_db_reconnect_retries",
             "Transactions retried on a fresh connection after a lost one, since start.", {},
             static_cast<double>(db.reconnect_retries()));
  (void)pool;
  double pending = 0, oldest = 0, billing_lag = -1, epoch = 0, lease_left = -1;
  absl::Status status = db.Transact([&](pqxx::work& txn) {
    txn.exec("SET LOCAL statement_timeout = 2000");
    auto row = txn.exec_params1(kOpsSql, store::SqlTime(clock.Now()));
    pending = row[0].as<double>();
    oldest = row[1].as<double>();
    billing_lag = row[2].is_null() ? -1 : row[2].as<double>();
    epoch = row[3].is_null() ? 0 : row[3].as<double>();
    lease_left = row[4].is_null() ? -1 : row[4].as<double>();
    return absl::OkStatus();
  });
  r.SetGauge("sv_db_up", "1 when the last scrape's query reached the database.", {},
             status.ok() ? 1 : 0);
  const control::Leadership::View view = leadership.view();
  r.SetGauge("sv_leader", "1 while this replica leads the control loops.", {},
             view.leader ? 1 : 0);
  if (!status.ok()) return;
  r.SetGauge("sv_scheduler_queue_length", "Instances waiting in the queue (PENDING).", {},
             pending);
  r.SetGauge("sv_scheduler_queue_oldest_seconds",
             "Age of the oldest instance waiting in the queue.", {}, oldest);
  r.SetGauge("sv_billing_lag_seconds",
             "How far the billing cursor trails now (includes the metering lag; -1 before "
             "the first run).",
             {}, billing_lag);
  r.SetGauge("sv_leader_epoch", "The leader epoch (fencing token) in the lease row.", {}, epoch);
  r.SetGauge("sv_leader_lease_remaining_seconds",
             "Time until the leader's lease expires (-1: no leader).", {}, lease_left);
}

}  // namespace

void RegisterOpsMetrics(store::Database& db, control::Leadership& leadership,
                        const Clock& clock) {
  metrics::Registry::Default().AddCollector(
      [&db, &leadership, &clock](metrics::Registry& r) { Collect(db, leadership, clock, r); });
}

std::string LeadershipStatusJson(const control::Leadership& leadership, bool shutting_down) {
  const control::Leadership::View v = leadership.view();
  nlohmann::json j = {{"replica", leadership.replica_id()},
                      {"leader", v.leader},
                      {"epoch", v.epoch},
                      {"holder", v.holder},
                      {"elections_won", v.elections_won},
                      {"terms_lost", v.terms_lost},
                      {"shutting_down", shutting_down}};
  return j.dump() + "\n";
}

}  // namespace sv::server
