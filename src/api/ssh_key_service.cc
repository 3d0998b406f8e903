// SshKeyService: the tenant's SSH public keys, which the node agents keep in
// every running instance's /root/.ssh/authorized_keys (docs/security.md,
// "SSH keys"). Who may call what is in authz_table.cc.
#include "absl/strings/str_cat.h"
#include "api/auth.h"
#include "api/internal/service_util.h"
#include "api/services.h"
#include "api/ssh_public_key.h"
#include "api/validation.h"
#include "common/ids.h"
#include "common/status.h"
#include "spdlog/spdlog.h"
#include "store/ssh_key_store.h"
#include "sv/v1/security.grpc.pb.h"

namespace sv::api::internal {
namespace {

void ToProto(const store::SshKeyRow& k, v1::SshKey* out) {
  out->set_id(k.id);
  out->set_name(k.name);
  out->set_public_key(k.public_key);
  out->set_fingerprint(k.fingerprint);
  out->set_created_by(k.created_by);
  *out->mutable_create_time() = internal::ToProto(k.created_at);
}

class SshKeyServiceImpl final : public v1::SshKeyService::Service {
 public:
  SshKeyServiceImpl(const ApiDependencies& deps, const Authenticator& auth)
      : deps_(deps), auth_(auth), store_(deps.store->database()) {}

  grpc::Status AddSshKey(grpc::ServerContext* context, const v1::AddSshKeyRequest* request,
                         v1::SshKey* response) override {
    return Serve(auth_, *context, "AddSshKey", [&](const store::Principal& who) -> absl::Status {
      SV_ASSIGN_OR_RETURN(SshPublicKey key, ParseSshPublicKey(request->public_key()));
      std::string name = request->name().empty() ? DefaultSshKeyName(key) : request->name();
      if (!ValidSshKeyName(name)) {
        return Error(absl::StatusCode::kInvalidArgument, "INVALID_NAME",
                     "name must be 1-63 lower-case letters, digits and inner dashes");
      }
      SV_ASSIGN_OR_RETURN(
          store::SshKeyRow row,
          store_.Add({NewId("ssh"), who.tenant_id, std::move(name), key.line, key.fingerprint,
                      who.user_id, deps_.clock->Now()}));
      spdlog::info("api: ssh key {} ({}) of {} added by {}", row.id, row.fingerprint,
                   who.tenant_id, who.user_id);
      ToProto(row, response);
      return absl::OkStatus();
    });
  }

  grpc::Status ListSshKeys(grpc::ServerContext* context, const v1::ListSshKeysRequest*,
                           v1::ListSshKeysResponse* response) override {
    return Serve(auth_, *context, "ListSshKeys", [&](const store::Principal& who) -> absl::Status {
      SV_ASSIGN_OR_RETURN(auto keys, store_.List(who.tenant_id));
      for (const auto& k : keys) ToProto(k, response->add_keys());
      return absl::OkStatus();
    });
  }

  grpc::Status DeleteSshKey(grpc::ServerContext* context, const v1::DeleteSshKeyRequest* request,
                            v1::DeleteSshKeyResponse*) override {
    return Serve(auth_, *context, "DeleteSshKey", [&](const store::Principal& who) -> absl::Status {
      if (request->id().empty()) {
        return Error(absl::StatusCode::kInvalidArgument, "MISSING_ID", "id is required");
      }
      if (!LooksLikeId(request->id(), "ssh")) {
        return Error(absl::StatusCode::kNotFound, "SSH_KEY_NOT_FOUND",
                     absl::StrCat("SSH key ", request->id().substr(0, 64), " not found"));
      }
      SV_ASSIGN_OR_RETURN(store::SshKeyRow row, store_.Delete(who.tenant_id, request->id()));
      spdlog::info("api: ssh key {} ({}) of {} deleted by {}", row.id, row.fingerprint,
                   who.tenant_id, who.user_id);
      return absl::OkStatus();
    });
  }

 private:
  ApiDependencies deps_;
  const Authenticator& auth_;
  store::SshKeyStore store_;
};

}  // namespace

std::unique_ptr<grpc::Service> NewSshKeyService(const ApiDependencies& deps,
                                                const Authenticator& auth) {
  return std::make_unique<SshKeyServiceImpl>(deps, auth);
}

}  // namespace sv::api::internal
