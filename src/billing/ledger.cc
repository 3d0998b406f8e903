// Trial grants, prices, top-ups, billing modes and the credit gate.
#include <algorithm>
#include <cassert>

#include "absl/strings/str_cat.h"
#include "billing/billing.h"
#include "billing/internal/ledger_sql.h"
#include "common/money.h"
#include "common/status.h"
#include "spdlog/spdlog.h"

namespace sv::billing {

using store::SqlTime;

int64_t RoundToFen(int64_t micros) {
  constexpr int64_t kMicrosPerFen = 10'000;
  const int64_t half = kMicrosPerFen / 2;
  return micros >= 0 ? (micros + half) / kMicrosPerFen : -((-micros + half) / kMicrosPerFen);
}

int64_t MinuteOf(absl::Time t) {
  return absl::ToUnixSeconds(absl::Floor(t - absl::UnixEpoch(), absl::Minutes(1)) +
                             absl::UnixEpoch()) / 60;
}

absl::Time MinuteStart(int64_t minute) { return absl::FromUnixSeconds(minute * 60); }

namespace {

// Moves all of a tenant's `from_kind` account, if positive, to its
// `to_kind` account (a billing mode switch).
absl::Status MoveBalance(pqxx::work& txn, const std::string& tenant_id,
                         const std::string& from_kind, const std::string& to_kind,
                         absl::Time now) {
  const int64_t from = internal::TenantAccount(txn, tenant_id, from_kind);
  const int64_t amount =
      txn.exec_params("SELECT balance_micros FROM ledger_accounts WHERE id = $1 FOR UPDATE",
                      from)[0][0]
          .as<int64_t>();
  if (amount <= 0) return absl::OkStatus();
  // The tenant row is locked, so the count (and the key) is stable.
  const int64_t moves =
      txn.exec_params("SELECT count(*) FROM ledger_transfers WHERE tenant_id = $1 "
                      "AND kind = 'balance_move'",
                      tenant_id)[0][0]
          .as<int64_t>();
  return internal::PostSingle(
      txn, {absl::StrCat("balance_move:", tenant_id, ":", moves + 1), "balance_move", tenant_id,
            from, internal::TenantAccount(txn, tenant_id, to_kind), amount, now});
}

}  // namespace

Billing::Billing(store::Database& db, store::Store& store, const Clock& clock,
                 BillingOptions options)
    : db_(db), store_(store), clock_(clock), options_(options) {}

absl::Status Billing::EnsureTrialGrant(const std::string& user_id, absl::Time now) {
  // sv_grant_trial (migration 0065) is the one definition of the grant; the
  // create gate calls it too. The primary key of trial_grants makes racing
  // first requests grant once.
  return db_.Transact([&](pqxx::work& txn) -> absl::Status {
    txn.exec_params("SELECT sv_grant_trial($1, $2, $3::timestamptz, $4::timestamptz)", user_id,
                    options_.trial_amount_micros, SqlTime(now),
                    SqlTime(now + options_.trial_validity));
    return absl::OkStatus();
  });
}

absl::StatusOr<int> Billing::GrantMissingTrials(absl::Time now) {
  auto users = std::make_shared<std::vector<std::string>>();
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) {
    users->clear();
    auto rows = txn.exec(
        "SELECT u.id FROM users u WHERE u.role = 'member' AND NOT EXISTS "
        "(SELECT 1 FROM trial_grants g WHERE g.user_id = u.id) ORDER BY u.id LIMIT 1000");
    for (const auto& row : rows) users->push_back(row[0].as<std::string>());
    return absl::OkStatus();
  }));
  for (const auto& user : *users) SV_RETURN_IF_ERROR(EnsureTrialGrant(user, now));
  return static_cast<int>(users->size());
}

