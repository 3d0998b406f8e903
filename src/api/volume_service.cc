// VolumeService: cloud disks (docs/storage.md).
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "api/internal/instance_extras.h"
#include "api/internal/security_util.h"
#include "api/internal/service_util.h"
#include "api/validation.h"
#include "billing/billing.h"
#include "common/ids.h"
#include "common/status.h"
#include "spdlog/spdlog.h"
#include "store/volume_store.h"
#include "sv/v1/volume.grpc.pb.h"

namespace sv::api::internal {
namespace {

absl::Status CheckVolumeId(const std::string& id) {
  if (id.empty()) {
    return Error(absl::StatusCode::kInvalidArgument, "MISSING_VOLUME_ID", "a volume id is needed");
  }
  if (!LooksLikeId(id, "vol")) {
    return Error(absl::StatusCode::kNotFound, "VOLUME_NOT_FOUND",
                 absl::StrCat("volume ", id, " not found"));
  }
  return absl::OkStatus();
}

// `grace`: after how long unpaid storage deletes the volume (zero: never).
void ToProto(const store::VolumeRecord& r, absl::Duration grace, v1::Volume* out) {
  out->set_id(r.id);
  out->set_name(r.spec.name);
  out->set_size_gib(r.spec.size_gib);
  out->set_kind(r.spec.kind == store::VolumeKind::kNodeLocal ? v1::NODE_LOCAL : v1::NETWORK);
  out->set_read_many(r.spec.read_many);
  out->set_node_id(r.spec.node_id);
  out->set_tenant_id(r.tenant_id);
  out->set_request_id(r.request_id);
  out->set_move_to_instance_id(r.move_to_instance_id);
  *out->mutable_create_time() = internal::ToProto(r.created_at);
  if (r.deleted_at) *out->mutable_delete_time() = internal::ToProto(*r.deleted_at);
  if (r.unpaid_since && !r.deleted_at) {
    *out->mutable_unpaid_since_time() = internal::ToProto(*r.unpaid_since);
    if (grace > absl::ZeroDuration()) {
      *out->mutable_unpaid_delete_time() = internal::ToProto(*r.unpaid_since + grace);
    }
  }
  bool attached = false, attaching = false, detaching = false;
  for (const auto& a : r.attachments) {
    auto* o = out->add_attachments();
    o->set_instance_id(a.instance_id);
    o->set_read_only(a.read_only);
    o->set_mount_path(a.mount_path);
    o->set_reason(a.reason);
    *o->mutable_request_time() = internal::ToProto(a.requested_at);
    if (a.confirmed_at) *o->mutable_confirm_time() = internal::ToProto(*a.confirmed_at);
    switch (a.state) {
      case store::AttachmentState::kAttached:
        o->set_state(v1::ATTACHMENT_ATTACHED);
        attached = true;
        break;
      case store::AttachmentState::kAttaching:
        o->set_state(v1::ATTACHMENT_ATTACHING);
        attaching = true;
        break;
      case store::AttachmentState::kDetaching:
        o->set_state(v1::ATTACHMENT_DETACHING);
        detaching = true;
        break;
    }
  }
  out->set_state(r.deleted_at ? v1::VOLUME_DELETED
                 : attached   ? v1::ATTACHED
                 : attaching  ? v1::ATTACHING
                 : detaching  ? v1::DETACHING
                              : v1::AVAILABLE);
}

std::string VolumeFingerprint(const store::VolumeSpec& s) {
  return Sha256Hex(absl::StrCat("v1\n", s.name, "\n", s.size_gib, "\n",
                                s.kind == store::VolumeKind::kNodeLocal ? "node_local" : "network",
                                "\n", s.read_many, "\n", s.node_id));
}

std::string EncodeToken(const store::VolumeListCursor& c, bool show_deleted) {
  return absl::WebSafeBase64Escape(
      absl::StrCat("v1|", show_deleted ? 1 : 0, "|", c.created_at_micros, "|", c.id));
}

absl::StatusOr<std::optional<store::VolumeListCursor>> DecodeToken(const std::string& token,
                                                                   bool show_deleted) {
  if (token.empty()) return std::nullopt;
  std::string raw;
  std::vector<std::string> parts;
  if (absl::WebSafeBase64Unescape(token, &raw)) parts = absl::StrSplit(raw, '|');
  store::VolumeListCursor c;
  // The id and time are what this list returned: forged bytes that are not
  // text, or a time PostgreSQL cannot hold, failed in the database
  // (INTERNAL).
  if (parts.size() != 4 || parts[0] != "v1" || parts[1] != (show_deleted ? "1" : "0") ||
      !absl::SimpleAtoi(parts[2], &c.created_at_micros) ||
      c.created_at_micros / 1'000'000 < kTimestampSecondsMin ||
      c.created_at_micros / 1'000'000 > kTimestampSecondsMax || !LooksLikeId(parts[3], "vol")) {
    return Error(absl::StatusCode::kInvalidArgument, "INVALID_PAGE_TOKEN",
                 "page_token is not from this list");
  }
  c.id = parts[3];
  return c;
}

class VolumeServiceImpl final : public v1::VolumeService::Service {
 public:
  VolumeServiceImpl(const ApiDependencies& deps, const Authenticator& auth)
      : deps_(deps), auth_(auth), volumes_(deps.store->database()) {}

