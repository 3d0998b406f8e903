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

// Whether credit:<credit_id> is already posted with this content;
// ALREADY_EXISTS when it is posted with another.
absl::StatusOr<bool> CreditPosted(pqxx::work& txn, const std::string& tenant_id,
                                  const std::string& credit_id, int64_t amount_micros,
                                  const std::string& reason) {
  return IsReplay(txn, absl::StrCat("credit:", credit_id), tenant_id, amount_micros, reason,
                  absl::StrCat("credit_id '", credit_id,
                               "' was already used for another credit (tenant, amount or "
                               "reason differ)"));
}

// Posts credit:<credit_id>; the caller has checked the amount and the
// reason, and that it is not posted yet.
absl::Status PostCredit(pqxx::work& txn, const std::string& tenant_id,
                        const std::string& credit_id, int64_t amount_micros,
                        const std::string& reason, const std::string& issued_by,
                        absl::Time now) {
  const std::string key = absl::StrCat("credit:", credit_id);
  SV_ASSIGN_OR_RETURN(const std::string kind, ModeAccountKind(txn, tenant_id));
  SV_RETURN_IF_ERROR(internal::PostSingle(
      txn, {key, "credit", tenant_id, internal::PlatformAccount(txn, "credit_expense"),
            internal::TenantAccount(txn, tenant_id, kind), amount_micros, now}));
  RecordReason(txn, key, tenant_id, "credit", reason, issued_by,
               absl::StrCat("a credit of ", Yuan(amount_micros),
                            kind == "receivable" ? " was taken off what the account owes: "
                                                 : " was added to the paid wallet: ",
                            reason),
               now);
  return absl::OkStatus();
}

absl::Status CheckCredit(const std::string& credit_id, int64_t amount_micros,
                         const std::string& reason) {
  if (credit_id.empty() || credit_id.size() > 128) {
    return Error(absl::StatusCode::kInvalidArgument, "INVALID_CREDIT_ID",
                 "credit_id must be 1 to 128 characters");
  }
  if (amount_micros <= 0 || amount_micros > kAmountMax) {
    return Error(absl::StatusCode::kInvalidArgument, "INVALID_AMOUNT",
                 "amount_micros must be positive and at most 10,000,000 CNY");
  }
  return CheckReasonText(reason);
}

// Whether the two-person rule holds this credit for a second operator: it
// is above the limit, or it and what `issuer` credited alone over the last
// 24 hours are (so a large credit cannot be split into small ones). The
// issuer's advisory lock serializes its credits, so two at once cannot
// both pass.
bool NeedsApproval(pqxx::work& txn, int64_t limit, const std::string& issuer,
                   int64_t amount_micros, absl::Time now) {
  if (limit < 0) return false;
  if (amount_micros > limit) return true;
  txn.exec_params("SELECT pg_advisory_xact_lock(hashtext('credit-issuer:' || $1))", issuer);
  const int64_t alone = txn.exec_params1(
      "SELECT coalesce(sum(t.amount_micros), 0)::bigint FROM ledger_transfer_reasons r "
      "JOIN ledger_transfers t ON t.idempotency_key = r.idempotency_key AND t.leg = 0 "
      "WHERE r.issued_by = $1 AND t.kind = 'credit' AND r.at > $2::timestamptz "
      "AND NOT EXISTS (SELECT 1 FROM credit_requests c "
      "  WHERE r.idempotency_key = 'credit:' || c.credit_id AND c.needs_approval)",
      issuer, SqlTime(now - absl::Hours(24)))[0].as<int64_t>();
  return alone + amount_micros > limit;
}

absl::Status NeedsApprovalError(int64_t limit) {
  return Error(absl::StatusCode::kFailedPrecondition, "CREDIT_NEEDS_APPROVAL",
               absl::StrCat("credits above ", Yuan(limit),
                            " (or that take what one operator credited alone in 24 hours "
                            "above it) need a second operator: ask with RequestCredit "
                            "(svctl admin credit) and have another operator approve it"));
}

