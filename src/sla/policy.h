#ifndef SV_SLA_POLICY_H_
#define SV_SLA_POLICY_H_

// SLA definitions from configuration: names of metrics, aggregations and
// comparisons, and the definitions file of `svd --sla-definitions`.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "sla/sla.h"

namespace sv::sla {

std::string AggregationName(Aggregation a);  // share_of_time, mean, minimum, p99
std::string ComparisonName(Comparison c);    // at_least, at_most
absl::StatusOr<Metric> ParseMetric(const std::string& name);
absl::StatusOr<Aggregation> ParseAggregation(const std::string& name);
absl::StatusOr<Comparison> ParseComparison(const std::string& name);

// A definitions file is a JSON array of objects with the keys metric,
// aggregation, comparison, threshold and refund_basis_points, e.g.
//   [{"metric": "gpu_usable", "aggregation": "share_of_time",
//     "comparison": "at_least", "threshold": 9900, "refund_basis_points": 1000}]
// Each entry replaces the design.md default of its metric; metrics not named
// keep their default. INVALID_ARGUMENT / SLA_DEFINITIONS_INVALID otherwise.
absl::StatusOr<std::vector<SlaDefinition>> ParseDefinitions(const std::string& json_text);
absl::StatusOr<std::vector<SlaDefinition>> LoadDefinitionsFile(const std::string& path);

}  // namespace sv::sla

#endif  // SV_SLA_POLICY_H_