absl::StatusOr<int> Billing::ExpireTrials(absl::Time until, absl::Time now) {
  int expired = 0;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) -> absl::Status {
    expired = 0;
    auto due = txn.exec_params(
        "SELECT user_id, tenant_id FROM trial_grants WHERE NOT expired "
        "AND expires_at <= $1::timestamptz ORDER BY expires_at, user_id LIMIT 1000 FOR UPDATE",
        SqlTime(until));
    for (const auto& row : due) {
      const std::string user = row[0].as<std::string>();
      const std::string tenant = row[1].as<std::string>();
      // Trial credit is spent oldest grant first, so what is left of this
      // grant is the wallet less the grants that are still valid after it.
      // Not capped at the grant: trial credit given back (SLA refunds of
      // trial-paid rent, adjustments) expires with it, and a refund on top
      // of an adjusted minute can leave more than was granted.
      auto left = txn.exec_params(
          "SELECT greatest(0, a.balance_micros - coalesce(("
          "  SELECT sum(o.amount_micros) FROM trial_grants o WHERE o.tenant_id = g.tenant_id "
          "  AND NOT o.expired AND o.user_id <> g.user_id "
          "  AND (o.expires_at, o.user_id) > (g.expires_at, g.user_id)), 0))::bigint "
          "FROM trial_grants g JOIN ledger_accounts a ON a.tenant_id = g.tenant_id "
          "AND a.kind = 'trial_wallet' WHERE g.user_id = $1 FOR UPDATE OF a",
          user);
      const int64_t amount = left[0][0].as<int64_t>();
      txn.exec_params("UPDATE trial_grants SET expired = true WHERE user_id = $1", user);
      ++expired;
      if (amount == 0) continue;
      SV_RETURN_IF_ERROR(internal::PostSingle(
          txn, {absl::StrCat("trial-expiry:", user), "trial_expiry", tenant,
                internal::TenantAccount(txn, tenant, "trial_wallet"),
                internal::PlatformAccount(txn, "promotion_expense"), amount, now}));
    }
    return absl::OkStatus();
  }));
  return expired;
}

