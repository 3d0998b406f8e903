#ifndef SV_BILLING_BILLING_H_
#define SV_BILLING_BILLING_H_

// The billing ledger of sv: double-entry transfers in PostgreSQL, trial
// grants, the price book, per-minute metering from the exact RUNNING
// intervals, top-ups, postpaid invoices and the auditor. See docs/billing.md.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "billing/transfer_kinds.h"
#include "common/clock.h"
#include "common/money.h"
#include "store/database.h"
#include "store/leader_loop.h"
#include "store/store.h"

namespace sv::billing {

inline constexpr int64_t kMicrosPerYuan = 1'000'000;

struct BillingOptions {
  int64_t trial_amount_micros = 10 * kMicrosPerYuan;
  absl::Duration trial_validity = absl::Hours(24 * 30);
  // A create needs credit for this many minutes of the new instance.
  int create_credit_minutes = 10;
  // Warn when the running instances can run for fewer minutes than this.
  int low_credit_warning_minutes = 30;
  // A minute is billed this long after it ends, so that events recorded
  // late are in: a node's death ends RUNNING at its last heartbeat, found
  // only after the heartbeat timeout (30 s by default), so keep it above.
  absl::Duration metering_lag = absl::Seconds(60);
  // Charges written per metering transaction (instance-minutes).
  int batch_rows_max = 200'000;
  // Minutes one metering transaction may cover when catching up.
  int batch_minutes_max = 1440;
  absl::Duration loop_interval = absl::Seconds(5);
  // The first minute billed on an empty ledger is the one `now` falls in,
  // less this; older running time is not billed.
  absl::Duration first_run_lookback = absl::Hours(1);
  // Late events: every run rechecks the instances with a RUNNING boundary
  // in an instance_events row it has not seen yet, and also those with a
  // RUNNING end this close before the metering cursor (an end whose
  // transaction committed out of id order is still caught).
  absl::Duration late_event_recent_window = absl::Minutes(10);
  // A live volume whose storage has gone unpaid this long without a break
  // is deleted (docs/storage.md, "Unpaid storage"); zero keeps it for good.
  absl::Duration unpaid_storage_grace = absl::Hours(24 * 7);
  // A month's invoice waits until the SLA judge has judged the month's last
  // hour (sla_cursor, docs/sla.md), so the refunds of its last hours are on
  // it: they are posted an hour and the grace after the hour, well after
  // metering has passed the month's end. svd runs the judge and sets this;
  // the library alone has no judge.
  bool invoices_wait_for_sla_judge = false;
  // Two-person rule: a credit above this, or one that takes what its
  // operator credited without a second operator over the last 24 hours
  // above it, needs another operator's approval (RequestCredit,
  // DecideCredit). -1: no credit does.
  int64_t credit_approval_above_micros = 1'000 * kMicrosPerYuan;
};


enum class BillingMode { kPrepaid, kPostpaid };

struct Notice {
  std::string kind;
  std::string instance_id;
  std::string message;
  absl::Time at;
};

struct Balance {
  BillingMode mode = BillingMode::kPrepaid;
  int64_t paid_micros = 0;
  int64_t trial_micros = 0;
  std::optional<absl::Time> trial_expires_at;
  int64_t receivable_micros = 0;     // Negative: owed by a postpaid tenant.
  int64_t credit_limit_micros = 0;
  int64_t available_micros = 0;      // What metering may still charge.
  int64_t burn_micros_per_minute = 0;
  std::vector<Notice> notices;       // Newest first, at most 20.
};

struct TransferRecord {
  int64_t id = 0;  // 0 for a minute charge (ledger_charges); its key names it.
  std::string idempotency_key;
  int leg = 0;
  std::string kind;
  std::string from_kind;
  std::string to_kind;
  int64_t amount_micros = 0;
  // Signed effect on the tenant: negative when it paid.
  int64_t tenant_delta_micros = 0;
  std::string instance_id;
  std::optional<int64_t> usage_minute;
  absl::Time at;
  // The operator's reason of a credit or top-up refund; empty otherwise.
  std::string reason;
  // Keyset position in ListTransfers' order (posting time, then source,
  // id or instance number, minute, leg); opaque to callers.
  std::string cursor;
};

// An operator, as credits record them.
struct OperatorRef {
  std::string user_id;
  std::string email;
};

// A credit asked for through RequestCredit (billing/credits.cc).
struct CreditRequestRecord {
  int64_t seq = 0;
  std::string credit_id;
  std::string tenant_id;
  int64_t amount_micros = 0;
  std::string reason;
  // pending, posted, rejected or expired (pending past expires_at).
  std::string state;
  bool needs_approval = false;
  std::string requested_by;  // E-mail.
  absl::Time requested_at;
  absl::Time expires_at;
  std::string decided_by;  // E-mail; empty while pending.
  std::optional<absl::Time> decided_at;
  std::string decision_reason;
  std::optional<TransferRecord> transfer;  // state posted.
};

struct TransferFilter {
  std::optional<absl::Time> from;
  std::optional<absl::Time> to;
  std::string kind;
  std::string instance_id;
  // Keyset paging: transfers after this TransferRecord::cursor ("" = first
  // page). A malformed cursor is INVALID_ARGUMENT / INVALID_PAGE_TOKEN.
  std::string after;
  int limit = 100;
  bool newest_first = false;  // descending order (and `after` means before)
};

struct UsageRow {
  std::string instance_id;
  std::string day;  // YYYY-MM-DD in Asia/Shanghai.
  std::string gpu_model;
  int64_t gpu_minutes = 0;
  int64_t instance_minutes = 0;
  int64_t amount_micros = 0;
};

struct InvoiceLine {
  std::string kind;  // usage or sla_refund
  std::string instance_id;
  std::string gpu_model;
  int64_t gpu_minutes = 0;
  int64_t amount_micros = 0;
  int64_t amount_fen = 0;
};

struct Invoice {
  std::string id;
  std::string tenant_id;
  std::string period;  // YYYY-MM, Asia/Shanghai.
  absl::Time period_start;
  absl::Time period_end;
  int64_t total_micros = 0;
  int64_t total_fen = 0;
  absl::Time issued_at;
  std::vector<InvoiceLine> lines;
  // As of the issue (migration 0106; unset on invoices issued before it):
  // what the receivable owed before this invoice's lines (earlier charges
  // not paid, positive, less payments and credit, negative), and the
  // amount due, total + carried but at least zero. In fen: carried rounded
  // once, amount due total_fen + carried_fen, at least zero.
  std::optional<int64_t> carried_micros;
  std::optional<int64_t> carried_fen;
  std::optional<int64_t> amount_due_micros;
  std::optional<int64_t> amount_due_fen;
};

// Operators' view of invoices (Billing::ListAllInvoices).
struct InvoiceFilter {
  std::string tenant_id;  // "" for all.
  std::string period;     // YYYY-MM, "" for all.
  std::string after_id;   // Keyset: the last invoice id of the previous page.
  int limit = 100;
  bool with_lines = false;
};

struct TenantInvoice {
  std::string tenant_name;
  Invoice invoice;  // Its lines only if the filter asked for them.
};

struct InvoiceList {
  std::vector<TenantInvoice> invoices;  // At most limit, newest period first.
  // Over the whole filter, not only this page.
  int64_t total_micros = 0;
  int64_t amount_due_micros = 0;
  int64_t count = 0;
};

// One price of the price book: per GPU-minute (kind gpu_minute, item a GPU
// model, or '*' for any model without its own) or per GiB-hour of a volume
// (storage_gib_hour, item a volume kind or '*'), from `from` until the
// next price of the same item (none: until further notice).
struct PriceRow {
  std::string item_kind;
  std::string item;
  int64_t unit_price_micros = 0;
  absl::Time from;
  std::optional<absl::Time> until;
};

struct TenantBalance {
  std::string tenant_id;
  std::string tenant_name;
  Balance balance;
  bool suspended = false;  // A suspension is in force (migration 0111).
};

struct RevenueSummary {
  int64_t charged_micros = 0;        // Charges in the window.
  int64_t trial_spent_micros = 0;    // Of which paid from trial credit.
  int64_t topups_micros = 0;
  int64_t topup_refunds_micros = 0;  // Of top-ups, given back.
  int64_t credits_micros = 0;        // Operator credits given.
  int64_t trial_granted_micros = 0;
  int64_t trial_expired_micros = 0;
  int64_t sla_refunds_micros = 0;
  int64_t shortfall_micros = 0;          // GPU rent run but not paid.
  int64_t storage_shortfall_micros = 0;  // Storage of volumes kept but not paid.
  int64_t app_fee_shortfall_micros = 0;  // App fees of minutes run but not paid.
  int64_t platform_revenue_balance_micros = 0;  // All time.
  int64_t app_fees_micros = 0;
  int64_t app_fees_to_publishers_micros = 0;
  int64_t storage_micros = 0;
  int64_t adjustments_net_micros = 0;   // Into platform revenue, net.
  int64_t platform_revenue_micros = 0;  // The revenue account's net change in the window.
};

struct MeteringResult {
  int64_t minutes_billed = 0;
  int64_t postings = 0;  // Transfer legs written.
  int64_t stopped_instances = 0;
  std::optional<int64_t> billed_before_minute;
  int64_t adjustment_legs = 0;  // RecheckLateEvents.
  int64_t deleted_volumes = 0;  // DeleteUnpaidVolumes.

};

class Billing {
 public:
  Billing(store::Database& db, store::Store& store, const Clock& clock,
          BillingOptions options);

