#include "api/internal/service_util.h"
#include "api/validation.h"
#include "common/ids.h"
#include "common/status.h"
#include "spdlog/spdlog.h"
#include "sv/v1/instance.grpc.pb.h"

namespace sv::api::internal {
namespace {

class InstanceServiceImpl final : public v1::InstanceService::Service {
 public:
  InstanceServiceImpl(const ApiDependencies& deps, const Authenticator& auth)
      : deps_(deps), auth_(auth) {}

  grpc::Status CreateInstance(grpc::ServerContext* context,
                              const v1::CreateInstanceRequest* request,
                              v1::Instance* response) override {
    auto who = auth_.Authenticate(*context);
    if (!who.ok()) return Finish("CreateInstance", nullptr, request->request_id(), who.status());
    return Finish("CreateInstance", &*who, request->request_id(),
                  Create(*who, *request, response));
  }

  grpc::Status GetInstance(grpc::ServerContext* context, const v1::GetInstanceRequest* request,
                           v1::Instance* response) override {
    auto who = auth_.Authenticate(*context);
    if (!who.ok()) return Finish("GetInstance", nullptr, "", who.status());
    absl::Status status = CheckInstanceId(request->id());
    if (status.ok()) {
      auto record = deps_.store->GetInstance(who->tenant_id, request->id());
      status = record.status();
      if (record.ok()) ToProto(*record, response);
    }
    return Finish("GetInstance", &*who, "", status);
  }

  grpc::Status ListInstances(grpc::ServerContext* context,
                             const v1::ListInstancesRequest* request,
                             v1::ListInstancesResponse* response) override {
    auto who = auth_.Authenticate(*context);
    if (!who.ok()) return Finish("ListInstances", nullptr, "", who.status());
    return Finish("ListInstances", &*who, "", List(*who, *request, response));
  }

  grpc::Status DeleteInstance(grpc::ServerContext* context,
                              const v1::DeleteInstanceRequest* request,
                              v1::Instance* response) override {
    auto who = auth_.Authenticate(*context);
    if (!who.ok()) return Finish("DeleteInstance", nullptr, "", who.status());
    absl::Status status = CheckInstanceId(request->id());
    if (status.ok()) {
      auto record = deps_.store->DeleteInstance(who->tenant_id, request->id(),
                                                deps_.clock->Now());
      status = record.status();
      if (record.ok()) {
        ToProto(*record, response);
        spdlog::info("api: deleted {} tenant={}", record->id, who->tenant_id);
        if (deps_.loops) deps_.loops->Kick();  // Freed GPUs may fit the queue.
      }
    }
    return Finish("DeleteInstance", &*who, "", status);
  }

 private:
  absl::Status Create(const store::Principal& who, const v1::CreateInstanceRequest& request,
                      v1::Instance* response) {
    const v1::Instance& in = request.instance();
    store::InstanceSpec spec{in.name(), in.gpu_count(), in.gpu_model(), in.image()};
    SV_ASSIGN_OR_RETURN(spec, NormalizeInstanceSpec(spec));
    std::string request_id = request.request_id();
    if (request_id.empty()) {
      request_id = NewUuid();  // No retry protection was asked for.
    } else {
      SV_RETURN_IF_ERROR(ValidateRequestId(request_id));
    }
    SV_ASSIGN_OR_RETURN(auto record,
                        deps_.store->CreateInstance(who.tenant_id, spec, request_id,
                                                    InstanceFingerprint(spec),
                                                    deps_.clock->Now()));
    if (record.state == store::InstanceState::kPending && deps_.loops != nullptr) {
      // Place at once when capacity allows, so the answer already shows the
      // placement; if the pass fails the loop retries it shortly.
      absl::Status placed = deps_.loops->PlaceNow();
      if (!placed.ok()) {
        spdlog::warn("api: placement after create failed tenant={} request_id={}: {}",
                     who.tenant_id, request_id, placed.ToString());
        deps_.loops->Kick();
      }
      auto reread = deps_.store->GetInstance(who.tenant_id, record.id);
      if (reread.ok()) record = *std::move(reread);
    }
    spdlog::info("api: instance {} gpus={} state={} tenant={} request_id={}", record.id,
                 record.spec.gpu_count, store::InstanceStateName(record.state),
                 who.tenant_id, request_id);
    ToProto(record, response);
    return absl::OkStatus();
  }

  absl::Status List(const store::Principal& who, const v1::ListInstancesRequest& request,
                    v1::ListInstancesResponse* response) {
    SV_ASSIGN_OR_RETURN(int page_size, NormalizePageSize(request.page_size()));
    SV_ASSIGN_OR_RETURN(auto cursor,
                        DecodePageToken(request.page_token(), request.show_deleted()));
    // Ask for one extra row to learn whether another page follows.
    SV_ASSIGN_OR_RETURN(auto records,
                        deps_.store->ListInstances(who.tenant_id, cursor, page_size + 1,
                                                   request.show_deleted()));
    const bool more = static_cast<int>(records.size()) > page_size;
    if (more) records.resize(page_size);
    for (const auto& r : records) ToProto(r, response->add_instances());
    if (more) {
      const auto& last = records.back();
      response->set_next_page_token(EncodePageToken(
          {absl::ToUnixMicros(last.created_at), last.id}, request.show_deleted()));
    }
    return absl::OkStatus();
  }

  ApiDependencies deps_;
  const Authenticator& auth_;
};

}  // namespace

std::unique_ptr<grpc::Service> NewInstanceService(const ApiDependencies& deps,
                                                  const Authenticator& auth) {
  return std::make_unique<InstanceServiceImpl>(deps, auth);
}
}  // namespace sv::api::internal