namespace {

// Adds a price to the book and tells the tenants it changes for: those
// with an unfinished instance of the GPU model, or a live volume of the
// kind (`*`: of a model or kind without a price of its own), so a rise is
// never first seen on the bill. A price equal to the one it follows says
// nothing.
absl::Status AddPrice(pqxx::work& txn, const std::string& item_kind, const std::string& item,
                      int64_t unit_price_micros, absl::Time effective_from, absl::Time now) {
  const bool gpu = item_kind == "gpu_minute";
  const int64_t before =
      internal::PriceAt(txn, item_kind, item, effective_from - absl::Microseconds(1));
  auto rows = txn.exec_params(
      "INSERT INTO price_book (item_kind, item, unit_price_micros, effective_from, created_at) "
      "VALUES ($1, $2, $3, $4::timestamptz, $5::timestamptz) "
      "ON CONFLICT (item_kind, item, effective_from) DO NOTHING RETURNING id",
      item_kind, item, unit_price_micros, SqlTime(effective_from), SqlTime(now));
  if (rows.empty()) {
    return Error(absl::StatusCode::kAlreadyExists, "PRICE_EXISTS",
                 gpu ? "a price for this model already takes effect at that time"
                     : "a price for this volume kind already takes effect at that time");
  }
  if (before == unit_price_micros) return absl::OkStatus();
  std::string what, holders;
  if (gpu) {
    what = item == "*" ? "GPU models without a price of their own" : item;
    holders = "SELECT i.tenant_id, i.gpu_model AS item FROM instances i "
              "WHERE i.state NOT IN ('DELETED', 'FAILED')";
  } else {
    what = item == "*" ? "volumes of a kind without a price of its own"
                       : absl::StrCat(item, " volumes");
    holders = "SELECT v.tenant_id, v.kind AS item FROM volumes v WHERE v.deleted_at IS NULL";
  }
  // Per GPU-hour, or per GiB-month of 30 days, as svctl prices shows them.
  const int64_t scale = gpu ? 60 : 24 * 30;
  const char* unit = gpu ? " per GPU-hour at " : " per GiB-month at ";
  txn.exec_params(
      absl::StrCat("INSERT INTO billing_notices (tenant_id, kind, message, at) "
                   "SELECT DISTINCT h.tenant_id, 'price_change', $3, $4::timestamptz FROM (",
                   holders,
                   ") h WHERE h.item = $2 OR ($2 = '*' AND NOT EXISTS (SELECT 1 FROM "
                   "price_book p WHERE p.item_kind = $1 AND p.item = h.item))"),
      item_kind, item,
      absl::StrCat("the price of ", what, " changes from ", Yuan(before * scale), " to ",
                   Yuan(unit_price_micros * scale), unit,
                   absl::FormatTime("%Y-%m-%d %H:%M UTC", effective_from, absl::UTCTimeZone()),
                   " (svctl prices)"),
      SqlTime(now));
  return absl::OkStatus();
}

absl::Status CheckEffective(absl::Time effective_from, absl::Time now) {
  if (effective_from < now) {
    // Minutes already billed must keep the price they were billed at.
    return Error(absl::StatusCode::kInvalidArgument, "PRICE_IN_PAST",
                 "a price takes effect now or later, never in the past");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Billing::SetGpuPrice(const std::string& gpu_model, int64_t unit_price_micros,
                                  absl::Time effective_from, absl::Time now) {
  if (gpu_model.empty() || gpu_model.size() > 64) {
    return Error(absl::StatusCode::kInvalidArgument, "INVALID_GPU_MODEL",
                 "gpu_model must be 1 to 64 characters");
  }
  if (unit_price_micros < 0 || unit_price_micros > 100 * kMicrosPerYuan) {
    return Error(absl::StatusCode::kInvalidArgument, "INVALID_PRICE",
                 "unit_price_micros must be between 0 and 100,000,000 per GPU-minute");
  }
  SV_RETURN_IF_ERROR(CheckEffective(effective_from, now));
  return db_.Transact([&](pqxx::work& txn) {
    return AddPrice(txn, "gpu_minute", gpu_model, unit_price_micros, effective_from, now);
  });
}

absl::Status Billing::SetStoragePrice(const std::string& volume_kind, int64_t unit_price_micros,
                                      absl::Time effective_from, absl::Time now) {
  if (volume_kind != "network" && volume_kind != "node_local" && volume_kind != "*") {
    return Error(absl::StatusCode::kInvalidArgument, "INVALID_VOLUME_KIND",
                 "volume_kind must be network, node_local or * (any other)");
  }
  if (unit_price_micros < 0 || unit_price_micros > kMicrosPerYuan) {
    return Error(absl::StatusCode::kInvalidArgument, "INVALID_PRICE",
                 "unit_price_micros must be between 0 and 1,000,000 per GiB-hour");
  }
  SV_RETURN_IF_ERROR(CheckEffective(effective_from, now));
  return db_.Transact([&](pqxx::work& txn) {
    return AddPrice(txn, "storage_gib_hour", volume_kind, unit_price_micros, effective_from,
                    now);
  });
}

absl::StatusOr<int64_t> Billing::GpuPrice(const std::string& gpu_model, absl::Time at) {
  int64_t price = 0;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) {
    price = internal::GpuPriceAt(txn, gpu_model, at);
    return absl::OkStatus();
  }));
  return price;
}

