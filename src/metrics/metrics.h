#ifndef SV_METRICS_METRICS_H_
#define SV_METRICS_METRICS_H_

// Prometheus-style metrics: counters, gauges and histograms with labels,
// rendered in the text exposition format at /metrics.

#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace sv::metrics {

using Labels = std::vector<std::pair<std::string, std::string>>;

class Registry {
 public:
  // The process-wide registry that svd serves.
  static Registry& Default();

  void IncrementCounter(const std::string& name, const std::string& help,
                        const Labels& labels, double by = 1);
  void SetGauge(const std::string& name, const std::string& help, const Labels& labels,
                double value);
  // Fixed buckets (upper bounds, ascending), given on first use of `name`.
  void ObserveHistogram(const std::string& name, const std::string& help,
                        const Labels& labels, double value,
                        const std::vector<double>& bounds);

  // Runs at each render, e.g. to read a pool's size into gauges.
  void AddCollector(std::function<void(Registry&)> collector);

  std::string Render();

  // Bounds series per metric so a label with unbounded values cannot eat
  // memory; past it, new series are dropped and counted.
  static constexpr size_t kSeriesPerMetricMax = 10000;

 private:
  enum class Type { kCounter, kGauge, kHistogram };
  struct Series {
    double value = 0;                 // Counter or gauge.
    std::vector<uint64_t> buckets;    // Histogram: per bound, not cumulative.
    uint64_t count = 0;
    double sum = 0;
  };
  struct Family {
    Type type;
    std::string help;
    std::vector<double> bounds;
    std::map<Labels, Series> series;
  };
  Series* Find(const std::string& name, const std::string& help, Type type,
               const Labels& labels);

  std::mutex mutex_;
  std::map<std::string, Family> families_;
  std::vector<std::function<void(Registry&)>> collectors_;
  uint64_t dropped_series_ = 0;
};

// Bounds for request latencies in seconds: 0.5 ms .. 10 s.
const std::vector<double>& LatencyBoundsSeconds();

}  // namespace sv::metrics

#endif  // SV_METRICS_METRICS_H_
