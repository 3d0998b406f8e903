// ApiKeyService, UserService, AuditService and BudgetService: the tenancy
// and security API (docs/security.md). Who may call what is decided before
// these run, by the Authenticator and the table in authz_table.cc; here only
// the data-dependent checks remain (whose key, which tenant).
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "api/api_keys.h"
#include "api/authz.h"
#include "api/internal/security_util.h"
#include "api/internal/service_util.h"
#include "api/validation.h"
#include "billing/billing.h"
#include "common/status.h"
#include "spdlog/spdlog.h"
#include "store/security_store.h"
#include "sv/v1/security.grpc.pb.h"

namespace sv::api::internal {
namespace {

constexpr int64_t kKeyTtlSecondsMin = 60;
constexpr int64_t kKeyTtlSecondsMax = 2 * 366 * 24 * 3600;
constexpr int64_t kRotateOverlapSecondsMax = 24 * 3600;
constexpr int kAuditPageSizeMax = 1000;
constexpr int64_t kSpendCapMicrosMax = 1'000'000'000'000'000LL;  // 1e9 CNY.

v1::TenantRole ToProto(store::TenantRole role) {
  switch (role) {
    case store::TenantRole::kViewer: return v1::TENANT_ROLE_VIEWER;
    case store::TenantRole::kBilling: return v1::TENANT_ROLE_BILLING;
    case store::TenantRole::kMember: return v1::TENANT_ROLE_MEMBER;
    case store::TenantRole::kOwner: return v1::TENANT_ROLE_OWNER;
  }
  return v1::TENANT_ROLE_UNSPECIFIED;
}

absl::StatusOr<store::TenantRole> FromProto(v1::TenantRole role) {
  switch (role) {
    case v1::TENANT_ROLE_VIEWER: return store::TenantRole::kViewer;
    case v1::TENANT_ROLE_BILLING: return store::TenantRole::kBilling;
    case v1::TENANT_ROLE_MEMBER: return store::TenantRole::kMember;
    case v1::TENANT_ROLE_OWNER: return store::TenantRole::kOwner;
    default:
      return Error(absl::StatusCode::kInvalidArgument, "INVALID_ROLE",
                   "role must be viewer, billing, member or owner");
  }
}

void ToProto(const store::ApiKeyRow& k, v1::ApiKey* out) {
  out->set_id(k.id);
  out->set_user_id(k.user_id);
  out->set_user_email(k.user_email);
  out->set_name(k.name);
  out->set_scope(k.scope == store::KeyScope::kReadOnly ? v1::KEY_SCOPE_READ_ONLY
                                                       : v1::KEY_SCOPE_FULL);
  *out->mutable_create_time() = internal::ToProto(k.created_at);
  if (k.expires_at) *out->mutable_expire_time() = internal::ToProto(*k.expires_at);
  if (k.revoked_at) *out->mutable_revoke_time() = internal::ToProto(*k.revoked_at);
  out->set_replaced_by(k.replaced_by);
}

void ToProto(const store::MemberRow& m, v1::User* out) {
  out->set_id(m.user_id);
  out->set_email(m.email);
  out->set_role(ToProto(m.role));
  *out->mutable_create_time() = internal::ToProto(m.created_at);
}

absl::Status CheckKeyName(const std::string& name) {
  if (name.size() > 63 || !CheckFreeText("name", name, "INVALID_KEY_NAME", false).ok()) {
    return Error(absl::StatusCode::kInvalidArgument, "INVALID_KEY_NAME",
                 "name must have at most 63 characters and no control characters");
  }
  return absl::OkStatus();
}

// A malformed id can name nothing: answer as for an unknown one.
absl::Status CheckId(const std::string& id, const char* prefix, const char* reason,
                     const char* what) {
  if (id.empty()) {
    return Error(absl::StatusCode::kInvalidArgument, "MISSING_ID", "id is required");
  }
  if (!LooksLikeId(id, prefix)) {
    return Error(absl::StatusCode::kNotFound, reason,
                 absl::StrCat(what, " ", id.substr(0, 64), " not found"));
  }
  return absl::OkStatus();
}

// Runs `body` for an authorized caller and converts the outcome.
class ApiKeyServiceImpl final : public v1::ApiKeyService::Service {
 public:
  ApiKeyServiceImpl(const ApiDependencies& deps, const Authenticator& auth)
      : deps_(deps), auth_(auth), store_(deps.store->database()) {}