  // ---- Trial grants --------------------------------------------------------
  // Grants the trial once per user (a no-op after the first time).
  absl::Status EnsureTrialGrant(const std::string& user_id, absl::Time now);
  // Grants every member user that has none yet; returns how many.
  absl::StatusOr<int> GrantMissingTrials(absl::Time now);
  // Reverses what is left of trials that expire at or before `until`;
  // returns how many.
  absl::StatusOr<int> ExpireTrials(absl::Time until, absl::Time now);

  // ---- Prices --------------------------------------------------------------
  // Per GiB-hour of a volume kind (network, node_local, or * for any
  // other), from `effective_from` (now or later) on.
  absl::Status SetStoragePrice(const std::string& volume_kind, int64_t unit_price_micros,
                               absl::Time effective_from, absl::Time now);
  absl::Status SetGpuPrice(const std::string& gpu_model, int64_t unit_price_micros,
                           absl::Time effective_from, absl::Time now);
  absl::StatusOr<int64_t> GpuPrice(const std::string& gpu_model, absl::Time at);

  // ---- Money in ------------------------------------------------------------
  // Credits the paid wallet; `payment_id` is the idempotency key.
  absl::StatusOr<TransferRecord> TopUp(const std::string& tenant_id,
                                       const std::string& payment_id,
                                       int64_t amount_micros, absl::Time now);
  absl::Status SetBillingMode(const std::string& tenant_id, BillingMode mode,
                              int64_t credit_limit_micros);

