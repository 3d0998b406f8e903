#include "sla/latency_histogram.h"

#include <cassert>
#include <cmath>

namespace sv::sla {
namespace {

// gamma = (1 + a) / (1 - a); bucket i holds (gamma^(i-1), gamma^i].
const double kGamma = (1 + LatencyHistogram::kRelativeError) /
                      (1 - LatencyHistogram::kRelativeError);
const double kLogGamma = std::log(kGamma);

}  // namespace

int LatencyHistogram::BucketOf(int64_t value_ns) {
  assert(value_ns > 0);
  return static_cast<int>(std::ceil(std::log(static_cast<double>(value_ns)) / kLogGamma));
}

bool LatencyHistogram::ValidBucket(int bucket) {
  static const int kMax = BucketOf(int64_t{3'600'000'000'000});
  return bucket >= 0 && bucket <= kMax;
}

int64_t LatencyHistogram::ValueOf(int bucket) {
  // The midpoint 2 * gamma^i / (gamma + 1) is within the relative error of
  // every value in (gamma^(i-1), gamma^i].
  return static_cast<int64_t>(std::llround(2.0 * std::pow(kGamma, bucket) / (kGamma + 1)));
}

void LatencyHistogram::Record(int64_t value_ns, int64_t count) {
  if (count <= 0) return;
  count_ += count;
  if (value_ns <= 0) {
    zero_count_ += count;
    return;
  }
  buckets_[BucketOf(value_ns)] += count;
  FoldToCap();
}

void LatencyHistogram::FoldToCap() {
  // Beyond the cap, fold the lowest buckets together: the high quantiles
  // that the SLA reads stay within 1%.
  while (static_cast<int>(buckets_.size()) > kBucketsMax) {
    auto lowest = buckets_.begin();
    std::next(lowest)->second += lowest->second;
    buckets_.erase(lowest);
  }
}

void LatencyHistogram::Merge(const LatencyHistogram& other) {
  zero_count_ += other.zero_count_;
  count_ += other.count_;
  for (const auto& [bucket, n] : other.buckets_) buckets_[bucket] += n;
  FoldToCap();
}

void LatencyHistogram::MergeBuckets(const int32_t* indices, const int64_t* counts, size_t size,
                                    int64_t zero_count) {
  if (zero_count > 0) {
    zero_count_ += zero_count;
    count_ += zero_count;
  }
  for (size_t i = 0; i < size; ++i) {
    if (counts[i] <= 0) continue;
    buckets_[indices[i]] += counts[i];
    count_ += counts[i];
  }
  FoldToCap();
}

int64_t LatencyHistogram::Quantile(double q) const {
  if (count_ == 0) return 0;
  q = std::min(1.0, std::max(0.0, q));
  // The rank of the q-quantile among count_ sorted samples (0-based).
  const int64_t rank = static_cast<int64_t>(std::floor(q * static_cast<double>(count_ - 1)));
  if (rank < zero_count_) return 0;
  int64_t seen = zero_count_;
  for (const auto& [bucket, n] : buckets_) {
    seen += n;
    if (seen > rank) return ValueOf(bucket);
  }
  return ValueOf(buckets_.rbegin()->first);
}

LatencyHistogram LatencyHistogram::FromBuckets(const std::map<int, int64_t>& buckets,
                                               int64_t zero_count) {
  LatencyHistogram h;
  h.zero_count_ = std::max<int64_t>(0, zero_count);
  h.count_ = h.zero_count_;
  for (const auto& [bucket, n] : buckets) {
    if (n <= 0) continue;
    h.buckets_[bucket] += n;
    h.count_ += n;
  }
  return h;
}

}  // namespace sv::sla
