#ifndef SV_API_AUDIT_BATCH_H_
#define SV_API_AUDIT_BATCH_H_

#include "api/authz_interceptor.h"
#include "common/clock.h"
#include "store/database.h"

namespace sv::api {

// Like DatabaseAuditSink, with group commit: the rows of calls that finish
// at the same moment are written by one INSERT in one transaction (the
// first waiting call writes for all, the others wait for that commit), so
// every call still returns only after its own row is committed. If a batch
// fails, its rows are written one by one, so one bad row never costs the
// others theirs. A failed write is logged and counted
// (sv_audit_write_failures_total); the call's answer stands.
AuditSink BatchedDatabaseAuditSink(store::Database& db, const Clock& clock);

}  // namespace sv::api

#endif  // SV_API_AUDIT_BATCH_H_
