#include "api/rate_limiter.h"

#include <algorithm>
#include <cmath>

namespace sv::api {

RateLimiter::RateLimiter(const Clock& clock, RateLimit limit, int keys_max)
    : clock_(clock), limit_(limit), keys_max_(keys_max) {}

void RateLimiter::EvictIdle(absl::Time now) {
  // A bucket idle long enough to have refilled is the same as no bucket.
  const absl::Duration full_after = absl::Seconds(limit_.burst / limit_.per_second);
  for (auto it = buckets_.begin(); it != buckets_.end();) {
    it = (now - it->second.updated >= full_after) ? buckets_.erase(it) : std::next(it);
  }
  // Still too many: every caller is busy. Start afresh rather than grow.
  if (static_cast<int>(buckets_.size()) >= keys_max_) buckets_.clear();
}

absl::Duration RateLimiter::Take(const std::string& key) {
  if (limit_.per_second <= 0) return absl::ZeroDuration();
  const absl::Time now = clock_.Now();
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = buckets_.find(key);
  if (it == buckets_.end()) {
    if (static_cast<int>(buckets_.size()) >= keys_max_) EvictIdle(now);
    it = buckets_.emplace(key, Bucket{limit_.burst, now}).first;
  }
  Bucket& b = it->second;
  const double elapsed = absl::ToDoubleSeconds(std::max(absl::ZeroDuration(), now - b.updated));
  b.tokens = std::min(limit_.burst, b.tokens + elapsed * limit_.per_second);
  b.updated = now;
  if (b.tokens >= 1.0) {
    b.tokens -= 1.0;
    return absl::ZeroDuration();
  }
  const double wait_s = (1.0 - b.tokens) / limit_.per_second;
  return absl::Milliseconds(std::ceil(wait_s * 1000.0));
}

absl::Duration RateLimiter::Peek(const std::string& key) {
  if (limit_.per_second <= 0) return absl::ZeroDuration();
  const absl::Time now = clock_.Now();
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = buckets_.find(key);
  if (it == buckets_.end()) return absl::ZeroDuration();  // A full bucket.
  const Bucket& b = it->second;
  const double elapsed = absl::ToDoubleSeconds(std::max(absl::ZeroDuration(), now - b.updated));
  const double tokens = std::min(limit_.burst, b.tokens + elapsed * limit_.per_second);
  if (tokens >= 1.0) return absl::ZeroDuration();
  return absl::Milliseconds(std::ceil((1.0 - tokens) / limit_.per_second * 1000.0));
}

}  // namespace sv::api
