#ifndef SV_API_RATE_LIMITER_H_
#define SV_API_RATE_LIMITER_H_

#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>

#include "absl/time/time.h"
#include "common/clock.h"

namespace sv::api {

struct RateLimit {
  double per_second = 0;  // Refill rate; 0 disables the limit.
  double burst = 0;       // Bucket size.
};

// Token buckets keyed by a string (an API key id, a tenant id). Buckets of
// keys not seen for a while are dropped so memory stays bounded by
// `keys_max`; a dropped bucket comes back full, which only ever favours
// the caller.
class RateLimiter {
 public:
  RateLimiter(const Clock& clock, RateLimit limit, int keys_max = 100000);

  // Takes one token. Returns zero when allowed, or how long to wait until a
  // token is available.
  absl::Duration Take(const std::string& key);
  // How long until Take(key) would be allowed, taking nothing (zero: now).
  absl::Duration Peek(const std::string& key);

 private:
  struct Bucket {
    double tokens;
    absl::Time updated;
  };
  void EvictIdle(absl::Time now);

  const Clock& clock_;
  RateLimit limit_;
  int keys_max_;
  std::mutex mutex_;
  std::unordered_map<std::string, Bucket> buckets_;
};

}  // namespace sv::api

#endif  // SV_API_RATE_LIMITER_H_
