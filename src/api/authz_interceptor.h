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
};

// The calls in flight, by their ServerContext. Process-wide: contexts are
// unique among live calls, whatever the number of servers.
class CallRegistry {
 public:
  static CallRegistry& Default();
  void Begin(const grpc::ServerContextBase* context, std::string method);
  void End(const grpc::ServerContextBase* context);
  // Nothing when the call did not pass through the interceptor.
  std::optional<CallInfo> Find(const grpc::ServerContextBase* context) const;
  void SetPrincipal(const grpc::ServerContextBase* context, const store::Principal& who);
};

class AuthzInterceptorFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  // `audit` receives every mutating call of sv.v1 that identified its caller.
  explicit AuthzInterceptorFactory(AuditSink audit) : audit_(std::move(audit)) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override;

 private:
  AuditSink audit_;
};

}  // namespace sv::api

#endif  // SV_API_AUTHZ_INTERCEPTOR_H_