  grpc::Status CreateApiKey(grpc::ServerContext* context, const v1::CreateApiKeyRequest* request,
                            v1::CreateApiKeyResponse* response) override {
    return Serve(auth_, *context, "CreateApiKey", [&](const store::Principal& who) {
      SV_RETURN_IF_ERROR(CheckKeyName(request->name()));
      const int64_t ttl = request->ttl_seconds();
      if (ttl != 0 && (ttl < kKeyTtlSecondsMin || ttl > kKeyTtlSecondsMax)) {
        return Error(absl::StatusCode::kInvalidArgument, "INVALID_TTL",
                     "ttl_seconds must be 0 (no expiry) or 60 .. 63,244,800");
      }
      if (request->scope() != v1::KEY_SCOPE_UNSPECIFIED &&
          request->scope() != v1::KEY_SCOPE_FULL &&
          request->scope() != v1::KEY_SCOPE_READ_ONLY) {
        return Error(absl::StatusCode::kInvalidArgument, "INVALID_SCOPE",
                     "scope must be full or read_only");
      }
      GeneratedKey key = NewApiKey();
      store::NewApiKeyRow row{key.key_id, who.user_id, who.tenant_id, key.salt,
                              key.secret_hash, request->name(),
                              request->scope() == v1::KEY_SCOPE_READ_ONLY
                                  ? store::KeyScope::kReadOnly
                                  : store::KeyScope::kFull,
                              std::nullopt};
      const absl::Time now = deps_.clock->Now();
      if (ttl > 0) row.expires_at = now + absl::Seconds(ttl);
      SV_RETURN_IF_ERROR(store_.CreateApiKey(row, now));
      return Reply(who, key, response);
    });
  }

  grpc::Status ListApiKeys(grpc::ServerContext* context, const v1::ListApiKeysRequest* request,
                           v1::ListApiKeysResponse* response) override {
    return Serve(auth_, *context, "ListApiKeys", [&](const store::Principal& who) {
      if (request->all_users() && !HasPermission(who, Permission::kKeysManage)) {
        return Error(absl::StatusCode::kPermissionDenied, "PERMISSION_DENIED",
                     "listing every user's keys needs the permission keys.manage");
      }
      SV_ASSIGN_OR_RETURN(auto keys,
                          store_.ListApiKeys(who.tenant_id,
                                             request->all_users() ? std::string() : who.user_id,
                                             who.platform_admin()));
      for (const auto& k : keys) ToProto(k, response->add_keys());
      return absl::OkStatus();
    });
  }

  grpc::Status RevokeApiKey(grpc::ServerContext* context, const v1::RevokeApiKeyRequest* request,
                            v1::ApiKey* response) override {
    return Serve(auth_, *context, "RevokeApiKey", [&](const store::Principal& who) {
      SV_RETURN_IF_ERROR(CheckId(request->id(), "key", "API_KEY_NOT_FOUND", "API key"));
      // Another user's key of the tenant reads as unknown unless the caller
      // may manage keys.
      const std::string owner = HasPermission(who, Permission::kKeysManage) ? "" : who.user_id;
      SV_ASSIGN_OR_RETURN(auto key,
                          store_.RevokeApiKey(who.tenant_id, owner, who.platform_admin(),
                                              request->id(), deps_.clock->Now()));
      // Every replica drops its cached lookup on the revocation signal;
      // this one at once, so its next call already sees the change.
      auth_.ForgetCachedCredentials();
      ToProto(key, response);
      spdlog::info("api: revoked API key {} tenant={}", key.id, who.tenant_id);
      return absl::OkStatus();
    });
  }

