#ifndef SV_SERVER_OPS_METRICS_H_
#define SV_SERVER_OPS_METRICS_H_

// Gauges read from PostgreSQL at each /metrics scrape, so every replica
// (leader or not) reports the same cluster-wide figures: the scheduler
// queue, the billing lag, the leader, and the pool's reconnects.

#include <string>

#include "common/clock.h"
#include "control/leadership.h"
#include "store/database.h"

namespace sv::server {

// `clock` is svd's (fake under --fake-clock-start): queue age and billing
// lag are measured against it.
void RegisterOpsMetrics(store::Database& db, control::Leadership& leadership,
                        const Clock& clock);

// {"replica": ..., "leader": true, "epoch": 7, "holder": ..., "shutting_down": false}
std::string LeadershipStatusJson(const control::Leadership& leadership, bool shutting_down);

}  // namespace sv::server

#endif  // SV_SERVER_OPS_METRICS_H_
