#ifndef SV_TESTS_CHAOS_CHAOS_UTIL_H_
#define SV_TESTS_CHAOS_CHAOS_UTIL_H_

// Shared parts of the chaos tests (docs/reliability.md, docs/testing.md):
// billing history seeded through the real library, a load of creates and
// deletes from many clients that retry with the same request_id, and the
// invariant checks every chaos test ends with.

#include <atomic>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/time.h"

namespace sv::chaos {

// An integer knob from the environment (long forms), or `fallback`.
int EnvInt(const char* name, int fallback);

int64_t QueryInt(const std::string& url, const std::string& sql);

// Seeds `instances` 1-GPU instances of one tenant that ran for most of the
// last `hours` on nodes of their own (left down, so nothing live lands
// there), with the billing cursor at the start: svd then has that many
// minutes to bill. Returns false on a setup failure.
bool SeedBillingHistory(const std::string& url, int instances, int hours);

// One client's view of what svd acknowledged.
struct Acknowledged {
  std::string id;
  std::string tenant_token;
  std::string request_id;
  bool deleted = false;  // The delete was acknowledged too.
};

struct LoadOptions {
  std::vector<std::string> tenant_tokens;  // Round-robin over clients.
  int clients = 8;
  int creates_per_client = 50;             // 0: until Stop().
  double delete_share = 0.3;               // Of acknowledged creates.
  int gpu_count_max = 8;                   // 1..8, or gangs of 8/16 sometimes.
  // Each call is retried with the same request_id on UNAVAILABLE,
  // DEADLINE_EXCEEDED, ABORTED and INTERNAL for this long.
  absl::Duration retry_for = absl::Seconds(60);
  uint32_t seed = 1;
};

// Runs clients against endpoints (each client picks endpoint i % size; an
// endpoint function is re-read at each retry, so a test can move replicas).
class Load {
 public:
  Load(LoadOptions options, std::function<std::string(int client)> endpoint);
  ~Load();
  void Start();
  void Stop();   // Asks clients to finish their current call, then joins.
  void Wait();   // Joins (with creates_per_client > 0).

  std::vector<Acknowledged> acknowledged() const;
  // Final status codes by name, e.g. {"OK": 990, "RESOURCE_EXHAUSTED": 10}.
  std::map<std::string, int> final_codes() const;
  int unanswered() const { return unanswered_.load(); }  // Gave up retrying.
  int attempts() const { return attempts_.load(); }
  // Wall time of each create from its first attempt to its final answer.
  std::vector<double> create_latencies_ms() const;

 private:
  void Client(int index);

  LoadOptions options_;
  std::function<std::string(int)> endpoint_;
  std::vector<std::thread> threads_;
  std::atomic<bool> stopping_{false};
  std::atomic<int> unanswered_{0};
  std::atomic<int> attempts_{0};
  mutable std::mutex mutex_;
  std::vector<Acknowledged> acknowledged_;
  std::map<std::string, int> codes_;
  std::vector<double> create_latencies_ms_;
};

// Every invariant the chaos tests share; each failure is one line.
//  - every acknowledged create exists, and every acknowledged delete is DELETED;
//  - no GPU is reserved twice, no finished instance holds a GPU, and every
//    placed instance holds exactly gpu_count GPUs;
//  - every PENDING instance has a reason;
//  - every instance-minute RUNNING before the billing cursor is charged,
//    once, in full, and no minute outside RUNNING is charged;
//  - `svd audit` passes.
std::vector<std::string> CheckInvariants(const std::string& url,
                                         const std::vector<Acknowledged>& acknowledged);

}  // namespace sv::chaos

#endif  // SV_TESTS_CHAOS_CHAOS_UTIL_H_