  grpc::Status RotateApiKey(grpc::ServerContext* context, const v1::RotateApiKeyRequest* request,
                            v1::CreateApiKeyResponse* response) override {
    return Serve(auth_, *context, "RotateApiKey", [&](const store::Principal& who) {
      SV_RETURN_IF_ERROR(CheckId(request->id(), "key", "API_KEY_NOT_FOUND", "API key"));
      if (request->overlap_seconds() < 0 ||
          request->overlap_seconds() > kRotateOverlapSecondsMax) {
        return Error(absl::StatusCode::kInvalidArgument, "INVALID_OVERLAP",
                     "overlap_seconds must be 0 .. 86,400");
      }
      GeneratedKey key = NewApiKey();
      store::NewApiKeyRow row{key.key_id, "", "", key.salt, key.secret_hash, "",
                              store::KeyScope::kFull, std::nullopt};
      const std::string owner = HasPermission(who, Permission::kKeysManage) ? "" : who.user_id;
      SV_ASSIGN_OR_RETURN(auto rotated,
                          store_.RotateApiKey(who.tenant_id, owner, who.platform_admin(),
                                              request->id(), row,
                                              absl::Seconds(request->overlap_seconds()),
                                              deps_.clock->Now()));
      auth_.ForgetCachedCredentials();
      ToProto(rotated, response->mutable_key());
      response->set_secret(key.plaintext);
      spdlog::info("api: rotated API key {} to {} tenant={}", request->id(), rotated.id,
                   who.tenant_id);
      return absl::OkStatus();
    });
  }

 private:
  absl::Status Reply(const store::Principal& who, const GeneratedKey& key,
                     v1::CreateApiKeyResponse* response) {
    SV_ASSIGN_OR_RETURN(auto keys, store_.ListApiKeys(who.tenant_id, who.user_id, false));
    for (const auto& k : keys) {
      if (k.id == key.key_id) ToProto(k, response->mutable_key());
    }
    response->set_secret(key.plaintext);
    spdlog::info("api: created API key {} tenant={}", key.key_id, who.tenant_id);
    return absl::OkStatus();
  }

  ApiDependencies deps_;
  const Authenticator& auth_;
  store::SecurityStore store_;
};

class UserServiceImpl final : public v1::UserService::Service {
 public:
  UserServiceImpl(const ApiDependencies& deps, const Authenticator& auth)
      : deps_(deps), auth_(auth), store_(deps.store->database()) {}

  grpc::Status ListUsers(grpc::ServerContext* context, const v1::ListUsersRequest*,
                         v1::ListUsersResponse* response) override {
    return Serve(auth_, *context, "ListUsers", [&](const store::Principal& who) {
      SV_ASSIGN_OR_RETURN(auto members, store_.ListMembers(who.tenant_id));
      for (const auto& m : members) ToProto(m, response->add_users());
      return absl::OkStatus();
    });
  }

  grpc::Status AddUser(grpc::ServerContext* context, const v1::AddUserRequest* request,
                       v1::AddUserResponse* response) override {
    return Serve(auth_, *context, "AddUser", [&](const store::Principal& who) {
      SV_RETURN_IF_ERROR(ValidateEmail("email", request->email()));
      SV_ASSIGN_OR_RETURN(auto role, FromProto(request->role()));
      GeneratedKey key = NewApiKey();
      store::NewApiKeyRow row{key.key_id, "", "", key.salt, key.secret_hash, "initial",
                              store::KeyScope::kFull, std::nullopt};
      const absl::Time now = deps_.clock->Now();
      SV_ASSIGN_OR_RETURN(auto member,
                          store_.AddMember(who.tenant_id, request->email(), role, row, now));
      GrantTrialAtSignup(deps_, member.user_id);
      ToProto(member, response->mutable_user());
      SV_ASSIGN_OR_RETURN(auto keys, store_.ListApiKeys(who.tenant_id, member.user_id, false));
      for (const auto& k : keys) {
        if (k.id == key.key_id) ToProto(k, response->mutable_first_key()->mutable_key());
      }
      response->mutable_first_key()->set_secret(key.plaintext);
      spdlog::info("api: added user {} as {} tenant={}", member.user_id,
                   store::TenantRoleName(role), who.tenant_id);
      return absl::OkStatus();
    });
  }

