// Operator credits and refunds of top-ups (docs/billing.md, "Credits and
// refunds of top-ups"; migration 0109).
#include "absl/strings/str_cat.h"
#include "billing/billing.h"
#include "billing/internal/ledger_sql.h"
#include "common/money.h"
#include "common/status.h"
#include "spdlog/spdlog.h"

namespace sv::billing {

using store::SqlTime;

namespace {

constexpr int64_t kAmountMax = 10'000'000 * kMicrosPerYuan;

// Locks the tenant row against a billing mode switch (as TopUp does) and
// returns the account its mode credits and charges: the paid wallet or the
// receivable.
absl::StatusOr<std::string> ModeAccountKind(pqxx::work& txn, const std::string& tenant_id) {
  auto tenant =
      txn.exec_params("SELECT billing_mode FROM tenants WHERE id = $1 FOR KEY SHARE", tenant_id);
  if (tenant.empty()) {
    return Error(absl::StatusCode::kNotFound, "TENANT_NOT_FOUND", "no such tenant");
  }
  return tenant[0][0].as<std::string>() == "postpaid" ? std::string("receivable")
                                                      : std::string("paid_wallet");
}

// A key already used: the same request again (same tenant, amount and
// reason) is a replay and returns true; anything else is ALREADY_EXISTS
// with `clash`. No row: false.
absl::StatusOr<bool> IsReplay(pqxx::work& txn, const std::string& key,
                              const std::string& tenant_id, int64_t amount_micros,
                              const std::string& reason, const std::string& clash) {
  auto existing = txn.exec_params(
      "SELECT t.tenant_id = $2 AND t.amount_micros = $3 AND r.reason = $4 "
      "FROM ledger_transfers t LEFT JOIN ledger_transfer_reasons r "
      "ON r.idempotency_key = t.idempotency_key WHERE t.idempotency_key = $1 AND t.leg = 0",
      key, tenant_id, amount_micros, reason);
  if (existing.empty()) return false;
  if (!existing[0][0].is_null() && existing[0][0].as<bool>()) return true;
  return Error(absl::StatusCode::kAlreadyExists, "IDEMPOTENCY_KEY_REUSED", clash);
}

void RecordReason(pqxx::work& txn, const std::string& key, const std::string& tenant_id,
                  const std::string& kind, const std::string& reason,
                  const std::string& issued_by, const std::string& notice, absl::Time now) {
  txn.exec_params(
      "INSERT INTO ledger_transfer_reasons (idempotency_key, tenant_id, reason, issued_by, at) "
      "VALUES ($1, $2, $3, $4, $5::timestamptz)",
      key, tenant_id, reason, issued_by, SqlTime(now));
  txn.exec_params(
      "INSERT INTO billing_notices (tenant_id, kind, message, at) "
      "VALUES ($1, $2, $3, $4::timestamptz)",
      tenant_id, kind, notice, SqlTime(now));
}

}  // namespace

absl::StatusOr<TransferRecord> Billing::IssueCredit(const std::string& tenant_id,
                                                    const std::string& credit_id,
                                                    int64_t amount_micros,
                                                    const std::string& reason,
                                                    const std::string& issued_by,
                                                    absl::Time now) {
  if (credit_id.empty() || credit_id.size() > 128) {
    return Error(absl::StatusCode::kInvalidArgument, "INVALID_CREDIT_ID",
                 "credit_id must be 1 to 128 characters");
  }
  if (amount_micros <= 0 || amount_micros > kAmountMax) {
    return Error(absl::StatusCode::kInvalidArgument, "INVALID_AMOUNT",
                 "amount_micros must be positive and at most 10,000,000 CNY");
  }
  SV_RETURN_IF_ERROR(CheckReasonText(reason));
  const std::string key = absl::StrCat("credit:", credit_id);
  bool posted = false;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) -> absl::Status {
    posted = false;
    SV_ASSIGN_OR_RETURN(const std::string kind, ModeAccountKind(txn, tenant_id));
    SV_ASSIGN_OR_RETURN(
        bool replay,
        IsReplay(txn, key, tenant_id, amount_micros, reason,
                 absl::StrCat("credit_id '", credit_id,
                              "' was already used for another credit (tenant, amount or "
                              "reason differ)")));
    if (replay) return absl::OkStatus();
    SV_RETURN_IF_ERROR(internal::PostSingle(
        txn, {key, "credit", tenant_id, internal::PlatformAccount(txn, "credit_expense"),
              internal::TenantAccount(txn, tenant_id, kind), amount_micros, now}));
    RecordReason(txn, key, tenant_id, "credit", reason, issued_by,
                 absl::StrCat("a credit of ", Yuan(amount_micros),
                              kind == "receivable" ? " was taken off what the account owes: "
                                                   : " was added to the paid wallet: ",
                              reason),
                 now);
    posted = true;
    return absl::OkStatus();
  }));
  if (posted) {
    spdlog::info("billing: credit {} of {} to tenant {} by {}: {}", key, Yuan(amount_micros),
                 tenant_id, issued_by, reason);
  }
  return internal::FindTransfer(db_, tenant_id, key);
}

