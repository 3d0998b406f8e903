// The billing loop: RunOnce every loop_interval, on its own thread.
#include "billing/billing.h"
#include "metrics/metrics.h"
#include "spdlog/spdlog.h"

namespace sv::billing {

BillingLoop::BillingLoop(Billing& billing, const Clock& clock)
    : billing_(billing), clock_(clock),
      loop_("billing", billing.options().loop_interval, [this] { RunTurn(); }) {}

// One turn, while this replica leads (store::LeaderLoop).
void BillingLoop::RunTurn() {
  auto result = billing_.RunOnce(clock_.Now());
  metrics::Registry::Default().IncrementCounter(
      "sv_billing_runs_total", "Billing loop runs, by result.",
      {{"result", result.ok() ? "ok" : "error"}});
  if (!result.ok()) {
    spdlog::warn("billing: run failed: {}", result.status().ToString());
  } else if (result->minutes_billed > 0) {
    spdlog::info("billing: billed {} minutes, {} postings, {} stops",
                 result->minutes_billed, result->postings, result->stopped_instances);
  }
}

}  // namespace sv::billing
