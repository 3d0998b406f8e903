#ifndef SV_API_AUTHZ_INTERCEPTOR_H_
#define SV_API_AUTHZ_INTERCEPTOR_H_

// The server side of the single authorization point. The interceptor sees
// every call first and records its method (and request_id) under the call's
// ServerContext; the Authenticator, which every service calls first, reads
// the method from there and applies the table of authz.h, and records the
// caller. When the call ends, the interceptor writes the audit entry of a
// mutating call, so no service can forget it.

#include <grpcpp/support/server_interceptor.h>

#include <functional>
#include <optional>
#include <string>

#include "api/authz.h"
#include "common/clock.h"
#include "store/database.h"
#include "store/security_store.h"
#include "store/store.h"

namespace grpc {
class ServerContextBase;
}  // namespace grpc

namespace google::protobuf {
class Message;
}  // namespace google::protobuf

namespace sv::api {

// One finished mutating call, as the audit log records it.
struct AuditEvent {
  std::optional<store::Principal> who;  // Empty: the caller was not identified.
  std::string method;
  std::string request_id;
  int code = 0;  // grpc::StatusCode
  std::string reason;
  std::string peer;
};

using AuditSink = std::function<void(const AuditEvent&)>;

// Writes each event to the audit_log table. A failed write is logged and
// counted (sv_audit_write_failures_total); the call's answer stands.
AuditSink DatabaseAuditSink(store::Database& db, const Clock& clock);
// The audit row of a finished call, and the metric and log line when it
// cannot be written (shared by both sinks).
store::AuditRow AuditRowOf(const AuditEvent& event, absl::Time at);
void ReportAuditFailure(const store::AuditRow& row, const absl::Status& status);

// What is known about a call in flight.
struct CallInfo {
  std::string method;
  const MethodRule* rule = nullptr;  // nullptr: the method has no rule.
  std::optional<store::Principal> who;
  // The interceptor's sink writes to the services' database, so a service
  // may write the call's audit row in its own transaction instead.
  bool in_transaction_audit = false;
  // A service committed the call's row with code OK (MarkAudited).
  bool audited = false;
};

// The calls in flight, by their ServerContext. Process-wide: contexts are
// unique among live calls, whatever the number of servers.
class CallRegistry {
 public:
  static CallRegistry& Default();
  void Begin(const grpc::ServerContextBase* context, std::string method,
             bool in_transaction_audit = false);
  void End(const grpc::ServerContextBase* context);
  // Nothing when the call did not pass through the interceptor.
  std::optional<CallInfo> Find(const grpc::ServerContextBase* context) const;
  void SetPrincipal(const grpc::ServerContextBase* context, const store::Principal& who);
  // The call's audit row, from InTransactionAuditRow, was committed: the
  // interceptor writes none when the call ends OK.
  void MarkAudited(const grpc::ServerContextBase* context);
};

// For a service that writes its call's audit row in the transaction of the
// call's own write (the create and delete batches, docs/security.md): the
// row the interceptor would write if the call ends OK, stamped `at`. Nothing
// when the interceptor must write it: the call did not pass through an
// interceptor whose sink writes to the services' database, is not audited,
// or did not identify its caller. A service that committed the row calls
// MarkAudited and must then end the call OK.
std::optional<store::AuditRow> InTransactionAuditRow(const grpc::ServerContextBase* context,
                                                     const google::protobuf::Message& request,
                                                     absl::Time at);

class AuthzInterceptorFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  // `audit` receives every mutating call of sv.v1 that identified its
  // caller, except those a service audited in its own transaction; services
  // may do that only when `in_transaction_audit` says `audit` writes to
  // audit_log of the database the services write to.
  explicit AuthzInterceptorFactory(AuditSink audit, bool in_transaction_audit = false)
      : audit_(std::move(audit)), in_transaction_audit_(in_transaction_audit) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override;

 private:
  AuditSink audit_;
  bool in_transaction_audit_;
};

}  // namespace sv::api

#endif  // SV_API_AUTHZ_INTERCEPTOR_H_