absl::StatusOr<TransferRecord> Billing::RefundTopUp(const std::string& tenant_id,
                                                    const std::string& payment_id,
                                                    int64_t amount_micros,
                                                    const std::string& reason,
                                                    const std::string& issued_by,
                                                    absl::Time now) {
  if (payment_id.empty() || payment_id.size() > 128) {
    return Error(absl::StatusCode::kInvalidArgument, "INVALID_PAYMENT_ID",
                 "payment_id must be 1 to 128 characters");
  }
  if (amount_micros < 0 || amount_micros > kAmountMax) {
    return Error(absl::StatusCode::kInvalidArgument, "INVALID_AMOUNT",
                 "amount_micros must be 0 (the whole top-up) or positive, at most "
                 "10,000,000 CNY");
  }
  SV_RETURN_IF_ERROR(CheckReasonText(reason));
  const std::string key = absl::StrCat("topup-refund:", payment_id);
  int64_t refunded = 0;
  bool posted = false;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) -> absl::Status {
    posted = false;
    SV_ASSIGN_OR_RETURN(const std::string kind, ModeAccountKind(txn, tenant_id));
    auto topup = txn.exec_params(
        "SELECT amount_micros FROM ledger_transfers WHERE idempotency_key = $1 AND leg = 0 "
        "AND kind = 'topup' AND tenant_id = $2",
        absl::StrCat("topup:", payment_id), tenant_id);
    if (topup.empty()) {
      return Error(absl::StatusCode::kNotFound, "TOPUP_NOT_FOUND",
                   absl::StrCat("tenant ", tenant_id, " has no top-up with payment_id '",
                                payment_id, "'"));
    }
    const int64_t paid = topup[0][0].as<int64_t>();
    refunded = amount_micros == 0 ? paid : amount_micros;
    if (refunded > paid) {
      return Error(absl::StatusCode::kInvalidArgument, "REFUND_ABOVE_TOPUP",
                   absl::StrCat("the refund of ", Yuan(refunded), " is more than the ",
                                Yuan(paid), " of payment '", payment_id, "'"));
    }
    SV_ASSIGN_OR_RETURN(
        bool replay,
        IsReplay(txn, key, tenant_id, refunded, reason,
                 absl::StrCat("payment '", payment_id,
                              "' was already refunded (once per payment; its transfer is ",
                              key, ")")));
    if (replay) return absl::OkStatus();
    // The account is locked before it is read, so a metering run cannot
    // spend what the check counted; the CHECKs of ledger_accounts would
    // refuse an overdraft anyway, with a less useful error.
    const int64_t account = internal::TenantAccount(txn, tenant_id, kind);
    auto funds = txn.exec_params(
        "SELECT balance_micros, credit_limit_micros FROM ledger_accounts WHERE id = $1 "
        "FOR UPDATE",
        account);
    const int64_t balance = funds[0][0].as<int64_t>();
    const int64_t limit = funds[0][1].as<int64_t>();
    if (kind == "paid_wallet" && balance < refunded) {
      return Error(absl::StatusCode::kFailedPrecondition, "REFUND_EXCEEDS_BALANCE",
                   absl::StrCat("the paid wallet holds ", Yuan(balance), ", less than the ",
                                Yuan(refunded), " to refund (the rest was spent); refund at "
                                "most ", Yuan(balance)));
    }
    if (kind == "receivable" && balance - refunded < -limit) {
      return Error(absl::StatusCode::kFailedPrecondition, "REFUND_EXCEEDS_CREDIT_LIMIT",
                   absl::StrCat("refunding ", Yuan(refunded), " would take the receivable to ",
                                Yuan(balance - refunded), ", beyond its credit limit of ",
                                Yuan(limit)));
    }
    SV_RETURN_IF_ERROR(internal::PostSingle(
        txn, {key, "topup_refund", tenant_id, account,
              internal::PlatformAccount(txn, "payment_clearing"), refunded, now}));
    RecordReason(txn, key, tenant_id, "topup_refund", reason, issued_by,
                 absl::StrCat(Yuan(refunded), " of payment '", payment_id, "' was refunded",
                              kind == "receivable" ? " (added to what the account owes): "
                                                   : " from the paid wallet: ",
                              reason),
                 now);
    posted = true;
    return absl::OkStatus();
  }));
  if (posted) {
    spdlog::info("billing: refund {} of {} to tenant {} by {}: {}", key, Yuan(refunded),
                 tenant_id, issued_by, reason);
  }
  return internal::FindTransfer(db_, tenant_id, key);
}

}  // namespace sv::billing