absl::StatusOr<TransferRecord> Billing::TopUp(const std::string& tenant_id,
                                              const std::string& payment_id,
                                              int64_t amount_micros, absl::Time now) {
  if (payment_id.empty() || payment_id.size() > 128) {
    return Error(absl::StatusCode::kInvalidArgument, "INVALID_PAYMENT_ID",
                 "payment_id must be 1 to 128 characters");
  }
  if (amount_micros <= 0 || amount_micros > 10'000'000 * kMicrosPerYuan) {
    return Error(absl::StatusCode::kInvalidArgument, "INVALID_AMOUNT",
                 "amount_micros must be positive and at most 10,000,000 CNY");
  }
  const std::string key = absl::StrCat("topup:", payment_id);
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) -> absl::Status {
    // The key-share lock waits for a mode switch in progress (it holds the
    // row FOR UPDATE) and then reads the new mode; without it a payment that
    // read the old mode could land in the wallet the switch just emptied,
    // which the new mode never spends.
    auto tenant = txn.exec_params(
        "SELECT billing_mode FROM tenants WHERE id = $1 FOR KEY SHARE", tenant_id);
    if (tenant.empty()) {
      return Error(absl::StatusCode::kNotFound, "TENANT_NOT_FOUND", "no such tenant");
    }
    // A replay is the same payment: same tenant and amount. Told apart
    // before the destination is chosen, which depends on the mode: the
    // posting's hash names the account, so a retry after a switch between
    // prepaid and postpaid clashed with its own first try
    // (IDEMPOTENCY_KEY_REUSED), and a payment re-entered under a new id
    // was then credited twice.
    auto posted = txn.exec_params(
        "SELECT tenant_id = $2 AND amount_micros = $3 AND kind = 'topup' "
        "FROM ledger_transfers WHERE idempotency_key = $1 AND leg = 0",
        key, tenant_id, amount_micros);
    if (!posted.empty()) {
      if (posted[0][0].as<bool>()) return absl::OkStatus();
      return Error(absl::StatusCode::kAlreadyExists, "IDEMPOTENCY_KEY_REUSED",
                   absl::StrCat("payment ", payment_id,
                                " was already posted with another tenant or amount"));
    }
    // A postpaid tenant's payment settles its receivable.
    const char* kind = tenant[0][0].as<std::string>() == "postpaid" ? "receivable"
                                                                     : "paid_wallet";
    return internal::PostSingle(txn, {key, "topup", tenant_id,
                                      internal::PlatformAccount(txn, "payment_clearing"),
                                      internal::TenantAccount(txn, tenant_id, kind),
                                      amount_micros, now});
  }));
  return internal::FindTransfer(db_, tenant_id, key);
}

absl::Status Billing::SetBillingMode(const std::string& tenant_id, BillingMode mode,
                                     int64_t credit_limit_micros) {
  // Bounded so that what a tenant may spend (its receivable plus the
  // limit) stays far inside int64 in every statement that adds them: a
  // limit of INT64_MAX, the usual "no limit", overflowed the metering
  // statement, which covers every tenant, and stopped billing for all.
  constexpr int64_t kCreditLimitMax = 1'000'000'000 * kMicrosPerYuan;
  if (credit_limit_micros < 0 || credit_limit_micros > kCreditLimitMax ||
      (mode == BillingMode::kPrepaid && credit_limit_micros != 0)) {
    return Error(absl::StatusCode::kInvalidArgument, "INVALID_CREDIT_LIMIT",
                 "credit_limit_micros must be 0 to 1,000,000,000 CNY, and 0 for prepaid "
                 "tenants");
  }
  const bool postpaid = mode == BillingMode::kPostpaid;
  const absl::Time now = clock_.Now();
  return db_.Transact([&](pqxx::work& txn) -> absl::Status {
    // Metering charges the account of the mode it reads; holding its lock,
    // no run charges the account whose balance moves away below.
    txn.exec_params("SELECT pg_advisory_xact_lock($1)", internal::kMeteringLockKey);
    auto before = txn.exec_params("SELECT billing_mode FROM tenants WHERE id = $1 FOR UPDATE",
                                  tenant_id);
    if (before.empty()) {
      return Error(absl::StatusCode::kNotFound, "TENANT_NOT_FOUND", "no such tenant");
    }
    const bool switching = (before[0][0].as<std::string>() == "postpaid") != postpaid;
    // A switch records when postpaid began or ended (for the invoicer);
    // setting the mode a tenant already has keeps the times.
    txn.exec_params(
        "UPDATE tenants SET billing_mode = $2, "
        "postpaid_since = CASE WHEN $2 = 'postpaid' AND billing_mode <> 'postpaid' "
        "  THEN $3::timestamptz ELSE postpaid_since END, "
        "postpaid_until = CASE WHEN $2 = 'prepaid' AND billing_mode = 'postpaid' "
        "  THEN $3::timestamptz ELSE postpaid_until END "
        "WHERE id = $1",
        tenant_id, postpaid ? "postpaid" : "prepaid", store::SqlTime(now));
    if (switching) {
      // The money goes with the mode: a paid wallet into the receivable
      // (spent before any debt), a receivable's credit into the wallet.
      // A debt stays where it is, and is refused below.
      SV_RETURN_IF_ERROR(MoveBalance(txn, tenant_id, postpaid ? "paid_wallet" : "receivable",
                                     postpaid ? "receivable" : "paid_wallet", now));
    }
    auto limited = txn.exec_params(
        "UPDATE ledger_accounts SET credit_limit_micros = $2 WHERE tenant_id = $1 "
        "AND kind = 'receivable' AND balance_micros >= -$2::bigint RETURNING id",
        tenant_id, credit_limit_micros);
    if (limited.empty()) {
      return Error(absl::StatusCode::kFailedPrecondition, "CREDIT_LIMIT_BELOW_DEBT",
                   postpaid ? "the tenant already owes more than that credit limit"
                            : "the tenant owes money on its receivable; it goes back to "
                              "prepaid once that is paid (top up)");
    }
    return absl::OkStatus();
  });
}