  // ---- Credits and refunds (operators; billing/credits.cc) -----------------
  // Gives the tenant `amount_micros` from the platform's credit_expense
  // account: into its paid wallet (prepaid) or receivable (postpaid), with a
  // notice that shows `reason`. `credit_id` is the idempotency key
  // (credit:<credit_id>); `issued_by` is the operator, for the record.
  absl::StatusOr<TransferRecord> IssueCredit(const std::string& tenant_id,
                                             const std::string& credit_id,
                                             int64_t amount_micros, const std::string& reason,
                                             const std::string& issued_by, absl::Time now);
  // The same credit under the two-person rule: posted at once when the
  // rule lets one operator give it, otherwise left pending for another
  // operator's DecideCredit (7 days). A replay with the same tenant, amount
  // and reason returns the request as it stands.
  absl::StatusOr<CreditRequestRecord> RequestCredit(const std::string& tenant_id,
                                                    const std::string& credit_id,
                                                    int64_t amount_micros,
                                                    const std::string& reason,
                                                    const OperatorRef& by, absl::Time now);
  // Approves (posts) or rejects a pending request. The approver must not be
  // the requester (SAME_OPERATOR); a rejection needs a reason.
  absl::StatusOr<CreditRequestRecord> DecideCredit(const std::string& credit_id, bool approve,
                                                   const std::string& reason,
                                                   const OperatorRef& by, absl::Time now);
  // Newest first, `limit` rows after keyset position `before_seq` (0: from
  // the newest); `*more` says whether older rows follow.
  absl::StatusOr<std::vector<CreditRequestRecord>> ListCreditRequests(bool pending_only,
                                                                      int limit,
                                                                      int64_t before_seq,
                                                                      absl::Time now,
                                                                      bool* more);
  // One request, with its transfer when posted; CREDIT_REQUEST_NOT_FOUND.
  absl::StatusOr<CreditRequestRecord> ReadCreditRequest(const std::string& credit_id,
                                                        absl::Time now);
  // Gives back `amount_micros` (0: all) of the tenant's top-up `payment_id`
  // to payment_clearing, from the paid wallet (prepaid) or the receivable
  // (postpaid); once per payment (topup-refund:<payment_id>). Never more
  // than the top-up, than the wallet holds (REFUND_EXCEEDS_BALANCE) or than
  // the credit limit allows.
  absl::StatusOr<TransferRecord> RefundTopUp(const std::string& tenant_id,
                                             const std::string& payment_id,
                                             int64_t amount_micros, const std::string& reason,
                                             const std::string& issued_by, absl::Time now);

