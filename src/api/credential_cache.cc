#include "api/credential_cache.h"

#include <algorithm>
#include <memory>

#include "absl/strings/match.h"
#include "metrics/metrics.h"

namespace sv::api {

CredentialCache::CredentialCache(const Clock& clock, CredentialCacheOptions options)
    : clock_(clock), options_(options) {}

bool CredentialCache::TrustedLocked(absl::Time now) const {
  return listening_ && now < fresh_as_of_ + options_.trust_window;
}

void CredentialCache::FlushLocked() {
  entries_.clear();
  ++generation_;
  ++stats_.invalidations;
}

uint64_t CredentialCache::Generation() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return generation_;
}

std::optional<store::ApiKeyRecord> CredentialCache::Find(const std::string& key_id) {
  const absl::Time now = clock_.Now();
  std::lock_guard<std::mutex> lock(mutex_);
  if (!TrustedLocked(now)) {
    ++stats_.bypasses;
    return std::nullopt;
  }
  auto it = entries_.find(key_id);
  if (it == entries_.end()) {
    ++stats_.misses;
    return std::nullopt;
  }
  if (now >= it->second.stored_at + options_.max_age) {
    entries_.erase(it);
    ++stats_.misses;
    return std::nullopt;
  }
  ++stats_.hits;
  return it->second.record;
}

void CredentialCache::Insert(const std::string& key_id, const store::ApiKeyRecord& record,
                             uint64_t generation) {
  const absl::Time now = clock_.Now();
  std::lock_guard<std::mutex> lock(mutex_);
  // A signal that arrived after `generation` was taken may be about this
  // very row, read before the change committed: do not store it.
  if (generation != generation_ || !TrustedLocked(now)) return;
  if (entries_.size() >= options_.entries_max && entries_.count(key_id) == 0) {
    entries_.erase(entries_.begin());
  }
  entries_[key_id] = Entry{record, now};
}

void CredentialCache::Flush() {
  std::lock_guard<std::mutex> lock(mutex_);
  FlushLocked();
}

void CredentialCache::OnListening() {
  std::lock_guard<std::mutex> lock(mutex_);
  // Signals sent while nobody listened are lost: start empty, and trust
  // only after the first round trip on the new connection.
  FlushLocked();
  listening_ = true;
  fresh_as_of_ = absl::InfinitePast();
}

void CredentialCache::OnLost() {
  std::lock_guard<std::mutex> lock(mutex_);
  FlushLocked();
  listening_ = false;
  fresh_as_of_ = absl::InfinitePast();
}

void CredentialCache::OnConfirmed(absl::Time round_trip_started) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (listening_) fresh_as_of_ = std::max(fresh_as_of_, round_trip_started);
}

void CredentialCache::OnNotification(const std::string& payload) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++generation_;
  ++stats_.invalidations;
  const size_t colon = payload.find(':');
  const std::string kind = payload.substr(0, colon);
  const std::string id = colon == std::string::npos ? "" : payload.substr(colon + 1);
  if (kind == "node") return;  // Node credentials are not cached here.
  if (kind == "key") {
    entries_.erase(id);
    return;
  }
  if (kind != "user" && kind != "tenant") {  // 'all', or a signal we do not know.
    entries_.clear();
    return;
  }
  for (auto it = entries_.begin(); it != entries_.end();) {
    const store::Principal& who = it->second.record.principal;
    if ((kind == "user" && who.user_id == id) || (kind == "tenant" && who.tenant_id == id)) {
      it = entries_.erase(it);
    } else {
      ++it;
    }
  }
}

CredentialCache::Stats CredentialCache::stats() const {
  const absl::Time now = clock_.Now();
  std::lock_guard<std::mutex> lock(mutex_);
  Stats s = stats_;
  s.entries = static_cast<int64_t>(entries_.size());
  s.trusted = TrustedLocked(now);
  return s;
}

CredentialRevocation::CredentialRevocation(const std::string& database_url,
                                           const Clock& real_clock, absl::Duration max_age) {
  store::NotificationListenerOptions options;
  options.url = database_url;
  options.channel = "sv_credentials";  // Migration 0070's triggers.
  listener_ = std::make_unique<store::NotificationListener>(options, real_clock);
  if (max_age > absl::ZeroDuration()) {
    CredentialCacheOptions cache_options;
    cache_options.max_age = max_age;
    cache_ = std::make_unique<CredentialCache>(real_clock, cache_options);
    listener_->AddSink(cache_.get());
  }
}

CredentialRevocation::~CredentialRevocation() { Stop(); }

void CredentialRevocation::AddSink(store::NotificationSink* sink) { listener_->AddSink(sink); }

void CredentialRevocation::Start() {
  listener_->Start();
  // The collector keeps raw pointers: svd serves /metrics only while this
  // object lives (its HTTP server stops first).
  CredentialCache* cache = cache_.get();
  store::NotificationListener* listener = listener_.get();
  struct Reported {
    std::mutex mutex;
    CredentialCache::Stats stats;
    int64_t connections = 0;
  };
  auto reported_state = std::make_shared<Reported>();
  metrics::Registry::Default().AddCollector([cache, listener, reported_state](metrics::Registry& r) {
    r.SetGauge("sv_auth_revocation_listening",
               "1 while the LISTEN connection for credential revocations is up.", {},
               listener->listening() ? 1 : 0);
    // Which PostgreSQL backend listens (pg_stat_activity.pid), for operators
    // and for the test that terminates it.
    r.SetGauge("sv_auth_revocation_backend_pid", "PostgreSQL backend of the LISTEN connection.",
               {}, listener->backend_pid());
    std::lock_guard<std::mutex> lock(reported_state->mutex);
    r.IncrementCounter("sv_auth_revocation_connections_total",
                       "LISTEN connections opened for credential revocations.", {},
                       static_cast<double>(listener->connections_opened() -
                                           reported_state->connections));
    reported_state->connections = listener->connections_opened();
    if (cache == nullptr) return;
    CredentialCache::Stats* reported = &reported_state->stats;
    const CredentialCache::Stats s = cache->stats();
    r.SetGauge("sv_auth_cache_trusted", "1 while cached API key lookups may be served.", {},
               s.trusted ? 1 : 0);
    r.SetGauge("sv_auth_cache_entries", "Cached API key lookups.", {},
               static_cast<double>(s.entries));
    // Counters move by what happened since the last render.
    auto count = [&](const char* name, const char* help, int64_t now, int64_t& before) {
      r.IncrementCounter(name, help, {}, static_cast<double>(now - before));
      before = now;
    };
    count("sv_auth_cache_hits_total", "API key lookups answered from the cache.", s.hits,
          reported->hits);
    count("sv_auth_cache_misses_total", "API key lookups that read the database.", s.misses,
          reported->misses);
    count("sv_auth_cache_bypasses_total",
          "API key lookups that read the database because the cache was not trusted.",
          s.bypasses, reported->bypasses);
    count("sv_auth_cache_invalidations_total", "Revocation signals and flushes applied.",
          s.invalidations, reported->invalidations);
  });
}

void CredentialRevocation::RequestStop() { listener_->RequestStop(); }

void CredentialRevocation::Stop() { listener_->Stop(); }

}  // namespace sv::api
