// Monthly invoices of postpaid tenants, by Asia/Shanghai calendar month.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/civil_time.h"
#include "billing/billing.h"
#include "billing/internal/ledger_sql.h"
#include "common/ids.h"
#include "common/status.h"
#include "metrics/metrics.h"
#include "store/charges_sql.h"
#include "spdlog/spdlog.h"

namespace sv::billing {
namespace {

using store::SqlTime;

// Asia/Shanghai has been UTC+8 without daylight saving since 1991; a fixed
// zone keeps invoices independent of the host's tz database.
absl::TimeZone Shanghai() { return absl::FixedTimeZone(8 * 3600); }

constexpr char kInvoiceColumns[] =
    "id, tenant_id, period_label, (extract(epoch from period_start) * 1000000)::bigint, "
    "(extract(epoch from period_end) * 1000000)::bigint, total_micros, total_fen, "
    "(extract(epoch from issued_at) * 1000000)::bigint, carried_micros, carried_fen, "
    "amount_due_micros, amount_due_fen";

Invoice ReadInvoice(pqxx::work& txn, const pqxx::row& r, bool with_lines = true) {
  Invoice inv;
  inv.id = r[0].as<std::string>();
  inv.tenant_id = r[1].as<std::string>();
  inv.period = r[2].as<std::string>();
  inv.period_start = absl::FromUnixMicros(r[3].as<int64_t>());
  inv.period_end = absl::FromUnixMicros(r[4].as<int64_t>());
  inv.total_micros = r[5].as<int64_t>();
  inv.total_fen = r[6].as<int64_t>();
  inv.issued_at = absl::FromUnixMicros(r[7].as<int64_t>());
  if (!r[8].is_null()) {
    inv.carried_micros = r[8].as<int64_t>();
    inv.carried_fen = r[9].as<int64_t>();
    inv.amount_due_micros = r[10].as<int64_t>();
    inv.amount_due_fen = r[11].as<int64_t>();
  }
  if (!with_lines) return inv;
  auto lines = txn.exec_params(
      "SELECT kind, instance_id, gpu_model, gpu_minutes, amount_micros, amount_fen "
      "FROM invoice_lines WHERE invoice_id = $1 ORDER BY line_no",
      inv.id);
  for (const auto& l : lines) {
    inv.lines.push_back({l[0].as<std::string>(), l[1].as<std::string>(),
                         l[2].as<std::string>(), l[3].as<int64_t>(), l[4].as<int64_t>(),
                         l[5].as<int64_t>()});
  }
  return inv;
}

// Usage lines per instance and GPU model (what the receivable was charged,
// and the GPU-minutes of those charges, each at its own GPU count; trial
// credit is not invoiced), app fees per instance and storage (one line
// for all volumes), then SLA refunds to the receivable as negative lines
// (one paid into the paid wallet while the tenant was prepaid is the
// tenant's already), then
// late-event adjustments of the receivable (billing/adjustments.cc).
std::string LinesSql() {
  return absl::StrCat(R"sql(
SELECT 'usage', i.id, i.gpu_model, sum(c.gpu_count)::bigint, sum(c.main_micros)::bigint
FROM )sql", store::TenantChargesSql("$1",
                                     "$2::bigint", "$3::bigint"), R"sql( c
JOIN instances i ON i.billing_no = c.instance_no
JOIN ledger_accounts fa ON fa.id = c.main_account AND fa.kind = 'receivable'
GROUP BY i.id, i.gpu_model
UNION ALL
SELECT t.kind, coalesce(t.instance_id, ''), '', 0, sum(t.amount_micros)::bigint
FROM ledger_transfers t
JOIN ledger_accounts fa ON fa.id = t.from_account_id AND fa.kind = 'receivable'
WHERE t.tenant_id = $1 AND t.kind IN ('app_fee', 'storage') AND t.usage_minute >= $2
  AND t.usage_minute < $3
GROUP BY 1, 2
UNION ALL
SELECT 'sla_refund', coalesce(t.instance_id, ''), coalesce(t.gpu_model, ''), 0,
       -sum(t.amount_micros)::bigint
FROM ledger_transfers t
JOIN ledger_accounts ta ON ta.id = t.to_account_id AND ta.kind = 'receivable'
WHERE t.tenant_id = $1 AND t.kind = 'sla_refund' AND t.usage_minute >= $2
  AND t.usage_minute < $3
GROUP BY 2, 3
UNION ALL
SELECT 'adjustment', t.instance_id, coalesce(t.gpu_model, ''), 0,
       sum(CASE WHEN fa.kind = 'receivable' THEN t.amount_micros
                ELSE -t.amount_micros END)::bigint
FROM ledger_transfers t
JOIN ledger_accounts fa ON fa.id = t.from_account_id
JOIN ledger_accounts ta ON ta.id = t.to_account_id
WHERE t.tenant_id = $1 AND t.kind = 'adjustment' AND t.usage_minute >= $2
  AND t.usage_minute < $3 AND 'receivable' IN (fa.kind, ta.kind)
GROUP BY 2, 3
HAVING sum(CASE WHEN fa.kind = 'receivable' THEN t.amount_micros
                ELSE -t.amount_micros END) <> 0
ORDER BY 1 DESC, 2, 3
)sql");
}

}  // namespace