  grpc::Status SetUserRole(grpc::ServerContext* context, const v1::SetUserRoleRequest* request,
                           v1::User* response) override {
    return Serve(auth_, *context, "SetUserRole", [&](const store::Principal& who) {
      SV_RETURN_IF_ERROR(CheckId(request->user_id(), "usr", "USER_NOT_FOUND", "user"));
      SV_ASSIGN_OR_RETURN(auto role, FromProto(request->role()));
      SV_ASSIGN_OR_RETURN(auto member,
                          store_.SetMemberRole(who.tenant_id, request->user_id(), role));
      auth_.ForgetCachedCredentials();
      ToProto(member, response);
      return absl::OkStatus();
    });
  }

  grpc::Status RemoveUser(grpc::ServerContext* context, const v1::RemoveUserRequest* request,
                          v1::RemoveUserResponse*) override {
    return Serve(auth_, *context, "RemoveUser", [&](const store::Principal& who) {
      SV_RETURN_IF_ERROR(CheckId(request->user_id(), "usr", "USER_NOT_FOUND", "user"));
      SV_RETURN_IF_ERROR(
          store_.RemoveMember(who.tenant_id, request->user_id(), deps_.clock->Now()));
      auth_.ForgetCachedCredentials();
      return absl::OkStatus();
    });
  }

 private:
  ApiDependencies deps_;
  const Authenticator& auth_;
  store::SecurityStore store_;
};

class AuditServiceImpl final : public v1::AuditService::Service {
 public:
  AuditServiceImpl(const ApiDependencies& deps, const Authenticator& auth)
      : auth_(auth), store_(deps.store->database()) {}

  grpc::Status ListAuditEntries(grpc::ServerContext* context,
                                const v1::ListAuditEntriesRequest* request,
                                v1::ListAuditEntriesResponse* response) override {
    return Serve(auth_, *context, "ListAuditEntries", [&](const store::Principal& who) {
      store::AuditFilter filter;
      filter.tenant_id = who.tenant_id;
      if (HasPermission(who, Permission::kAdminAudit)) {
        filter.tenant_id = request->tenant_id();
      } else if (!request->tenant_id().empty() && request->tenant_id() != who.tenant_id) {
        // Another tenant's log reads as empty-handed as an unknown tenant.
        return Error(absl::StatusCode::kNotFound, "TENANT_NOT_FOUND", "tenant not found");
      }
      if (request->page_size() < 0 || request->page_size() > kAuditPageSizeMax) {
        return Error(absl::StatusCode::kInvalidArgument, "INVALID_PAGE_SIZE",
                     "page_size must be 0 .. 1000");
      }
      filter.limit = request->page_size() == 0 ? 100 : request->page_size();
      if (!request->page_token().empty() &&
          (!absl::SimpleAtoi(request->page_token(), &filter.before_id) ||
           filter.before_id <= 0)) {
        return Error(absl::StatusCode::kInvalidArgument, "INVALID_PAGE_TOKEN",
                     "page_token is not one this list returned");
      }
      const int limit = filter.limit;
      filter.limit = limit + 1;
      SV_ASSIGN_OR_RETURN(auto rows, store_.ListAudit(filter));
      const bool more = static_cast<int>(rows.size()) > limit;
      if (more) rows.resize(limit);
      for (const auto& r : rows) {
        auto* e = response->add_entries();
        e->set_id(r.id);
        *e->mutable_time() = internal::ToProto(r.at);
        e->set_tenant_id(r.tenant_id);
        e->set_user_id(r.user_id);
        e->set_user_email(r.user_email);
        e->set_api_key_id(r.api_key_id);
        e->set_method(r.method);
        e->set_request_id(r.request_id);
        e->set_code(r.code);
        e->set_reason(r.reason);
      }
      if (more) response->set_next_page_token(std::to_string(rows.back().id));
      return absl::OkStatus();
    });
  }

 private:
  const Authenticator& auth_;
  store::SecurityStore store_;
};

class BudgetServiceImpl final : public v1::BudgetService::Service {
 public:
  BudgetServiceImpl(const ApiDependencies& deps, const Authenticator& auth)
      : deps_(deps), auth_(auth), store_(deps.store->database()) {}