absl::Status Billing::CheckCreditForCreate(const std::string& tenant_id, int gpu_count,
                                           const std::string& gpu_model, absl::Time now,
                                           int64_t app_price_per_hour_micros,
                                           const std::string& resized_instance_id) {
  const int minutes = options_.create_credit_minutes;
  if (minutes <= 0) return absl::OkStatus();
  SV_ASSIGN_OR_RETURN(Balance balance, GetBalance(tenant_id, now));
  int64_t price = 0;
  int64_t committed = 0;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) {
    price = internal::GpuPriceAt(txn, gpu_model, now);
    // The instances the tenant already has (not ended) will be charged as
    // well; a resized one counts at its new size only.
    committed = txn.exec_params1("SELECT sv_committed_rent($1, $2::timestamptz, $3)",
                                 tenant_id, SqlTime(now), resized_instance_id)[0]
                    .as<int64_t>();
    return absl::OkStatus();
  }));
  const int64_t needed = (price * gpu_count + committed) * minutes;
  if (balance.available_micros < needed) {
    return CreditRefusal(gpu_count, gpu_model, needed, balance.available_micros);
  }
  if (app_price_per_hour_micros <= 0) return absl::OkStatus();
  // Minute fees floor a share of the hourly price (docs/marketplace.md);
  // any `minutes` of them add up to at most this.
  const int64_t fee = (app_price_per_hour_micros * minutes + 59) / 60;
  const int64_t trial = std::max<int64_t>(balance.trial_micros, 0);
  const int64_t paid = balance.available_micros - trial;
  const int64_t paid_needed = fee + std::max<int64_t>(needed - trial, 0);
  if (paid >= paid_needed) return absl::OkStatus();
  return Error(absl::StatusCode::kFailedPrecondition, "INSUFFICIENT_CREDIT",
               absl::StrCat("the first ", minutes, " minutes of the app cost ", Yuan(fee),
                            " in app fees on top of ", Yuan(needed),
                            " of rent; trial credit pays rent only, never app fees, so ",
                            Yuan(paid_needed), " must come from paid credit, which holds ",
                            Yuan(paid), "; top up first"));
}

absl::StatusOr<int64_t> Billing::AppPriceOf(const std::string& instance_id) {
  int64_t price = 0;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) {
    auto rows = txn.exec_params(
        "SELECT price_per_hour_micros FROM instance_apps WHERE instance_id = $1", instance_id);
    price = rows.empty() ? 0 : rows[0][0].as<int64_t>();
    return absl::OkStatus();
  }));
  return price;
}

void Billing::FillCreateGate(const std::string& user_id, absl::Time now,
                             store::CreateGate* gate) const {
  gate->trial_user_id = user_id;
  gate->trial_amount_micros = options_.trial_amount_micros;
  gate->trial_expires_at = now + options_.trial_validity;
  gate->credit_minutes = options_.create_credit_minutes;
}

absl::Status Billing::CreditRefusal(int gpu_count, const std::string& gpu_model,
                                    int64_t needed, int64_t available) const {
  return Error(absl::StatusCode::kFailedPrecondition, "INSUFFICIENT_CREDIT",
               absl::StrCat("the first ", options_.create_credit_minutes, " minutes of ",
                            gpu_count, " x ", gpu_model,
                            ", with those of the instances the tenant already has running "
                            "or queued, cost ",
                            Yuan(needed), " but only ", Yuan(available),
                            " is available; top up first"));
}

}  // namespace sv::billing