absl::StatusOr<Invoice> Billing::IssueInvoice(const std::string& tenant_id,
                                              absl::Time month_instant, absl::Time now) {
  const absl::CivilMonth month = absl::ToCivilMonth(month_instant, Shanghai());
  const absl::Time start = absl::FromCivil(month, Shanghai());
  const absl::Time end = absl::FromCivil(month + 1, Shanghai());
  const std::string label = absl::FormatCivilTime(month).substr(0, 7);
  std::optional<Invoice> invoice;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) -> absl::Status {
    invoice.reset();
    auto tenant = txn.exec_params("SELECT billing_mode FROM tenants WHERE id = $1 FOR UPDATE",
                                  tenant_id);
    if (tenant.empty()) {
      return Error(absl::StatusCode::kNotFound, "TENANT_NOT_FOUND", "no such tenant");
    }
    auto existing = txn.exec_params(
        absl::StrCat("SELECT ", kInvoiceColumns,
                     " FROM invoices WHERE tenant_id = $1 AND period_start = $2::timestamptz"),
        tenant_id, SqlTime(start));
    if (!existing.empty()) {
      invoice = ReadInvoice(txn, existing[0]);
      return absl::OkStatus();
    }
    auto cursor = txn.exec("SELECT coalesce(billed_before_minute, 0) FROM billing_cursor");
    if (now < end || cursor[0][0].as<int64_t>() < MinuteOf(end)) {
      return Error(absl::StatusCode::kFailedPrecondition, "PERIOD_NOT_BILLED",
                   absl::StrCat("month ", label, " is not completely billed yet"));
    }
    if (options_.invoices_wait_for_sla_judge) {
      // The judge's cursor: every hour before it is judged and its refunds
      // posted (NULL: no hour judged yet).
      auto judged = txn.exec_params(
          "SELECT coalesce(judged_before >= $1::timestamptz, false) FROM sla_cursor",
          SqlTime(end));
      if (judged.empty() || !judged[0][0].as<bool>()) {
        return Error(absl::StatusCode::kFailedPrecondition, "PERIOD_NOT_JUDGED",
                     absl::StrCat("the SLA refunds of month ", label,
                                  " are not all posted yet (its last hour is judged an "
                                  "hour and the grace after it ends)"));
      }
    }
    const std::string id = NewId("inv");
    txn.exec("SET LOCAL jit = off");  // See store::TenantChargesSql.
    auto lines = txn.exec_params(LinesSql(), tenant_id, MinuteOf(start), MinuteOf(end));
    int64_t total_micros = 0, total_fen = 0;
    for (const auto& l : lines) {
      total_micros += l[4].as<int64_t>();
      total_fen += RoundToFen(l[4].as<int64_t>());
    }
    // What the receivable holds of everything up to the month's end: its
    // balance now less what usage from the end on did to it (charges,
    // fees, refunds and adjustments of later minutes); payments and
    // balance moves have no usage minute and all count. One statement, so
    // one snapshot. Negative: owed.
    auto through = txn.exec_params(
        absl::StrCat(
            "SELECT a.balance_micros + coalesce((SELECT sum(c.main_micros) FROM ",
            store::TenantChargesSql("$1", "$2::bigint", "NULL"),
            " c WHERE c.main_account = a.id), 0) - coalesce((SELECT sum(CASE WHEN "
            "t.to_account_id = a.id THEN t.amount_micros ELSE -t.amount_micros END) "
            "FROM ledger_transfers t WHERE t.tenant_id = $1 AND t.usage_minute >= $2 "
            "AND a.id IN (t.from_account_id, t.to_account_id)), 0)::bigint "
            "FROM ledger_accounts a WHERE a.tenant_id = $1 AND a.kind = 'receivable' "
            "AND a.owner = ''"),
        tenant_id, MinuteOf(end));
    const int64_t carried = -through[0][0].as<int64_t>() - total_micros;
    const int64_t carried_fen = RoundToFen(carried);
    txn.exec_params(
        "INSERT INTO invoices (id, tenant_id, period_start, period_end, period_label, "
        "total_micros, total_fen, issued_at, carried_micros, carried_fen, amount_due_micros, "
        "amount_due_fen) VALUES ($1, $2, $3::timestamptz, $4::timestamptz, $5, $6, $7, "
        "$8::timestamptz, $9, $10, $11, $12)",
        id, tenant_id, SqlTime(start), SqlTime(end), label, total_micros, total_fen,
        SqlTime(now), carried, carried_fen, std::max<int64_t>(0, total_micros + carried),
        std::max<int64_t>(0, total_fen + carried_fen));
    int line_no = 0;
    for (const auto& l : lines) {
      const int64_t micros = l[4].as<int64_t>();
      txn.exec_params(
          "INSERT INTO invoice_lines (invoice_id, line_no, kind, instance_id, gpu_model, "
          "gpu_minutes, amount_micros, amount_fen) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
          id, ++line_no, l[0].as<std::string>(), l[1].as<std::string>(),
          l[2].as<std::string>(), l[3].as<int64_t>(), micros, RoundToFen(micros));
    }
    auto reread = txn.exec_params(
        absl::StrCat("SELECT ", kInvoiceColumns, " FROM invoices WHERE id = $1"), id);
    invoice = ReadInvoice(txn, reread[0]);
    return absl::OkStatus();
  }));
  return *invoice;
}