  // ---- Credit gate ---------------------------------------------------------
  // FAILED_PRECONDITION / INSUFFICIENT_CREDIT unless the tenant can pay the
  // first create_credit_minutes of `gpu_count` GPUs of `gpu_model`, of
  // every instance of the tenant that has not ended (the one being resized,
  // `resized_instance_id`, at its new size only; sv_committed_rent), and of
  // an app's fee of `app_price_per_hour_micros` (0: no app). Trial credit
  // pays rent first and never app fees (docs/marketplace.md), so the fee
  // and whatever rent the trial leaves must fit in the paid wallet (or a
  // postpaid tenant's receivable and its limit).
  absl::Status CheckCreditForCreate(const std::string& tenant_id, int gpu_count,
                                    const std::string& gpu_model, absl::Time now,
                                    int64_t app_price_per_hour_micros = 0,
                                    const std::string& resized_instance_id = "");
  // The hourly app fee an instance launched with (instance_apps), 0 if it
  // runs no paid app.
  absl::StatusOr<int64_t> AppPriceOf(const std::string& instance_id);
  // The same gate and the trial grant of `user_id`, as parameters of the
  // create's own transaction (store::CreateGate, sv_create_gate in migration
  // 0065), so a create pays no round trip for them.
  void FillCreateGate(const std::string& user_id, absl::Time now,
                      store::CreateGate* gate) const;
  // The error of a create the gate refused for credit: `needed` of the first
  // minutes against `available`.
  absl::Status CreditRefusal(int gpu_count, const std::string& gpu_model, int64_t needed,
                             int64_t available) const;

  // ---- Metering ------------------------------------------------------------
  // Bills every complete minute up to `now` less the lag, in batches, under
  // a cluster-wide advisory lock; then stops instances whose tenant ran out,
  // grants and expires trials, warns, and issues due invoices.
  absl::StatusOr<MeteringResult> RunOnce(absl::Time now);
  // Only the metering part of RunOnce, up to (not including) `before_minute`.
  absl::StatusOr<MeteringResult> BillMinutesBefore(int64_t before_minute, absl::Time now);
  // Late events (part of RunOnce): rechecks the billed minutes of instances
  // whose RUNNING events arrived after billing and posts `adjustment`
  // transfers (key adjust:{instance}:{minute}:{n}) for any difference;
  // returns the legs written.
  absl::StatusOr<int64_t> RecheckLateEvents(absl::Time now);

  // ---- Reading -------------------------------------------------------------
  absl::StatusOr<Balance> GetBalance(const std::string& tenant_id, absl::Time now);
  absl::StatusOr<std::vector<TransferRecord>> ListTransfers(const std::string& tenant_id,
                                                            const TransferFilter& filter);
  absl::StatusOr<std::vector<UsageRow>> GetUsage(const std::string& tenant_id,
                                                 absl::Time from, absl::Time to,
                                                 const std::string& instance_id);
  absl::StatusOr<std::vector<TenantBalance>> ListTenantBalances(const std::string& after_id,
                                                                int limit, absl::Time now);
  absl::StatusOr<RevenueSummary> GetRevenueSummary(absl::Time from, absl::Time to);
  // The GPU and storage prices in effect at `now` and every one scheduled
  // after it, by kind and item ('*' last), then time.
  absl::StatusOr<std::vector<PriceRow>> ListPrices(absl::Time now);

