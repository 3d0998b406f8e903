#include "metrics/metrics.h"

#include <cassert>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace sv::metrics {
namespace {

std::string Escape(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == '\\' || c == '"') {
      out.push_back('\\');
      out.push_back(c);
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out.push_back(c);
    }
  }
  return out;
}

std::string LabelText(const Labels& labels, const std::string& extra = "") {
  if (labels.empty() && extra.empty()) return "";
  std::string out = "{";
  for (size_t i = 0; i < labels.size(); ++i) {
    if (i > 0) out += ",";
    out += labels[i].first + "=\"" + Escape(labels[i].second) + "\"";
  }
  if (!extra.empty()) out += (labels.empty() ? "" : ",") + extra;
  return out + "}";
}

std::string Number(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%.15g", v);
  return buffer;
}

}  // namespace

Registry& Registry::Default() {
  static Registry* registry = new Registry();
  return *registry;
}

const std::vector<double>& LatencyBoundsSeconds() {
  static const std::vector<double> kBounds = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                              0.05,   0.1,   0.25,   0.5,   1,    2.5,
                                              5,      10};
  return kBounds;
}

Registry::Series* Registry::Find(const std::string& name, const std::string& help, Type type,
                                 const Labels& labels) {
  auto [it, inserted] = families_.try_emplace(name);
  Family& f = it->second;
  if (inserted) {
    f.type = type;
    f.help = help;
  }
  assert(f.type == type && "one metric name, one type");
  auto s = f.series.find(labels);
  if (s != f.series.end()) return &s->second;
  if (f.series.size() >= kSeriesPerMetricMax) {
    ++dropped_series_;
    return nullptr;
  }
  return &f.series[labels];
}

void Registry::IncrementCounter(const std::string& name, const std::string& help,
                                const Labels& labels, double by) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (Series* s = Find(name, help, Type::kCounter, labels)) s->value += by;
}

void Registry::SetGauge(const std::string& name, const std::string& help, const Labels& labels,
                        double value) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (Series* s = Find(name, help, Type::kGauge, labels)) s->value = value;
}

void Registry::ObserveHistogram(const std::string& name, const std::string& help,
                                const Labels& labels, double value,
                                const std::vector<double>& bounds) {
  std::lock_guard<std::mutex> lock(mutex_);
  Series* s = Find(name, help, Type::kHistogram, labels);
  if (s == nullptr) return;
  Family& f = families_[name];
  if (f.bounds.empty()) f.bounds = bounds;
  if (s->buckets.empty()) s->buckets.assign(f.bounds.size(), 0);
  for (size_t i = 0; i < f.bounds.size(); ++i) {
    if (value <= f.bounds[i]) {
      ++s->buckets[i];
      break;
    }
  }
  ++s->count;
  s->sum += value;
}

void Registry::AddCollector(std::function<void(Registry&)> collector) {
  std::lock_guard<std::mutex> lock(mutex_);
  collectors_.push_back(std::move(collector));
}

std::string Registry::Render() {
  std::vector<std::function<void(Registry&)>> collectors;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    collectors = collectors_;
  }
  for (auto& c : collectors) c(*this);
  std::lock_guard<std::mutex> lock(mutex_);
  std::ostringstream out;
  for (const auto& [name, f] : families_) {
    const char* type = f.type == Type::kCounter ? "counter"
                       : f.type == Type::kGauge ? "gauge"
                                                : "histogram";
    out << "# HELP " << name << " " << f.help << "\n# TYPE " << name << " " << type << "\n";
    for (const auto& [labels, s] : f.series) {
      if (f.type != Type::kHistogram) {
        out << name << LabelText(labels) << " " << Number(s.value) << "\n";
        continue;
      }
      uint64_t cumulative = 0;
      for (size_t i = 0; i < f.bounds.size(); ++i) {
        cumulative += i < s.buckets.size() ? s.buckets[i] : 0;
        out << name << "_bucket" << LabelText(labels, "le=\"" + Number(f.bounds[i]) + "\"")
            << " " << cumulative << "\n";
      }
      out << name << "_bucket" << LabelText(labels, "le=\"+Inf\"") << " " << s.count << "\n";
      out << name << "_sum" << LabelText(labels) << " " << Number(s.sum) << "\n";
      out << name << "_count" << LabelText(labels) << " " << s.count << "\n";
    }
  }
  out << "# HELP sv_metrics_dropped_series_total Series not recorded because a metric hit "
         "its series limit.\n# TYPE sv_metrics_dropped_series_total counter\n"
      << "sv_metrics_dropped_series_total " << dropped_series_ << "\n";
  return out.str();
}

}  // namespace sv::metrics