  grpc::Status CreateVolume(grpc::ServerContext* context, const v1::CreateVolumeRequest* request,
                            v1::Volume* response) override {
    auto who = auth_.Authenticate(*context);
    if (!who.ok()) return Finish("CreateVolume", nullptr, request->request_id(), who.status());
    return Finish("CreateVolume", &*who, request->request_id(),
                  Create(*who, *request, response));
  }

  grpc::Status GetVolume(grpc::ServerContext* context, const v1::GetVolumeRequest* request,
                         v1::Volume* response) override {
    auto who = auth_.Authenticate(*context);
    if (!who.ok()) return Finish("GetVolume", nullptr, "", who.status());
    absl::Status status = CheckVolumeId(request->id());
    if (status.ok()) {
      auto v = volumes_.Get(who->tenant_id, request->id());
      status = v.status();
      if (v.ok()) ToProto(*v, Grace(), response);
    }
    return Finish("GetVolume", &*who, "", status);
  }

  grpc::Status ListVolumes(grpc::ServerContext* context, const v1::ListVolumesRequest* request,
                           v1::ListVolumesResponse* response) override {
    auto who = auth_.Authenticate(*context);
    if (!who.ok()) return Finish("ListVolumes", nullptr, "", who.status());
    return Finish("ListVolumes", &*who, "", List(*who, *request, response));
  }

  grpc::Status DeleteVolume(grpc::ServerContext* context, const v1::DeleteVolumeRequest* request,
                            v1::Volume* response) override {
    auto who = auth_.Authenticate(*context);
    if (!who.ok()) return Finish("DeleteVolume", nullptr, "", who.status());
    absl::Status status = CheckVolumeId(request->id());
    if (status.ok()) {
      auto v = volumes_.Delete(who->tenant_id, request->id(), deps_.clock->Now());
      status = v.status();
      if (v.ok()) {
        ToProto(*v, Grace(), response);
        spdlog::info("api: deleted volume {} tenant={}", v->id, who->tenant_id);
      }
    }
    return Finish("DeleteVolume", &*who, "", status);
  }

  grpc::Status AttachVolume(grpc::ServerContext* context, const v1::AttachVolumeRequest* request,
                            v1::Volume* response) override {
    auto who = auth_.Authenticate(*context);
    if (!who.ok()) return Finish("AttachVolume", nullptr, "", who.status());
    absl::Status status = CheckVolumeId(request->volume_id());
    if (status.ok()) status = CheckInstanceId(request->instance_id());
    if (status.ok()) {
      auto v = volumes_.Attach(who->tenant_id, request->volume_id(), request->instance_id(),
                               request->read_only(), request->mount_path(), deps_.clock->Now());
      status = v.status();
      if (v.ok()) {
        ToProto(*v, Grace(), response);
        spdlog::info("api: attach volume {} to {} tenant={}", v->id, request->instance_id(),
                     who->tenant_id);
      }
    }
    return Finish("AttachVolume", &*who, "", status);
  }

  grpc::Status DetachVolume(grpc::ServerContext* context, const v1::DetachVolumeRequest* request,
                            v1::Volume* response) override {
    auto who = auth_.Authenticate(*context);
    if (!who.ok()) return Finish("DetachVolume", nullptr, "", who.status());
    absl::Status status = CheckVolumeId(request->volume_id());
    if (status.ok()) status = CheckInstanceId(request->instance_id());
    if (status.ok()) {
      auto v = volumes_.Detach(who->tenant_id, request->volume_id(), request->instance_id(),
                               deps_.clock->Now());
      status = v.status();
      if (v.ok()) ToProto(*v, Grace(), response);
    }
    return Finish("DetachVolume", &*who, "", status);
  }

  grpc::Status MoveVolume(grpc::ServerContext* context, const v1::MoveVolumeRequest* request,
                          v1::Volume* response) override {
    auto who = auth_.Authenticate(*context);
    if (!who.ok()) return Finish("MoveVolume", nullptr, "", who.status());
    absl::Status status = CheckVolumeId(request->volume_id());
    if (status.ok()) status = CheckInstanceId(request->to_instance_id());
    if (status.ok()) {
      auto v = volumes_.Move(who->tenant_id, request->volume_id(), request->to_instance_id(),
                             request->mount_path(), deps_.clock->Now());
      status = v.status();
      if (v.ok()) ToProto(*v, Grace(), response);
    }
    return Finish("MoveVolume", &*who, "", status);
  }

