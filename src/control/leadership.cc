#include "control/leadership.h"

#include <unistd.h>

#include <pqxx/pqxx>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "metrics/metrics.h"
#include "spdlog/spdlog.h"

namespace sv::control {
namespace {

using SteadyClock = std::chrono::steady_clock;

// Free or expired, by the database's clock: the takeover bumps the epoch.
constexpr char kCampaignSql[] = R"sql(
UPDATE leader_lease
SET holder = $1, epoch = epoch + 1,
    expires_at = clock_timestamp() + $2 * interval '1 millisecond',
    acquired_at = clock_timestamp(), renewed_at = clock_timestamp()
WHERE name = 'control' AND (holder = '' OR expires_at < clock_timestamp())
RETURNING epoch
)sql";

constexpr char kRenewSql[] = R"sql(
UPDATE leader_lease
SET expires_at = clock_timestamp() + $3 * interval '1 millisecond',
    renewed_at = clock_timestamp()
WHERE name = 'control' AND holder = $1 AND epoch = $2
RETURNING epoch
)sql";

constexpr char kReleaseSql[] = R"sql(
UPDATE leader_lease SET holder = '', expires_at = '-infinity'
WHERE name = 'control' AND holder = $1 AND epoch = $2
)sql";

}  // namespace

Leadership::Leadership(store::Database& db, LeadershipOptions options)
    : db_(db), options_(std::move(options)) {
  if (options_.replica_id.empty()) options_.replica_id = DefaultReplicaId();
}

Leadership::~Leadership() { Stop(); }

std::string Leadership::DefaultReplicaId() {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  std::random_device random;
  return absl::StrCat(host, "-", getpid(), "-", random() % 100000);
}

std::optional<int64_t> Leadership::LeaderEpoch() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!epoch_.has_value() || SteadyClock::now() >= valid_until_) return std::nullopt;
  return epoch_;
}

Leadership::View Leadership::view() const {
  const bool leading = LeaderEpoch().has_value();
  std::lock_guard<std::mutex> lock(mutex_);
  return {leading, leading ? *epoch_ : seen_epoch_, seen_holder_, elections_won_,
          terms_lost_};
}

void Leadership::Lose(const std::string& why) {
  if (!epoch_.has_value()) return;
  spdlog::warn("leadership: {} lost leadership (epoch {}): {}", options_.replica_id, *epoch_,
               why);
  epoch_.reset();
  ++terms_lost_;
  metrics::Registry::Default().IncrementCounter(
      "sv_leader_terms_lost_total", "Terms this replica lost without handing over.", {});
}

absl::Status Leadership::Campaign() {
  const auto started = SteadyClock::now();
  std::optional<int64_t> won;
  std::string holder;
  int64_t epoch = 0;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) -> absl::Status {
    won.reset();
    auto rows = txn.exec_params(kCampaignSql, options_.replica_id,
                                absl::ToInt64Milliseconds(options_.lease));
    if (!rows.empty()) {
      won = rows[0][0].as<int64_t>();
      // Waits for the old leader's fenced transactions still in flight.
      txn.exec_params("UPDATE leader_fence SET epoch = $1 WHERE name = 'control'", *won);
      return absl::OkStatus();
    }
    auto seen = txn.exec("SELECT holder, epoch FROM leader_lease WHERE name = 'control'");
    if (!seen.empty()) {
      holder = seen[0][0].as<std::string>();
      epoch = seen[0][1].as<int64_t>();
    }
    return absl::OkStatus();
  }));
  std::lock_guard<std::mutex> lock(mutex_);
  if (!won.has_value()) {
    seen_holder_ = holder;
    seen_epoch_ = epoch;
    return absl::OkStatus();
  }
  epoch_ = *won;
  seen_epoch_ = *won;
  seen_holder_ = options_.replica_id;
  valid_until_ = started + absl::ToChronoNanoseconds(options_.lease - options_.renew_interval / 2);
  ++elections_won_;
  metrics::Registry::Default().IncrementCounter(
      "sv_leader_elections_won_total", "Times this replica became the leader.", {});
  spdlog::info("leadership: {} leads with epoch {}", options_.replica_id, *won);
  return absl::OkStatus();
}

absl::Status Leadership::Renew() {
  int64_t epoch = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    epoch = *epoch_;
  }
  const auto started = SteadyClock::now();
  bool renewed = false;
  absl::Status status = db_.Transact([&](pqxx::work& txn) {
    auto rows = txn.exec_params(kRenewSql, options_.replica_id, epoch,
                                absl::ToInt64Milliseconds(options_.lease));
    renewed = !rows.empty();
    return absl::OkStatus();
  });
  std::lock_guard<std::mutex> lock(mutex_);
  if (!epoch_.has_value() || *epoch_ != epoch) return status;
  if (!status.ok()) {
    // Cannot reach the database: keep the term while the lease may still be
    // ours; LeaderEpoch() turns off by itself when valid_until_ passes.
    if (started >= valid_until_) Lose("the lease lapsed while the database was unreachable");
    return status;
  }
  if (!renewed) {
    Lose("another replica took the lease over");
    return absl::OkStatus();
  }
  valid_until_ = started + absl::ToChronoNanoseconds(options_.lease - options_.renew_interval / 2);
  return absl::OkStatus();
}

absl::Status Leadership::Step() {
  bool leading = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (epoch_.has_value() && SteadyClock::now() >= valid_until_) {
      Lose("the lease lapsed before it was renewed");
    }
    leading = epoch_.has_value();
  }
  return leading ? Renew() : Campaign();
}

void Leadership::Start() {
  if (absl::Status s = Step(); !s.ok()) {
    spdlog::warn("leadership: first election step failed: {}", s.ToString());
  }
  thread_ = std::thread([this] { Run(); });
}

void Leadership::Run() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    wake_.wait_for(lock, absl::ToChronoNanoseconds(options_.renew_interval),
                   [this] { return stopping_; });
    if (stopping_) break;
    lock.unlock();
    absl::Status status = Step();
    if (!status.ok()) spdlog::warn("leadership: step failed: {}", status.ToString());
    lock.lock();
  }
}

void Leadership::Stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_ && !thread_.joinable() && !epoch_.has_value()) return;
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::optional<int64_t> epoch;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    epoch = epoch_;
    epoch_.reset();
  }
  if (!epoch.has_value()) return;
  absl::Status status = db_.Transact([&](pqxx::work& txn) {
    txn.exec_params(kReleaseSql, options_.replica_id, *epoch);
    return absl::OkStatus();
  });
  if (status.ok()) {
    spdlog::info("leadership: {} handed over the lease (epoch {})", options_.replica_id, *epoch);
  } else {
    spdlog::warn("leadership: releasing the lease failed ({}); it expires in {} s",
                 status.ToString(), absl::ToInt64Seconds(options_.lease));
  }
}

}  // namespace sv::control