constexpr absl::Duration kCreditRequestValidity = absl::Hours(24 * 7);

const std::string kCreditRequestColumns =
    "seq, credit_id, tenant_id, amount_micros, reason, state, needs_approval, "
    "requested_email, " + store::MicrosOf("requested_at") + ", " +
    store::MicrosOf("expires_at") + ", coalesce(decided_email, ''), " +
    store::MicrosOf("decided_at") + ", decision_reason";

CreditRequestRecord CreditRequestFromRow(const pqxx::row& row, absl::Time now) {
  CreditRequestRecord r;
  r.seq = row[0].as<int64_t>();
  r.credit_id = row[1].as<std::string>();
  r.tenant_id = row[2].as<std::string>();
  r.amount_micros = row[3].as<int64_t>();
  r.reason = row[4].as<std::string>();
  r.state = row[5].as<std::string>();
  r.needs_approval = row[6].as<bool>();
  r.requested_by = row[7].as<std::string>();
  r.requested_at = store::TimeFromMicros(row[8].as<int64_t>());
  r.expires_at = store::TimeFromMicros(row[9].as<int64_t>());
  r.decided_by = row[10].as<std::string>();
  if (!row[11].is_null()) r.decided_at = store::TimeFromMicros(row[11].as<int64_t>());
  r.decision_reason = row[12].as<std::string>();
  if (r.state == "pending" && r.expires_at <= now) r.state = "expired";
  return r;
}

absl::Status CreditRequestNotFound(const std::string& credit_id) {
  return Error(absl::StatusCode::kNotFound, "CREDIT_REQUEST_NOT_FOUND",
               absl::StrCat("no credit was requested with credit_id '", credit_id, "'"));
}

}  // namespace

absl::StatusOr<TransferRecord> Billing::IssueCredit(const std::string& tenant_id,
                                                    const std::string& credit_id,
                                                    int64_t amount_micros,
                                                    const std::string& reason,
                                                    const std::string& issued_by,
                                                    absl::Time now) {
  SV_RETURN_IF_ERROR(CheckCredit(credit_id, amount_micros, reason));
  const std::string key = absl::StrCat("credit:", credit_id);
  const int64_t limit = options_.credit_approval_above_micros;
  bool posted = false;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) -> absl::Status {
    posted = false;
    SV_ASSIGN_OR_RETURN(bool replay,
                        CreditPosted(txn, tenant_id, credit_id, amount_micros, reason));
    if (replay) return absl::OkStatus();
    if (!txn.exec_params("SELECT 1 FROM credit_requests WHERE credit_id = $1", credit_id)
             .empty()) {
      return Error(absl::StatusCode::kFailedPrecondition, "CREDIT_REQUESTED",
                   absl::StrCat("credit_id '", credit_id,
                                "' belongs to a credit request: approve it (ApproveCredit)"));
    }
    if (NeedsApproval(txn, limit, issued_by, amount_micros, now)) {
      return NeedsApprovalError(limit);
    }
    SV_RETURN_IF_ERROR(
        PostCredit(txn, tenant_id, credit_id, amount_micros, reason, issued_by, now));
    posted = true;
    return absl::OkStatus();
  }));
  if (posted) {
    spdlog::info("billing: credit {} of {} to tenant {} by {}: {}", key, Yuan(amount_micros),
                 tenant_id, issued_by, reason);
  }
  return internal::FindTransfer(db_, tenant_id, key);
}

