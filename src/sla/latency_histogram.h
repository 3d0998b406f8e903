#ifndef SV_SLA_LATENCY_HISTOGRAM_H_
#define SV_SLA_LATENCY_HISTOGRAM_H_

#include <cstddef>
#include <cstdint>
#include <map>

namespace sv::sla {

// A mergeable latency histogram with logarithmic buckets (the DDSketch
// layout): any quantile it reports is within 1% of the true sample value.
// Agents build one per probe batch, svd merges them per instance-hour, and
// only the buckets are stored. Values are nanoseconds; zero and negative
// values count in a bucket of their own.
class LatencyHistogram {
 public:
  static constexpr double kRelativeError = 0.01;
  // Caps memory: 1 ns .. ~10 s spans about 1,150 buckets at 1%.
  static constexpr int kBucketsMax = 4096;

  void Record(int64_t value_ns, int64_t count = 1);
  void Merge(const LatencyHistogram& other);
  // Merge(FromBuckets(...)) without building the histogram: `size` pairs
  // (a bucket may repeat; counts <= 0 are skipped) and the zero bucket.
  void MergeBuckets(const int32_t* indices, const int64_t* counts, size_t size,
                    int64_t zero_count);

  // The value at quantile q in [0, 1]; 0 for an empty histogram.
  int64_t Quantile(double q) const;
  int64_t count() const { return count_; }
  bool empty() const { return count_ == 0; }

  // Bucket index -> count, for storage and the wire.
  const std::map<int, int64_t>& buckets() const { return buckets_; }
  int64_t zero_count() const { return zero_count_; }
  static LatencyHistogram FromBuckets(const std::map<int, int64_t>& buckets,
                                      int64_t zero_count);

  static int BucketOf(int64_t value_ns);
  // Whether a bucket index can come from a real latency: 1 ns up to an
  // hour. Others (from a node's telemetry) would overflow ValueOf.
  static bool ValidBucket(int bucket);
  // The representative value of a bucket: within 1% of all it holds.
  static int64_t ValueOf(int bucket);

 private:
  void FoldToCap();

  std::map<int, int64_t> buckets_;
  int64_t zero_count_ = 0;
  int64_t count_ = 0;
};

}  // namespace sv::sla

#endif  // SV_SLA_LATENCY_HISTOGRAM_H_
