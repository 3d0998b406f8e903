// WebhookService: the tenant's webhook, to which svd sends its notices
// (docs/notifications.md; the loop is api/webhooks.cc). Who may call what
// is in authz_table.cc.
#include "absl/strings/str_cat.h"
#include "api/auth.h"
#include "api/internal/security_util.h"
#include "api/internal/service_util.h"
#include "api/services.h"
#include "api/webhooks.h"
#include "common/ids.h"
#include "common/status.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"
#include "store/webhook_store.h"
#include "sv/v1/webhook.grpc.pb.h"

namespace sv::api::internal {
namespace {

void ToProto(const store::WebhookRow& w, v1::Webhook* out) {
  out->set_url(w.url);
  *out->mutable_create_time() = internal::ToProto(w.created_at);
  out->set_created_by(w.created_by);
  out->set_pending_count(w.pending);
  out->set_failed_attempts(w.attempts);
  out->set_last_error(w.last_error);
  if (w.last_attempt_at) *out->mutable_last_attempt_time() = internal::ToProto(*w.last_attempt_at);
  if (w.last_delivered_at) {
    *out->mutable_last_delivery_time() = internal::ToProto(*w.last_delivered_at);
  }
  if (w.next_attempt_at) *out->mutable_next_attempt_time() = internal::ToProto(*w.next_attempt_at);
  if (w.failing_since) *out->mutable_failing_since_time() = internal::ToProto(*w.failing_since);
  if (w.disabled_at) {
    out->set_disabled(true);
    *out->mutable_disable_time() = internal::ToProto(*w.disabled_at);
    out->set_disabled_reason(w.disabled_reason);
  }
}

class WebhookServiceImpl final : public v1::WebhookService::Service {
 public:
  WebhookServiceImpl(const ApiDependencies& deps, const Authenticator& auth)
      : deps_(deps), auth_(auth), store_(deps.store->database()) {}

  grpc::Status SetWebhook(grpc::ServerContext* context, const v1::SetWebhookRequest* request,
                          v1::Webhook* response) override {
    return Serve(auth_, *context, "SetWebhook", [&](const store::Principal& who) -> absl::Status {
      SV_ASSIGN_OR_RETURN(WebhookUrl url, ParseWebhookUrl(request->url()));
      SV_RETURN_IF_ERROR(CheckWebhookHost(url, deps_.webhooks.allow_private_addresses));
      const std::string secret = NewWebhookSecret();
      SV_ASSIGN_OR_RETURN(store::WebhookRow row,
                          store_.Set(who.tenant_id, request->url(), secret,
                                     who.user_email.empty() ? who.user_id : who.user_email,
                                     request->skip_backlog(), deps_.clock->Now()));
      spdlog::info("api: webhook of {} set by {} to {}://{}", who.tenant_id, who.user_id,
                   url.https ? "https" : "http", url.host);
      ToProto(row, response);
      response->set_secret(secret);  // Only here.
      return absl::OkStatus();
    });
  }

  grpc::Status GetWebhook(grpc::ServerContext* context, const v1::GetWebhookRequest*,
                          v1::Webhook* response) override {
    return Serve(auth_, *context, "GetWebhook", [&](const store::Principal& who) -> absl::Status {
      SV_ASSIGN_OR_RETURN(store::WebhookRow row, store_.Get(who.tenant_id));
      ToProto(row, response);
      return absl::OkStatus();
    });
  }

  grpc::Status DeleteWebhook(grpc::ServerContext* context, const v1::DeleteWebhookRequest*,
                             v1::DeleteWebhookResponse* response) override {
    return Serve(auth_, *context, "DeleteWebhook", [&](const store::Principal& who) -> absl::Status {
      SV_ASSIGN_OR_RETURN(bool deleted, store_.Delete(who.tenant_id));
      response->set_deleted(deleted);
      if (deleted) spdlog::info("api: webhook of {} deleted by {}", who.tenant_id, who.user_id);
      return absl::OkStatus();
    });
  }

  grpc::Status TestWebhook(grpc::ServerContext* context, const v1::TestWebhookRequest*,
                           v1::TestWebhookResponse* response) override {
    return Serve(auth_, *context, "TestWebhook", [&](const store::Principal& who) -> absl::Status {
      SV_ASSIGN_OR_RETURN(store::WebhookRow row, store_.Get(who.tenant_id));
      const absl::Time now = deps_.clock->Now();
      const std::string event_id = NewId("ping");
      const nlohmann::json body = {
          {"id", event_id},
          {"tenantId", who.tenant_id},
          {"kind", "ping"},
          {"message", "A test of the webhook; no notice is behind it."},
          {"createTime", absl::FormatTime("%Y-%m-%dT%H:%M:%E*SZ", now, absl::UTCTimeZone())}};
      WebhookAttempt attempt =
          PostWebhook(row.url, row.secret, event_id, body.dump(), now, deps_.webhooks);
      response->set_http_status(attempt.http_status);
      response->set_error(attempt.error);
      return absl::OkStatus();
    });
  }

 private:
  ApiDependencies deps_;
  const Authenticator& auth_;
  store::WebhookStore store_;
};

}  // namespace

std::unique_ptr<grpc::Service> NewWebhookService(const ApiDependencies& deps,
                                                 const Authenticator& auth) {
  return std::make_unique<WebhookServiceImpl>(deps, auth);
}

}  // namespace sv::api::internal