absl::StatusOr<CreditRequestRecord> Billing::RequestCredit(const std::string& tenant_id,
                                                           const std::string& credit_id,
                                                           int64_t amount_micros,
                                                           const std::string& reason,
                                                           const OperatorRef& by,
                                                           absl::Time now) {
  SV_RETURN_IF_ERROR(CheckCredit(credit_id, amount_micros, reason));
  const int64_t limit = options_.credit_approval_above_micros;
  bool posted = false;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) -> absl::Status {
    posted = false;
    SV_RETURN_IF_ERROR(ModeAccountKind(txn, tenant_id).status());
    auto existing = txn.exec_params(
        "SELECT tenant_id = $2 AND amount_micros = $3 AND reason = $4 FROM credit_requests "
        "WHERE credit_id = $1 FOR UPDATE",
        credit_id, tenant_id, amount_micros, reason);
    if (!existing.empty()) {
      if (existing[0][0].as<bool>()) return absl::OkStatus();  // A replay.
      return Error(absl::StatusCode::kAlreadyExists, "IDEMPOTENCY_KEY_REUSED",
                   absl::StrCat("credit_id '", credit_id,
                                "' was already used for another credit request (tenant, "
                                "amount or reason differ)"));
    }
    SV_ASSIGN_OR_RETURN(bool issued,
                        CreditPosted(txn, tenant_id, credit_id, amount_micros, reason));
    if (issued) {
      return Error(absl::StatusCode::kAlreadyExists, "IDEMPOTENCY_KEY_REUSED",
                   absl::StrCat("credit_id '", credit_id,
                                "' was already posted by IssueCredit"));
    }
    const bool needs = NeedsApproval(txn, limit, by.user_id, amount_micros, now);
    auto inserted = txn.exec_params(
        "INSERT INTO credit_requests (credit_id, tenant_id, amount_micros, reason, "
        "needs_approval, state, requested_by, requested_email, requested_at, expires_at) "
        "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9::timestamptz, $10::timestamptz) "
        "ON CONFLICT (credit_id) DO NOTHING RETURNING 1",
        credit_id, tenant_id, amount_micros, reason, needs, needs ? "pending" : "posted",
        by.user_id, by.email, SqlTime(now), SqlTime(now + kCreditRequestValidity));
    if (inserted.empty()) {
      return Error(absl::StatusCode::kAborted, "CONCURRENT_CREDIT_REQUEST",
                   "another request with this credit_id was made at the same time; retry");
    }
    if (!needs) {
      SV_RETURN_IF_ERROR(
          PostCredit(txn, tenant_id, credit_id, amount_micros, reason, by.user_id, now));
      posted = true;
    }
    return absl::OkStatus();
  }));
  SV_ASSIGN_OR_RETURN(CreditRequestRecord record, ReadCreditRequest(credit_id, now));
  if (posted) {
    spdlog::info("billing: credit {} of {} to tenant {} by {}: {}", credit_id,
                 Yuan(amount_micros), tenant_id, by.email, reason);
  } else if (record.state == "pending") {
    spdlog::info("billing: credit {} of {} to tenant {} requested by {} awaits a second "
                 "operator: {}",
                 credit_id, Yuan(amount_micros), tenant_id, by.email, reason);
  }
  return record;
}

