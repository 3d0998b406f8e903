#ifndef SV_API_CREDENTIAL_CACHE_H_
#define SV_API_CREDENTIAL_CACHE_H_

// svd's cache of successful API key lookups (docs/security.md, "Cached
// authentication"). An entry is found by key id and holds the key's salt
// and salted hash, so the presented secret is checked against it on every
// hit: a wrong secret never reaches a cached success. Expiry is checked by
// the caller on every hit.
//
// It is trusted only while a LISTEN connection (store/notification_listener.h)
// proves fresh: an entry is served only if a round trip on that connection
// which started less than `trust_window` ago has delivered every revocation
// signal (migration 0070) committed before it. So a change committed at T
// stops being served on every replica by T + trust_window, in practice by
// T + the notification's delivery (milliseconds). While the connection is
// missing, broken or stale, every lookup goes to the database and nothing is
// stored. Entries also die after `max_age`, whatever happens.

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "absl/time/time.h"
#include "common/clock.h"
#include "store/notification_listener.h"
#include "store/store.h"

namespace sv::api {

struct CredentialCacheOptions {
  absl::Duration max_age = absl::Seconds(30);
  absl::Duration trust_window = absl::Seconds(1);
  size_t entries_max = 100000;
};

class CredentialCache final : public store::NotificationSink {
 public:
  // `clock` is a real clock (trust and age), not svd's possibly fake one.
  CredentialCache(const Clock& clock, CredentialCacheOptions options = {});

  // Take before reading the database; pass to Insert.
  uint64_t Generation() const;
  // The cached record of `key_id`, or nothing when it is not cached, too
  // old, or the cache is not trusted now.
  std::optional<store::ApiKeyRecord> Find(const std::string& key_id);
  // Stores a record read from the database after `generation` was taken;
  // ignored if any invalidation happened since (the read may predate it) or
  // the cache is not trusted.
  void Insert(const std::string& key_id, const store::ApiKeyRecord& record,
              uint64_t generation);
  // Drops everything (this replica changed a credential itself).
  void Flush();

  // store::NotificationSink: the revocation signal.
  void OnListening() override;
  void OnLost() override;
  void OnNotification(const std::string& payload) override;
  void OnConfirmed(absl::Time round_trip_started) override;

  struct Stats {
    int64_t hits = 0;
    int64_t misses = 0;
    int64_t bypasses = 0;  // Lookups while the cache was not trusted.
    int64_t invalidations = 0;
    int64_t entries = 0;
    bool trusted = false;
  };
  Stats stats() const;

 private:
  struct Entry {
    store::ApiKeyRecord record;
    absl::Time stored_at;
  };
  bool TrustedLocked(absl::Time now) const;
  void FlushLocked();

  const Clock& clock_;
  const CredentialCacheOptions options_;
  mutable std::mutex mutex_;
  std::unordered_map<std::string, Entry> entries_;
  uint64_t generation_ = 0;
  bool listening_ = false;
  absl::Time fresh_as_of_ = absl::InfinitePast();
  Stats stats_;
};

// svd's revocation signal: one LISTEN connection (channel sv_credentials)
// feeding the credential cache and any other sink (e.g. the agent streams,
// which end when their node credential is revoked), plus the cache's
// metrics. With `max_age` zero there is no cache, but the other sinks
// still get the signal.
class CredentialRevocation {
 public:
  CredentialRevocation(const std::string& database_url, const Clock& real_clock,
                       absl::Duration max_age);
  ~CredentialRevocation();  // Stops.

  CredentialCache* cache() { return cache_.get(); }
  // Before Start; `sink` must outlive this object's Stop.
  void AddSink(store::NotificationSink* sink);
  void Start();
  void RequestStop();  // As NotificationListener's: Stop waits.
  void Stop();
  const store::NotificationListener& listener() const { return *listener_; }

 private:
  std::unique_ptr<CredentialCache> cache_;
  std::unique_ptr<store::NotificationListener> listener_;
};

}  // namespace sv::api

#endif  // SV_API_CREDENTIAL_CACHE_H_