 private:
  absl::Duration Grace() const {
    return deps_.billing != nullptr ? deps_.billing->options().unpaid_storage_grace
                                    : absl::ZeroDuration();
  }

  absl::Status Create(const store::Principal& who, const v1::CreateVolumeRequest& request,
                      v1::Volume* response) {
    const v1::Volume& in = request.volume();
    store::VolumeSpec spec;
    spec.name = in.name();
    if (!spec.name.empty()) SV_RETURN_IF_ERROR(ValidateName("name", spec.name));
    if (in.size_gib() < 1 || in.size_gib() > store::kVolumeSizeGibMax) {
      return Error(absl::StatusCode::kInvalidArgument, "INVALID_SIZE",
                   absl::StrCat("size_gib must be 1 to ", store::kVolumeSizeGibMax));
    }
    spec.size_gib = in.size_gib();
    spec.kind = in.kind() == v1::NODE_LOCAL ? store::VolumeKind::kNodeLocal
                                            : store::VolumeKind::kNetwork;
    if (in.kind() != v1::NODE_LOCAL && in.kind() != v1::NETWORK &&
        in.kind() != v1::VOLUME_KIND_UNSPECIFIED) {
      return Error(absl::StatusCode::kInvalidArgument, "INVALID_KIND",
                   "kind must be NODE_LOCAL or NETWORK");
    }
    spec.read_many = in.read_many();
    spec.node_id = in.node_id();
    if (!spec.node_id.empty() && spec.kind != store::VolumeKind::kNodeLocal) {
      return Error(absl::StatusCode::kInvalidArgument, "NODE_FOR_NETWORK_VOLUME",
                   "node_id is only for NODE_LOCAL volumes");
    }
    if (spec.node_id.size() > 128) {
      return Error(absl::StatusCode::kInvalidArgument, "UNKNOWN_NODE", "node_id is too long");
    }
    std::string request_id = request.request_id();
    if (request_id.empty()) {
      request_id = NewUuid();
    } else {
      SV_RETURN_IF_ERROR(ValidateRequestId(request_id));
    }
    // The instance create's gate holds here too: credit for its first
    // minutes, and the monthly spend cap.
    const absl::Time now = deps_.clock->Now();
    store::CreateGate gate;
    if (deps_.billing != nullptr) deps_.billing->FillCreateGate(who.user_id, now, &gate);
    gate.spend_cap_since_minute = absl::ToUnixSeconds(SpendCapMonthStart(now)) / 60;
    SV_ASSIGN_OR_RETURN(store::VolumeCreateOutcome outcome,
                        volumes_.Create(who.tenant_id, spec, request_id,
                                        VolumeFingerprint(spec), now, gate));
    if (outcome.refusal.has_value()) {
      const store::CreateRefusal& r = *outcome.refusal;
      if (r.reason == "SPEND_CAP_REACHED") return SpendCapRefusal(r.allowed, r.used);
      return Error(absl::StatusCode::kFailedPrecondition, "INSUFFICIENT_CREDIT",
                   absl::StrCat("the first ", gate.credit_minutes, " minutes of a ",
                                spec.size_gib, " GiB ",
                                spec.kind == store::VolumeKind::kNodeLocal ? "node-local"
                                                                           : "network",
                                " volume, with those of the tenant's other volumes and of "
                                "the instances it already has running or queued, cost ",
                                billing::Yuan(r.used), " but only ",
                                billing::Yuan(r.allowed), " is available; top up first"));
    }
    const store::VolumeRecord& v = outcome.record;
    spdlog::info("api: volume {} {} GiB tenant={} request_id={}", v.id, v.spec.size_gib,
                 who.tenant_id, request_id);
    ToProto(v, Grace(), response);
    return absl::OkStatus();
  }

  absl::Status List(const store::Principal& who, const v1::ListVolumesRequest& request,
                    v1::ListVolumesResponse* response) {
    SV_ASSIGN_OR_RETURN(const int page, NormalizePageSize(request.page_size()));
    SV_ASSIGN_OR_RETURN(auto cursor, DecodeToken(request.page_token(), request.show_deleted()));
    SV_ASSIGN_OR_RETURN(auto list,
                        volumes_.List(who.tenant_id, cursor, page + 1, request.show_deleted()));
    const bool more = static_cast<int>(list.size()) > page;
    if (more) list.resize(page);
    for (const auto& v : list) ToProto(v, Grace(), response->add_volumes());
    if (more) {
      response->set_next_page_token(EncodeToken(
          {absl::ToUnixMicros(list.back().created_at), list.back().id}, request.show_deleted()));
    }
    return absl::OkStatus();
  }

  ApiDependencies deps_;
  const Authenticator& auth_;
  store::VolumeStore volumes_;
};

}  // namespace

std::unique_ptr<grpc::Service> NewVolumeService(const ApiDependencies& deps,
                                                const Authenticator& auth) {
  return std::make_unique<VolumeServiceImpl>(deps, auth);
}

}  // namespace sv::api::internal
