#include "sla/policy.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "nlohmann/json.hpp"

namespace sv::sla {
namespace {

absl::Status Invalid(const std::string& why) {
  return Error(absl::StatusCode::kInvalidArgument, "SLA_DEFINITIONS_INVALID", why);
}

}  // namespace

std::string AggregationName(Aggregation a) {
  switch (a) {
    case Aggregation::kShareOfTime: return "share_of_time";
    case Aggregation::kMean: return "mean";
    case Aggregation::kMinimum: return "minimum";
    case Aggregation::kP99: return "p99";
  }
  return "unknown";
}

std::string ComparisonName(Comparison c) {
  return c == Comparison::kAtLeast ? "at_least" : "at_most";
}

absl::StatusOr<Metric> ParseMetric(const std::string& name) {
  for (Metric m : {Metric::kGpuUsable, Metric::kStorageWrite, Metric::kNetworkLatency}) {
    if (MetricName(m) == name) return m;
  }
  return Invalid(absl::StrCat("unknown SLA metric '", name.substr(0, 64),
                              "' (gpu_usable, storage_write, network_latency)"));
}

absl::StatusOr<Aggregation> ParseAggregation(const std::string& name) {
  for (Aggregation a : {Aggregation::kShareOfTime, Aggregation::kMean, Aggregation::kMinimum,
                        Aggregation::kP99}) {
    if (AggregationName(a) == name) return a;
  }
  return Invalid(absl::StrCat("unknown aggregation '", name.substr(0, 64),
                              "' (share_of_time, mean, minimum, p99)"));
}

absl::StatusOr<Comparison> ParseComparison(const std::string& name) {
  if (name == "at_least") return Comparison::kAtLeast;
  if (name == "at_most") return Comparison::kAtMost;
  return Invalid(absl::StrCat("unknown comparison '", name.substr(0, 64),
                              "' (at_least, at_most)"));
}

absl::StatusOr<std::vector<SlaDefinition>> ParseDefinitions(const std::string& json_text) {
  nlohmann::json doc = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_array()) {
    return Invalid("SLA definitions must be a JSON array of objects");
  }
  if (doc.size() > 16) return Invalid("at most 16 SLA definitions");
  std::vector<SlaDefinition> overrides;
  for (const auto& item : doc) {
    if (!item.is_object() || !item.contains("metric") || !item["metric"].is_string() ||
        !item.contains("threshold") || !item["threshold"].is_number_integer()) {
      return Invalid("each SLA definition needs a string metric and an integer threshold");
    }
    SV_ASSIGN_OR_RETURN(Metric metric, ParseMetric(item["metric"].get<std::string>()));
    SlaDefinition d{};
    for (const SlaDefinition& base : DefaultDefinitions()) {
      if (base.metric == metric) d = base;
    }
    d.threshold = item["threshold"].get<int64_t>();
    if (item.contains("aggregation")) {
      if (!item["aggregation"].is_string()) return Invalid("aggregation must be a string");
      SV_ASSIGN_OR_RETURN(d.aggregation,
                          ParseAggregation(item["aggregation"].get<std::string>()));
    }
    if (item.contains("comparison")) {
      if (!item["comparison"].is_string()) return Invalid("comparison must be a string");
      SV_ASSIGN_OR_RETURN(d.comparison, ParseComparison(item["comparison"].get<std::string>()));
    }
    if (item.contains("refund_basis_points")) {
      if (!item["refund_basis_points"].is_number_integer()) {
        return Invalid("refund_basis_points must be an integer");
      }
      const int64_t bp = item["refund_basis_points"].get<int64_t>();
      if (bp < 0 || bp > 10000) return Invalid("refund_basis_points must be 0..10000");
      d.refund_basis_points = static_cast<int32_t>(bp);
    }
    overrides.push_back(d);
  }
  auto merged = ApplyOverrides(DefaultDefinitions(), overrides);
  if (!merged.ok()) return Invalid(std::string(merged.status().message()));
  return merged;
}

absl::StatusOr<std::vector<SlaDefinition>> LoadDefinitionsFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Invalid(absl::StrCat("cannot read SLA definitions file ", path));
  std::stringstream text;
  text << in.rdbuf();
  return ParseDefinitions(text.str());
}

}  // namespace sv::sla