  // ---- Invoices ------------------------------------------------------------
  // Issues the invoice of a postpaid tenant for the Asia/Shanghai month that
  // contains `month_instant`; returns the existing one when already issued.
  absl::StatusOr<Invoice> IssueInvoice(const std::string& tenant_id, absl::Time month_instant,
                                       absl::Time now);
  absl::StatusOr<std::vector<Invoice>> ListInvoices(const std::string& tenant_id,
                                                    const std::string& after_id, int limit);
  absl::StatusOr<Invoice> GetInvoice(const std::string& tenant_id, const std::string& id);
  // Every tenant's invoices (operators): INVALID_ARGUMENT / INVALID_PERIOD
  // for a period that is not YYYY-MM, NOT_FOUND / TENANT_NOT_FOUND for an
  // unknown tenant, INVALID_ARGUMENT / INVALID_PAGE_TOKEN for an after_id
  // that names no invoice of the filter.
  absl::StatusOr<InvoiceList> ListAllInvoices(const InvoiceFilter& filter);

  // ---- Auditor -------------------------------------------------------------
  // Checks every ledger invariant; returns one line per failure (empty: all
  // good).
  absl::StatusOr<std::vector<std::string>> Audit();

  const BillingOptions& options() const { return options_; }

 private:
  // Applies the stops metering decided: Store::StopInstance at the clock's
  // now (never before the recorded stop_at).
  // Adds the instances it stopped to *stopped_count.
  absl::Status ApplyPendingStops(int64_t* stopped_count);
  // Stops, ahead of metering, the running instances whose tenant's credit
  // cannot pay for the minutes they have run that are not billed yet, up to
  // and including the minute of `now` (docs/billing.md, "Stopping before
  // metering gets there"). Adds the instances it stopped to *stopped_count.
  absl::Status StopUnfunded(absl::Time now, int64_t* stopped_count);
  absl::Status WarnLowCredit(absl::Time now);
  // Deletes the live volumes whose storage has gone unpaid, without a
  // break, for unpaid_storage_grace up to the metering cursor, each with a
  // volume_deleted notice (docs/storage.md, "Unpaid storage"). A volume
  // still attached to an instance that holds a node is left for a later
  // turn. Adds the volumes it deleted to *deleted_count.
  absl::Status DeleteUnpaidVolumes(absl::Time now, int64_t* deleted_count);
  absl::Status IssueDueInvoices(absl::Time now);

  store::Database& db_;
  store::Store& store_;
  const Clock& clock_;
  BillingOptions options_;
  // When IssueDueInvoices last warned of invoices held by a late SLA judge
  // (RunOnce's thread only).
  absl::Time invoice_hold_warned_ = absl::InfinitePast();
};

// Fen rounding: half away from zero (documented in docs/billing.md).
int64_t RoundToFen(int64_t micros);
// Amounts in messages (common/money.h).
using ::sv::Yuan;
// The Unix minute that contains `t`.
int64_t MinuteOf(absl::Time t);
absl::Time MinuteStart(int64_t minute);

// Runs Billing::RunOnce every loop_interval on a thread of its own.
class BillingLoop {
 public:
  BillingLoop(Billing& billing, const Clock& clock);
  // With a gate, runs bill only while this replica leads, fenced with its
  // epoch (control/leadership.h). Set before Start().
  void SetLeaderGate(const store::LeaderGate* gate) { loop_.SetLeaderGate(gate); }
  void Start() { loop_.Start(); }
  void Stop() { loop_.Stop(); }

 private:
  void RunTurn();
  Billing& billing_;
  const Clock& clock_;
  store::LeaderLoop loop_;
};

// `svd audit`: connects, audits, prints; returns the process exit code.
int RunAuditCommand(const std::string& database_url);

}  // namespace sv::billing

#endif  // SV_BILLING_BILLING_H_
