// SQL for reading minute charges (ledger_charges) by tenant.
#ifndef SV_STORE_CHARGES_SQL_H_
#define SV_STORE_CHARGES_SQL_H_

#include <string>

namespace sv::store {

// A FROM item (to be given an alias) with the columns of ledger_charges:
// the minute charges of the tenant `tenant_id`, in the Unix minutes
// [lo, hi). Each argument is an SQL expression; `lo` or `hi` may be NULL for
// no bound. It is the SQL function sv_tenant_charges (migration 0091), which
// probes the primary key (minute, tenant number, instance number) once per
// minute between the tenant's creation and the last billed minute; a month
// is at most 44,640 probes. PostgreSQL inlines it unless an argument is a
// subquery, so pass parameters or columns. Run the query with
// `SET LOCAL jit = off`: the planner guesses 1,000 minutes and a cost above
// jit_above_cost, and JIT compiling takes 25-28 ms of a 1 ms read.
std::string TenantChargesSql(const std::string& tenant_id, const std::string& lo,
                             const std::string& hi);

// What the tenant `tenant_id` was charged for usage from Unix minute
// `since_minute` on (minute charges, app fees, storage): an SQL expression
// of type bigint, the function sv_tenant_spent_since (migration 0091).
std::string TenantSpentSinceSql(const std::string& tenant_id, const std::string& since_minute);

}  // namespace sv::store

#endif  // SV_STORE_CHARGES_SQL_H_