absl::StatusOr<CreditRequestRecord> Billing::DecideCredit(const std::string& credit_id,
                                                          bool approve,
                                                          const std::string& reason,
                                                          const OperatorRef& by,
                                                          absl::Time now) {
  if (credit_id.empty() || credit_id.size() > 128) {
    return Error(absl::StatusCode::kInvalidArgument, "INVALID_CREDIT_ID",
                 "credit_id must be 1 to 128 characters");
  }
  if (!approve || !reason.empty()) SV_RETURN_IF_ERROR(CheckReasonText(reason));
  bool decided = false;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) -> absl::Status {
    decided = false;
    auto rows = txn.exec_params("SELECT " + kCreditRequestColumns + ", requested_by "
                                "FROM credit_requests WHERE credit_id = $1 FOR UPDATE",
                                credit_id);
    if (rows.empty()) return CreditRequestNotFound(credit_id);
    const CreditRequestRecord request = CreditRequestFromRow(rows[0], now);
    const std::string requester = rows[0][13].as<std::string>();
    if (request.state == "posted") {
      if (approve) return absl::OkStatus();
      return Error(absl::StatusCode::kFailedPrecondition, "CREDIT_ALREADY_POSTED",
                   absl::StrCat("credit ", credit_id, " is already posted; it cannot be "
                                "rejected (give a top-up refund or an adjustment instead)"));
    }
    if (request.state == "rejected") {
      if (!approve) return absl::OkStatus();
      return Error(absl::StatusCode::kFailedPrecondition, "CREDIT_REJECTED",
                   absl::StrCat("credit ", credit_id, " was rejected by ", request.decided_by,
                                ": ", request.decision_reason));
    }
    if (approve) {
      if (request.state == "expired") {
        return Error(absl::StatusCode::kFailedPrecondition, "CREDIT_REQUEST_EXPIRED",
                     absl::StrCat("the request for credit ", credit_id, " expired at ",
                                  absl::FormatTime(request.expires_at, absl::UTCTimeZone()),
                                  "; ask again with a new credit_id"));
      }
      if (by.user_id == requester) {
        return Error(absl::StatusCode::kFailedPrecondition, "SAME_OPERATOR",
                     "a credit above the approval limit needs a second operator: the one "
                     "who asked for it cannot approve it");
      }
      // IssueCredit refuses a requested id, but one racing the request's
      // own insert may have posted it: then it is that credit (the same
      // content) or the id's reuse (ALREADY_EXISTS), and is not posted twice.
      SV_ASSIGN_OR_RETURN(bool posted, CreditPosted(txn, request.tenant_id, credit_id,
                                                    request.amount_micros, request.reason));
      if (!posted) {
        SV_RETURN_IF_ERROR(PostCredit(txn, request.tenant_id, credit_id,
                                      request.amount_micros, request.reason, requester, now));
      }
    }
    txn.exec_params(
        "UPDATE credit_requests SET state = $2, decided_by = $3, decided_email = $4, "
        "decided_at = $5::timestamptz, decision_reason = $6 WHERE credit_id = $1",
        credit_id, approve ? "posted" : "rejected", by.user_id, by.email, SqlTime(now), reason);
    decided = true;
    return absl::OkStatus();
  }));
  SV_ASSIGN_OR_RETURN(CreditRequestRecord record, ReadCreditRequest(credit_id, now));
  if (decided) {
    spdlog::info("billing: credit {} of {} to tenant {} {} by {}{}{}", credit_id,
                 Yuan(record.amount_micros), record.tenant_id,
                 approve ? "approved" : "rejected", by.email, reason.empty() ? "" : ": ",
                 reason);
  }
  return record;
}

absl::StatusOr<CreditRequestRecord> Billing::ReadCreditRequest(const std::string& credit_id,
                                                               absl::Time now) {
  std::optional<CreditRequestRecord> record;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) {
    auto rows = txn.exec_params(
        "SELECT " + kCreditRequestColumns + " FROM credit_requests WHERE credit_id = $1",
        credit_id);
    if (!rows.empty()) record = CreditRequestFromRow(rows[0], now);
    return absl::OkStatus();
  }));
  if (!record) return CreditRequestNotFound(credit_id);
  if (record->state == "posted") {
    SV_ASSIGN_OR_RETURN(record->transfer,
                        internal::FindTransfer(db_, record->tenant_id,
                                               absl::StrCat("credit:", credit_id)));
  }
  return *std::move(record);
}

absl::StatusOr<std::vector<CreditRequestRecord>> Billing::ListCreditRequests(
    bool pending_only, int limit, int64_t before_seq, absl::Time now, bool* more) {
  std::vector<CreditRequestRecord> out;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) {
    out.clear();
    auto rows = txn.exec_params(
        "SELECT " + kCreditRequestColumns + " FROM credit_requests "
        "WHERE (NOT $1 OR (state = 'pending' AND expires_at > $2::timestamptz)) "
        "AND ($3 = 0 OR seq < $3) ORDER BY seq DESC LIMIT $4",
        pending_only, SqlTime(now), before_seq, limit + 1);
    for (const auto& row : rows) out.push_back(CreditRequestFromRow(row, now));
    return absl::OkStatus();
  }));
  *more = static_cast<int>(out.size()) > limit;
  if (*more) out.resize(limit);
  return out;
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