absl::Status Billing::IssueDueInvoices(absl::Time now) {
  // The month before the one `now` is in, for every tenant that was
  // postpaid at some time in it (postpaid now and since before its end, or
  // postpaid until after its start) and has no invoice for it yet.
  const absl::CivilMonth current = absl::ToCivilMonth(now, Shanghai());
  const absl::Time previous = absl::FromCivil(current - 1, Shanghai());
  const absl::Time previous_end = absl::FromCivil(current, Shanghai());
  // Tenants due an invoice for the month (the parameters: its start, its
  // end, and the last tenant id of the page before).
  constexpr char kDue[] =
      "FROM tenants t WHERE t.id > $3 AND "
      "((t.billing_mode = 'postpaid' AND coalesce(t.postpaid_since, t.created_at) < "
      "  $2::timestamptz) OR t.postpaid_until > $1::timestamptz) "
      "AND NOT EXISTS (SELECT 1 FROM invoices v WHERE v.tenant_id = t.id "
      "AND v.period_start = $1::timestamptz)";
  // The month's gates, once (IssueInvoice checks them again under the
  // tenant's lock): until metering has passed the month's end no invoice
  // is due, and until the SLA judge has judged its last hour every due one
  // is held. Trying each tenant meanwhile took a tenant lock per postpaid
  // tenant every run for the hour and more the judge needs.
  bool billed = false, judged = true;
  int held = 0;  // Waiting for the SLA judge to pass the month's end.
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) {
    billed = txn.exec1("SELECT coalesce(billed_before_minute, 0) FROM billing_cursor")[0]
                 .as<int64_t>() >= MinuteOf(previous_end);
    judged = !options_.invoices_wait_for_sla_judge ||
             txn.exec_params1("SELECT coalesce(bool_or(judged_before >= $1::timestamptz), "
                              "false) FROM sla_cursor",
                              SqlTime(previous_end))[0]
                 .as<bool>();
    held = 0;
    if (billed && !judged) {
      held = txn.exec_params1(absl::StrCat("SELECT count(*) ", kDue), SqlTime(previous),
                              SqlTime(previous_end), std::string())[0]
                 .as<int>();
    }
    return absl::OkStatus();
  }));
  // Page by page in id order, every due tenant each run: a tenant whose
  // invoice fails is logged, counted and passed over, so it cannot keep
  // every tenant after it uninvoiced (it stopped the run, and came first
  // again in the next one, for ever). The run itself succeeds: its
  // metering did, and the failure has its own counter.
  std::string after;
  while (billed && judged) {
    std::vector<std::string> due;
    SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) {
      due.clear();
      auto rows = txn.exec_params(absl::StrCat("SELECT t.id ", kDue, " ORDER BY t.id LIMIT 100"),
                                  SqlTime(previous), SqlTime(previous_end), after);
      for (const auto& r : rows) due.push_back(r[0].as<std::string>());
      return absl::OkStatus();
    }));
    if (due.empty()) break;
    after = due.back();
    for (const auto& tenant : due) {
      auto issued = IssueInvoice(tenant, previous, now);
      if (issued.ok()) continue;
      const std::string reason = ReasonOf(issued.status());
      if (reason == "PERIOD_NOT_JUDGED") {
        ++held;
      } else if (reason != "PERIOD_NOT_BILLED") {
        // The database is away: the others would fail alike.
        if (issued.status().code() == absl::StatusCode::kUnavailable) return issued.status();
        metrics::Registry::Default().IncrementCounter(
            "sv_invoice_failures_total",
            "Monthly invoices that failed to be issued, each try (the tenant is tried "
            "again next run; the others are not held up).",
            {});
        spdlog::error("billing: invoice of tenant {} for {} failed: {}", tenant,
                      absl::FormatCivilTime(current - 1), issued.status().ToString());
      }
    }
  }
  // The judge posts the last hour's refunds an hour and its grace after the
  // month ends. An invoice still held hours later means the judge is stuck
  // (its runs fail, or no replica runs it): say so, not only in a counter
  // of failed judge runs.
  const absl::Duration waited = now - previous_end;
  auto& metrics = metrics::Registry::Default();
  metrics.SetGauge("sv_invoices_held_by_sla_judge",
                   "Invoices of the month just ended that wait for the SLA judge to judge "
                   "its last hour.",
                   {}, held);
  metrics.SetGauge("sv_invoice_hold_seconds",
                   "How long after the month's end invoices have waited for the SLA judge "
                   "(0 when none waits).",
                   {}, held > 0 ? absl::ToDoubleSeconds(waited) : 0);
  if (held > 0 && waited > absl::Hours(3) && now - invoice_hold_warned_ >= absl::Hours(1)) {
    invoice_hold_warned_ = now;
    spdlog::warn("billing: {} invoice(s) of the month ended {} ago wait for the SLA judge, "
                 "which has not judged the month's last hour; see sv_sla_judge_runs_total",
                 held, absl::FormatDuration(absl::Trunc(waited, absl::Minutes(1))));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Invoice>> Billing::ListInvoices(const std::string& tenant_id,
                                                           const std::string& after_id,
                                                           int limit) {
  // Newest period first; a page continues after the invoice whose id is
  // the token (ids are random, so the key is (period_start, id)). One
  // tenant's only: "" would mean every tenant's.
  if (tenant_id.empty()) {
    return Error(absl::StatusCode::kNotFound, "TENANT_NOT_FOUND", "no such tenant");
  }
  SV_ASSIGN_OR_RETURN(auto list, ListAllInvoices({.tenant_id = tenant_id,
                                                  .after_id = after_id,
                                                  .limit = limit,
                                                  .with_lines = true}));
  std::vector<Invoice> out;
  for (auto& t : list.invoices) out.push_back(std::move(t.invoice));
  return out;
}

absl::StatusOr<InvoiceList> Billing::ListAllInvoices(const InvoiceFilter& filter) {
  std::optional<absl::Time> period_start;
  if (!filter.period.empty()) {
    absl::CivilMonth month;
    if (!absl::ParseCivilTime(filter.period, &month) ||
        absl::FormatCivilTime(month).substr(0, 7) != filter.period) {
      return Error(absl::StatusCode::kInvalidArgument, "INVALID_PERIOD",
                   absl::StrCat("period must be a month as YYYY-MM, e.g. 2026-11; got '",
                                filter.period, "'"));
    }
    period_start = absl::FromCivil(month, Shanghai());
  }
  // $1 tenant ("" = all), $2 period start ("" = all).
  constexpr char kWhere[] =
      " WHERE ($1 = '' OR tenant_id = $1) AND ($2 = '' OR "
      "period_start = nullif($2, '')::timestamptz)";
  const std::string start = period_start ? SqlTime(*period_start) : "";
  InvoiceList out;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) -> absl::Status {
    out = InvoiceList{};
    if (!filter.tenant_id.empty() &&
        txn.exec_params("SELECT 1 FROM tenants WHERE id = $1", filter.tenant_id).empty()) {
      return Error(absl::StatusCode::kNotFound, "TENANT_NOT_FOUND", "no such tenant");
    }
    if (!filter.after_id.empty() &&
        txn.exec_params(absl::StrCat("SELECT 1 FROM invoices", kWhere, " AND id = $3"),
                        filter.tenant_id, start, filter.after_id)
            .empty()) {
      return Error(absl::StatusCode::kInvalidArgument, "INVALID_PAGE_TOKEN",
                   "page_token is not one this server returned for this filter");
    }
    auto rows = txn.exec_params(
        absl::StrCat("SELECT ", kInvoiceColumns,
                     ", (SELECT name FROM tenants WHERE tenants.id = invoices.tenant_id) "
                     "FROM invoices",
                     kWhere,
                     " AND ($3 = '' OR (period_start, id) < (SELECT period_start, id FROM "
                     "invoices WHERE id = $3)) ORDER BY period_start DESC, id DESC LIMIT $4"),
        filter.tenant_id, start, filter.after_id, filter.limit);
    for (const auto& r : rows) {
      out.invoices.push_back({r[12].as<std::string>(), ReadInvoice(txn, r, filter.with_lines)});
    }
    auto totals = txn.exec_params(
        absl::StrCat("SELECT count(*), coalesce(sum(total_micros), 0)::bigint, "
                     "coalesce(sum(amount_due_micros), 0)::bigint FROM invoices",
                     kWhere),
        filter.tenant_id, start);
    out.count = totals[0][0].as<int64_t>();
    out.total_micros = totals[0][1].as<int64_t>();
    out.amount_due_micros = totals[0][2].as<int64_t>();
    return absl::OkStatus();
  }));
  return out;
}

absl::StatusOr<Invoice> Billing::GetInvoice(const std::string& tenant_id,
                                            const std::string& id) {
  std::optional<Invoice> out;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) {
    auto rows = txn.exec_params(
        absl::StrCat("SELECT ", kInvoiceColumns,
                     " FROM invoices WHERE tenant_id = $1 AND id = $2"),
        tenant_id, id);
    if (!rows.empty()) out = ReadInvoice(txn, rows[0]);
    return absl::OkStatus();
  }));
  if (!out) return Error(absl::StatusCode::kNotFound, "INVOICE_NOT_FOUND", "no such invoice");
  return *out;
}

}  // namespace sv::billing