  grpc::Status GetSpendCap(grpc::ServerContext* context, const v1::GetSpendCapRequest* request,
                           v1::SpendCap* response) override {
    return Serve(auth_, *context, "GetSpendCap", [&](const store::Principal& who) {
      SV_ASSIGN_OR_RETURN(std::string tenant, TenantOf(who, request->tenant_id()));
      return Fill(tenant, response);
    });
  }

  grpc::Status SetSpendCap(grpc::ServerContext* context, const v1::SetSpendCapRequest* request,
                           v1::SpendCap* response) override {
    return Serve(auth_, *context, "SetSpendCap", [&](const store::Principal& who) {
      SV_ASSIGN_OR_RETURN(std::string tenant, TenantOf(who, request->cap().tenant_id()));
      const int64_t cap = request->cap().monthly_cap_micros();
      if (request->cap().enabled() && (cap < 0 || cap > kSpendCapMicrosMax)) {
        return Error(absl::StatusCode::kInvalidArgument, "INVALID_SPEND_CAP",
                     "monthly_cap_micros must be 0 .. 1e15");
      }
      SV_RETURN_IF_ERROR(store_.SetSpendCap(
          tenant, request->cap().enabled() ? std::optional<int64_t>(cap) : std::nullopt,
          deps_.clock->Now()));
      spdlog::info("api: spend cap of {} set to {} by {}", tenant,
                   request->cap().enabled() ? std::to_string(cap) : "none", who.user_id);
      return Fill(tenant, response);
    });
  }

 private:
  // The caller's tenant, or (platform admin only) the one named.
  absl::StatusOr<std::string> TenantOf(const store::Principal& who, const std::string& named) {
    if (named.empty() || named == who.tenant_id) return who.tenant_id;
    if (!who.platform_admin()) {
      return Error(absl::StatusCode::kNotFound, "TENANT_NOT_FOUND", "tenant not found");
    }
    return named;
  }

  absl::Status Fill(const std::string& tenant, v1::SpendCap* response) {
    SV_ASSIGN_OR_RETURN(auto cap, store_.GetSpendCap(tenant));
    SV_ASSIGN_OR_RETURN(int64_t spent,
                        store_.SpentSince(tenant, SpendCapMonthStart(deps_.clock->Now())));
    response->set_tenant_id(tenant);
    response->set_enabled(cap.has_value());
    response->set_monthly_cap_micros(cap.value_or(0));
    response->set_month_spent_micros(spent);
    return absl::OkStatus();
  }

  ApiDependencies deps_;
  const Authenticator& auth_;
  store::SecurityStore store_;
};

}  // namespace

absl::Time SpendCapMonthStart(absl::Time now) {
  // Asia/Shanghai has no daylight saving time: UTC+8 all year.
  const absl::TimeZone shanghai = absl::FixedTimeZone(8 * 3600);
  const absl::CivilSecond local = absl::ToCivilSecond(now, shanghai);
  return absl::FromCivil(absl::CivilMonth(local), shanghai);
}

absl::Status SpendCapRefusal(int64_t cap_micros, int64_t spent_micros) {
  return Error(absl::StatusCode::kResourceExhausted, "SPEND_CAP_REACHED",
               absl::StrCat("the tenant's monthly spend cap of ", billing::Yuan(cap_micros),
                            " is reached (", billing::Yuan(spent_micros),
                            " spent this month); raise or remove it to create instances or "
                            "volumes"));
}

std::unique_ptr<grpc::Service> NewApiKeyService(const ApiDependencies& deps,
                                                const Authenticator& auth) {
  return std::make_unique<ApiKeyServiceImpl>(deps, auth);
}
std::unique_ptr<grpc::Service> NewUserService(const ApiDependencies& deps,
                                              const Authenticator& auth) {
  return std::make_unique<UserServiceImpl>(deps, auth);
}
std::unique_ptr<grpc::Service> NewAuditService(const ApiDependencies& deps,
                                               const Authenticator& auth) {
  return std::make_unique<AuditServiceImpl>(deps, auth);
}
std::unique_ptr<grpc::Service> NewBudgetService(const ApiDependencies& deps,
                                                const Authenticator& auth) {
  return std::make_unique<BudgetServiceImpl>(deps, auth);
}

}  // namespace sv::api::internal
