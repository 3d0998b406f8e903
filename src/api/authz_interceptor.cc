#include "api/authz_interceptor.h"

#include <grpcpp/server_context.h>

#include <mutex>

#include "absl/container/flat_hash_map.h"
#include "api/auth.h"
#include "api/errors.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "metrics/metrics.h"
#include "spdlog/spdlog.h"
#include "store/security_store.h"

namespace sv::api {
namespace {

using grpc::experimental::InterceptionHookPoints;

struct RegistryState {
  mutable std::mutex mutex;
  absl::flat_hash_map<const grpc::ServerContextBase*, CallInfo> calls;
};

RegistryState& State() {
  static auto* const state = new RegistryState();
  return *state;
}

// The request_id field of a request message, if it has one.
std::string RequestIdOf(const google::protobuf::Message& message) {
  const auto* field = message.GetDescriptor()->FindFieldByName("request_id");
  if (field == nullptr || field->is_repeated() ||
      field->type() != google::protobuf::FieldDescriptor::TYPE_STRING) {
    return "";
  }
  std::string id = message.GetReflection()->GetString(message, field);
  if (id.size() > 128) {
    // Cut on a character boundary: half a UTF-8 character is text
    // PostgreSQL refuses, and the audit row of the call was lost with it.
    size_t end = 128;
    while (end > 0 && (static_cast<unsigned char>(id[end]) & 0xC0) == 0x80) --end;
    id.resize(end);
  }
  return id;
}

class AuthzInterceptor final : public grpc::experimental::Interceptor {
 public:
  AuthzInterceptor(grpc::experimental::ServerRpcInfo* info, const AuditSink& audit,
                   bool in_transaction_audit)
      : context_(info->server_context()),
        method_(info->method() != nullptr ? info->method() : ""),
        rule_(FindMethodRule(method_)),
        audit_(audit) {
    CallRegistry::Default().Begin(context_, method_, in_transaction_audit && audit_);
  }
  ~AuthzInterceptor() override { CallRegistry::Default().End(context_); }

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    // Only unary methods of sv.v1 with a rule carry protobuf requests we
    // read; agent streams are audited by the agent service itself.
    const bool audited = rule_ != nullptr && rule_->access == Access::kWrite;
    if (audited &&
        methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_MESSAGE)) {
      void* message = methods->GetRecvMessage();
      if (message != nullptr) {
        request_id_ = RequestIdOf(*static_cast<google::protobuf::Message*>(message));
      }
    }
    if (audited &&
        methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
      Record(methods->GetSendStatus());
    }
    methods->Proceed();
  }

 private:
  void Record(const grpc::Status& status) {
    if (!audit_) return;
    auto info = CallRegistry::Default().Find(context_);
    // Calls that never identified their caller are counted in the metrics
    // but not written: an unauthenticated flood must not fill the database.
    if (!info.has_value() || !info->who.has_value()) return;
    if (info->audited) {
      // The service committed the row (code OK) with the call's write.
      if (status.ok()) return;
      // It must not end the call otherwise; if it did, the final status is
      // recorded too rather than lost.
      spdlog::error("audit: {} was audited OK in its transaction but ended {}", method_,
                    GrpcCodeName(status.error_code()));
    }
    AuditEvent event;
    event.who = info->who;
    event.method = method_;
    event.request_id = request_id_;
    event.code = static_cast<int>(status.error_code());
    event.reason = status.ok() ? "" : ReasonOf(status);
    event.peer = context_ != nullptr ? CallerPeer(*context_) : "";
    audit_(event);
  }

  const grpc::ServerContextBase* context_;
  std::string method_;
  const MethodRule* rule_;
  const AuditSink& audit_;
  std::string request_id_;
};

}  // namespace

CallRegistry& CallRegistry::Default() {
  static auto* const registry = new CallRegistry();
  return *registry;
}

void CallRegistry::Begin(const grpc::ServerContextBase* context, std::string method,
                         bool in_transaction_audit) {
  if (context == nullptr) return;
  CallInfo info;
  info.rule = FindMethodRule(method);
  info.method = std::move(method);
  info.in_transaction_audit = in_transaction_audit;
  std::lock_guard<std::mutex> lock(State().mutex);
  State().calls[context] = std::move(info);
}

void CallRegistry::End(const grpc::ServerContextBase* context) {
  std::lock_guard<std::mutex> lock(State().mutex);
  State().calls.erase(context);
}

std::optional<CallInfo> CallRegistry::Find(const grpc::ServerContextBase* context) const {
  std::lock_guard<std::mutex> lock(State().mutex);
  auto it = State().calls.find(context);
  if (it == State().calls.end()) return std::nullopt;
  return it->second;
}

void CallRegistry::SetPrincipal(const grpc::ServerContextBase* context,
                                const store::Principal& who) {
  std::lock_guard<std::mutex> lock(State().mutex);
  auto it = State().calls.find(context);
  if (it != State().calls.end()) it->second.who = who;
}

void CallRegistry::MarkAudited(const grpc::ServerContextBase* context) {
  std::lock_guard<std::mutex> lock(State().mutex);
  auto it = State().calls.find(context);
  if (it != State().calls.end()) it->second.audited = true;
}

std::optional<store::AuditRow> InTransactionAuditRow(const grpc::ServerContextBase* context,
                                                     const google::protobuf::Message& request,
                                                     absl::Time at) {
  auto info = CallRegistry::Default().Find(context);
  if (!info.has_value() || !info->in_transaction_audit || !info->who.has_value() ||
      info->rule == nullptr || info->rule->access != Access::kWrite) {
    return std::nullopt;
  }
  // What Record() below writes for a call that ends OK.
  AuditEvent event;
  event.who = info->who;
  event.method = info->method;
  event.request_id = RequestIdOf(request);
  event.code = static_cast<int>(grpc::StatusCode::OK);
  event.peer = CallerPeer(*context);
  return AuditRowOf(event, at);
}

store::AuditRow AuditRowOf(const AuditEvent& event, absl::Time at) {
  store::AuditRow row;
  row.at = at;
  row.tenant_id = event.who->tenant_id;
  row.user_id = event.who->user_id;
  row.user_email = event.who->user_email;
  row.api_key_id = event.who->api_key_id;
  row.method = event.method;
  row.request_id = event.request_id;
  row.code = GrpcCodeName(static_cast<grpc::StatusCode>(event.code));
  row.reason = event.reason;
  row.peer = event.peer;
  return row;
}

void ReportAuditFailure(const store::AuditRow& row, const absl::Status& status) {
  metrics::Registry::Default().IncrementCounter(
      "sv_audit_write_failures_total", "Audit entries that could not be written.", {});
  spdlog::error("audit: cannot record {} tenant={} request_id={}: {}", row.method, row.tenant_id,
                row.request_id, status.ToString());
}

AuditSink DatabaseAuditSink(store::Database& db, const Clock& clock) {
  return [&db, &clock](const AuditEvent& event) {
    store::AuditRow row = AuditRowOf(event, clock.Now());
    absl::Status status = store::SecurityStore(db).AppendAudit(row);
    if (!status.ok()) ReportAuditFailure(row, status);
  };
}

grpc::experimental::Interceptor* AuthzInterceptorFactory::CreateServerInterceptor(
    grpc::experimental::ServerRpcInfo* info) {
  return new AuthzInterceptor(info, audit_, in_transaction_audit_);
}

}  // namespace sv::api
