#include "api/internal/service_util.h"
#include "absl/strings/numbers.h"
#include "api/internal/instance_extras.h"
#include "api/internal/security_util.h"
#include "api/authz_interceptor.h"
#include "api/validation.h"
#include "billing/billing.h"
#include "common/ids.h"
#include "common/status.h"
#include "spdlog/spdlog.h"
#include "store/agent_store.h"
#include "store/scheduling_store.h"
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
                  Create(*context, *who, *request, response));
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
      if (status.ok()) status = SetQueuePositions(who->tenant_id, {response});
      if (status.ok()) status = AddInstanceExtras(*deps_.store, who->tenant_id, {response});
    }
    return Finish("GetInstance", &*who, "", status);
  }

  grpc::Status ResizeInstance(grpc::ServerContext* context,
                              const v1::ResizeInstanceRequest* request,
                              v1::ResizeInstanceResponse* response) override {
    auto who = auth_.Authenticate(*context);
    if (!who.ok()) return Finish("ResizeInstance", nullptr, "", who.status());
    return Finish("ResizeInstance", &*who, "", Resize(*who, *request, response));
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
      // Group-committed with the deletes of other calls arriving together;
      // the call's audit row commits with the delete when it answers the row.
      const absl::Time now = deps_.clock->Now();
      store::DeleteOutcome outcome = deps_.store->SubmitDelete(
          {who->tenant_id, request->id(), now, InTransactionAuditRow(context, *request, now)});
      const auto& record = outcome.record;
      status = record.status();
      if (record.ok()) {
        ToProto(*record, response);
        spdlog::info("api: deleted {} tenant={}", record->id, who->tenant_id);
        if (deps_.loops) deps_.loops->Kick();  // Freed GPUs may fit the queue.
      }
      // Its row says OK, and the call ends OK: nothing below can fail.
      if (outcome.audited) CallRegistry::Default().MarkAudited(context);
    }
    return Finish("DeleteInstance", &*who, "", status);
  }

  // ---- Lifecycle (docs/agent.md) ----

  grpc::Status StopInstance(grpc::ServerContext* context, const v1::StopInstanceRequest* request,
                            v1::Instance* response) override {
    auto who = auth_.Authenticate(*context);
    if (!who.ok()) return Finish("StopInstance", nullptr, "", who.status());
    absl::Status status = CheckInstanceId(request->id());
    if (status.ok()) {
      // Billing ends now; the node agents stop the instance when they next
      // receive their desired set (within a second).
      auto record = deps_.store->StopInstance(who->tenant_id, request->id(),
                                              "stopped by the user", deps_.clock->Now());
      status = record.status();
      if (record.ok()) {
        ToProto(*record, response);
        spdlog::info("api: stopped {} tenant={}", record->id, who->tenant_id);
        if (deps_.loops) deps_.loops->Kick();
      }
    }
    return Finish("StopInstance", &*who, "", status);
  }

  grpc::Status StartInstance(grpc::ServerContext* context,
                             const v1::StartInstanceRequest* request,
                             v1::Instance* response) override {
    auto who = auth_.Authenticate(*context);
    if (!who.ok()) return Finish("StartInstance", nullptr, "", who.status());
    absl::Status status = CheckInstanceId(request->id());
    // Whether the credit gate below ran; a start the store finds STOPPED
    // without it (a credit stop landed after the read) is refused.
    bool credit_checked = deps_.billing == nullptr;
    if (status.ok() && deps_.billing != nullptr) {
      // Starting a stopped instance is held to the create's credit gate, as
      // growing one is: otherwise a tenant whose instance was stopped for
      // want of credit could start it again and again, each time running
      // unpaid until metering stops it.
      auto current = deps_.store->GetInstance(who->tenant_id, request->id());
      if (!current.ok()) {
        status = current.status();
      } else if (current->state == store::InstanceState::kStopped) {
        // An app's fee too: one stopped for its unpaid fee would otherwise
        // start, run a minute on trial credit and stop again.
        auto app_price = deps_.billing->AppPriceOf(current->id);
        status = app_price.ok()
                     ? deps_.billing->CheckCreditForCreate(
                           who->tenant_id, current->spec.gpu_count, current->spec.gpu_model,
                           deps_.clock->Now(), *app_price)
                     : app_price.status();
        credit_checked = true;
      }
    }
    if (status.ok()) {
      // The credit gate again and the spend cap, under the tenant's lock.
      const store::CreateGate gate = StartGate();
      std::optional<store::CreateRefusal> refusal;
      auto record = deps_.store->StartInstance(
          who->tenant_id, request->id(), deps_.clock->Now(),
          deps_.loops != nullptr
              ? deps_.loops->scheduling().options().default_quota.pending_count_max
              : -1,
          credit_checked, gate, &refusal);
      status = record.status();
      if (refusal.has_value()) {
        status = WordRefusal(*refusal, status, who->tenant_id, request->id(), 0);
      }
      if (record.ok()) {
        if (record->state == store::InstanceState::kPending && deps_.loops != nullptr &&
            deps_.loops->PlaceNow().ok()) {
          auto reread = deps_.store->GetInstance(who->tenant_id, record->id);
          if (reread.ok()) record = *std::move(reread);
        }
        ToProto(*record, response);
        spdlog::info("api: started {} tenant={}", record->id, who->tenant_id);
      }
    }
    return Finish("StartInstance", &*who, "", status);
  }

  grpc::Status ListInstanceEvents(grpc::ServerContext* context,
                                  const v1::ListInstanceEventsRequest* request,
                                  v1::ListInstanceEventsResponse* response) override {
    auto who = auth_.Authenticate(*context);
    if (!who.ok()) return Finish("ListInstanceEvents", nullptr, "", who.status());
    return Finish("ListInstanceEvents", &*who, "", ListEvents(*who, *request, response));
  }

  grpc::Status SetIdlePolicy(grpc::ServerContext* context,
                             const v1::SetIdlePolicyRequest* request,
                             v1::Instance* response) override {
    auto who = auth_.Authenticate(*context);
    if (!who.ok()) return Finish("SetIdlePolicy", nullptr, "", who.status());
    return Finish("SetIdlePolicy", &*who, "", SetIdle(*who, *request, response));
  }

  grpc::Status SetInstanceMovable(grpc::ServerContext* context,
                                  const v1::SetInstanceMovableRequest* request,
                                  v1::Instance* response) override {
    auto who = auth_.Authenticate(*context);
    if (!who.ok()) return Finish("SetInstanceMovable", nullptr, "", who.status());
    return Finish("SetInstanceMovable", &*who, "", SetMovable(*who, *request, response));
  }

 private:
  absl::Status ListEvents(const store::Principal& who,
                          const v1::ListInstanceEventsRequest& request,
                          v1::ListInstanceEventsResponse* response) {
    constexpr int kEventsPageDefault = 100;
    constexpr int kEventsPageMax = 1000;
    SV_RETURN_IF_ERROR(CheckInstanceId(request.id()));
    if (request.page_size() < 0) {
      return Error(absl::StatusCode::kInvalidArgument, "INVALID_PAGE_SIZE",
                   "page_size must not be negative");
    }
    const int page_size = request.page_size() == 0
                              ? kEventsPageDefault
                              : std::min(request.page_size(), kEventsPageMax);
    int64_t after_id = 0;
    if (!request.page_token().empty() &&
        (!absl::SimpleAtoi(request.page_token(), &after_id) || after_id <= 0)) {
      return Error(absl::StatusCode::kInvalidArgument, "INVALID_PAGE_TOKEN",
                   "page_token is not from this list");
    }
    store::AgentStore agents(deps_.store->database());
    SV_ASSIGN_OR_RETURN(auto events, agents.ListInstanceEvents(who.tenant_id, request.id(),
                                                               after_id, page_size + 1));
    const bool more = static_cast<int>(events.size()) > page_size;
    if (more) events.resize(page_size);
    for (const auto& e : events) {
      auto* out = response->add_events();
      *out->mutable_event_time() = ToProto(e.at);
      if (e.from_state) {
        out->set_from_state(static_cast<v1::InstanceState>(static_cast<int>(*e.from_state) + 1));
      }
      out->set_to_state(static_cast<v1::InstanceState>(static_cast<int>(e.to_state) + 1));
      out->set_reason(e.reason);
    }
    if (more) response->set_next_page_token(std::to_string(events.back().id));
    return absl::OkStatus();
  }

  absl::Status SetIdle(const store::Principal& who, const v1::SetIdlePolicyRequest& request,
                       v1::Instance* response) {
    constexpr int kIdleSecondsMax = 7 * 24 * 3600;
    SV_RETURN_IF_ERROR(CheckInstanceId(request.id()));
    if (request.idle_seconds() < 0 || request.idle_seconds() > kIdleSecondsMax ||
        (request.idle_seconds() > 0 &&
         (request.utilization_pct() < 1 || request.utilization_pct() > 100))) {
      return Error(absl::StatusCode::kInvalidArgument, "INVALID_IDLE_POLICY",
                   "idle_seconds must be 0 to 604800 and utilization_pct 1 to 100");
    }
    store::AgentStore agents(deps_.store->database());
    SV_RETURN_IF_ERROR(agents.SetIdlePolicy(who.tenant_id, request.id(), request.idle_seconds(),
                                            request.idle_seconds() > 0 ? request.utilization_pct()
                                                                       : 0,
                                            deps_.clock->Now()));
    SV_ASSIGN_OR_RETURN(auto record, deps_.store->GetInstance(who.tenant_id, request.id()));
    ToProto(record, response);
    return absl::OkStatus();
  }

  absl::Status SetMovable(const store::Principal& who,
                          const v1::SetInstanceMovableRequest& request, v1::Instance* response) {
    SV_RETURN_IF_ERROR(CheckInstanceId(request.id()));
    store::AgentStore agents(deps_.store->database());
    SV_RETURN_IF_ERROR(agents.SetInstanceMovable(who.tenant_id, request.id(), request.movable(),
                                                 deps_.clock->Now()));
    SV_ASSIGN_OR_RETURN(auto record, deps_.store->GetInstance(who.tenant_id, request.id()));
    ToProto(record, response);
    return absl::OkStatus();
  }

  absl::Status Create(grpc::ServerContext& context, const store::Principal& who,
                      const v1::CreateInstanceRequest& request, v1::Instance* response) {
    const v1::Instance& in = request.instance();
    store::InstanceSpec spec{in.name(), in.gpu_count(), in.gpu_model(), in.image(),
                             in.max_leaves()};
    SV_RETURN_IF_ERROR(ReadInstanceExtras(in, spec));
    // Another tenant's private image (a priced app's among them) is run
    // only through LaunchApp, which charges its fee.
    SV_RETURN_IF_ERROR(CheckImageIsUsable(spec.image, deps_.app_registry, who.tenant_id));
    bool ranked = true;
    bool audited = false;
    SV_RETURN_IF_ERROR(CreateInstanceFor(
        deps_, who, std::move(spec), request.request_id(), response, &ranked,
        InTransactionAuditRow(&context, request, deps_.clock->Now()), &audited));
    // The call's audit row (OK) committed with the instance: the call must
    // end OK, so below only what cannot fail it.
    if (audited) CallRegistry::Default().MarkAudited(&context);
    // A new row no queue pass has seen yet has no position (0) to read.
    if (!ranked) return absl::OkStatus();
    absl::Status status = SetQueuePositions(who.tenant_id, {response});
    if (!status.ok() && audited) {
      // The instance is created and the answer says so; only its queue
      // position (0: not known yet) is missing.
      spdlog::warn("api: queue position of {} not read: {}", response->id(),
                   status.ToString());
      return absl::OkStatus();
    }
    return status;
  }

  // The create's gate without its trial grant, for a start or a growth.
  store::CreateGate StartGate() const {
    store::CreateGate gate;
    if (deps_.billing != nullptr) {
      deps_.billing->FillCreateGate("", deps_.clock->Now(), &gate);
      gate.trial_user_id.clear();
    }
    gate.spend_cap_since_minute =
        absl::ToUnixSeconds(SpendCapMonthStart(deps_.clock->Now())) / 60;
    return gate;
  }

  // A gate's refusal of a start or a resize (to `gpu_count`; 0: the
  // instance's size), worded as a create's; else `status` as it is.
  absl::Status WordRefusal(const store::CreateRefusal& r, absl::Status status,
                           const std::string& tenant_id, const std::string& id, int gpu_count) {
    if (r.reason == "SPEND_CAP_REACHED") return SpendCapRefusal(r.allowed, r.used);
    if (r.reason == "INSUFFICIENT_CREDIT" && deps_.billing != nullptr) {
      auto instance = deps_.store->GetInstance(tenant_id, id);
      if (instance.ok()) {
        return deps_.billing->CreditRefusal(gpu_count > 0 ? gpu_count : instance->spec.gpu_count,
                                            instance->spec.gpu_model, r.used, r.allowed);
      }
    }
    return status;
  }

  // Queue positions are written by the scheduling loop (docs/scheduler.md).
  absl::Status SetQueuePositions(const std::string& tenant_id,
                                 const std::vector<v1::Instance*>& instances) {
    std::vector<std::string> pending;
    for (const v1::Instance* i : instances) {
      if (i->state() == v1::PENDING) pending.push_back(i->id());
    }
    if (pending.empty()) return absl::OkStatus();
    SV_ASSIGN_OR_RETURN(auto positions,
                        store::SchedulingStore(deps_.store->database())
                            .QueuePositions(tenant_id, pending));
    for (v1::Instance* i : instances) {
      auto it = positions.find(i->id());
      if (it != positions.end()) i->set_queue_position(it->second);
    }
    return absl::OkStatus();
  }

  absl::Status Resize(const store::Principal& who, const v1::ResizeInstanceRequest& request,
                      v1::ResizeInstanceResponse* response) {
    SV_RETURN_IF_ERROR(CheckInstanceId(request.id()));
    if (deps_.loops == nullptr) {
      return Error(absl::StatusCode::kUnavailable, "SCHEDULER_UNAVAILABLE",
                   "this server runs no scheduler");
    }
    // A size no resize can reach is refused as such, before the credit
    // gate could refuse it for its price.
    SV_RETURN_IF_ERROR(control::CheckResizeGpuCount(request.gpu_count()));
    if (deps_.billing != nullptr) {
      // Growing is held to the create's credit gate: the wallet must cover
      // the first minutes of the instance at its new size (and of the
      // tenant's other instances).
      SV_ASSIGN_OR_RETURN(auto current, deps_.store->GetInstance(who.tenant_id, request.id()));
      if (current.state == store::InstanceState::kRunning &&
          request.gpu_count() > current.spec.gpu_count) {
        SV_ASSIGN_OR_RETURN(int64_t app_price, deps_.billing->AppPriceOf(current.id));
        SV_RETURN_IF_ERROR(deps_.billing->CheckCreditForCreate(
            who.tenant_id, request.gpu_count(), current.spec.gpu_model, deps_.clock->Now(),
            app_price, current.id));
      }
    }
    // The gate again, and the spend cap, under the tenant's lock.
    const store::CreateGate gate = StartGate();
    std::optional<store::CreateRefusal> refusal;
    auto resized = deps_.loops->scheduling().Resize(who.tenant_id, request.id(),
                                                    request.gpu_count(), deps_.clock->Now(),
                                                    gate, &refusal);
    if (refusal.has_value()) {
      return WordRefusal(*refusal, resized.status(), who.tenant_id, request.id(),
                         request.gpu_count());
    }
    SV_ASSIGN_OR_RETURN(int previous, std::move(resized));
    SV_ASSIGN_OR_RETURN(auto record, deps_.store->GetInstance(who.tenant_id, request.id()));
    if (previous > record.spec.gpu_count) deps_.loops->Kick();  // Freed GPUs.
    spdlog::info("api: resized {} from {} to {} GPUs tenant={}", record.id, previous,
                 record.spec.gpu_count, who.tenant_id);
    ToProto(record, response->mutable_instance());
    response->set_previous_gpu_count(previous);
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
    SV_RETURN_IF_ERROR(SetQueuePositions(
        who.tenant_id, {response->mutable_instances()->pointer_begin(),
                        response->mutable_instances()->pointer_end()}));
    SV_RETURN_IF_ERROR(AddInstanceExtras(
        *deps_.store, who.tenant_id,
        {response->mutable_instances()->pointer_begin(),
         response->mutable_instances()->pointer_end()}));
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

namespace {

// The create of `spec` with every check a create needs: one element of a
// group-committed transaction (store/create_batch.h). Under the tenant's
// row lock it runs the user's trial grant (a user's first create is when it
// is granted), the idempotency lookup (a retry of an accepted create gets
// its first answer), the credit gate (FAILED_PRECONDITION /
// INSUFFICIENT_CREDIT unless the first minutes are paid for), the monthly
// spend cap (RESOURCE_EXHAUSTED / SPEND_CAP_REACHED, docs/security.md), the
// instance limit and the pending quota (RESOURCE_EXHAUSTED /
// QUOTA_EXCEEDED), all exact, and the row.
absl::StatusOr<store::CreateOutcome> CreateWithGate(const ApiDependencies& deps,
                                                    const store::Principal& who,
                                                    store::InstanceSpec spec,
                                                    const std::string& request_id,
                                                    std::optional<store::AuditRow> audit) {
  const absl::Time now = deps.clock->Now();
  store::CreateRequest create;
  create.tenant_id = who.tenant_id;
  create.fingerprint = InstanceFingerprint(spec) + ExtrasFingerprint(spec.extras);
  create.spec = std::move(spec);
  create.request_id = request_id;
  create.now = now;
  create.pending_max_default =
      deps.loops != nullptr ? deps.loops->scheduling().options().default_quota.pending_count_max
                            : -1;
  if (deps.billing != nullptr) deps.billing->FillCreateGate(who.user_id, now, &create.gate);
  create.gate.spend_cap_since_minute = absl::ToUnixSeconds(SpendCapMonthStart(now)) / 60;
  create.audit = std::move(audit);
  SV_ASSIGN_OR_RETURN(store::CreateOutcome outcome, deps.store->SubmitCreate(create));
  if (!outcome.refusal.has_value()) return outcome;
  // The gate refused: the rules' owners word the error.
  const store::CreateRefusal& r = *outcome.refusal;
  if (r.reason == "INSUFFICIENT_CREDIT" && deps.billing != nullptr) {
    return deps.billing->CreditRefusal(create.spec.gpu_count, create.spec.gpu_model, r.used,
                                       r.allowed);
  }
  if (r.reason == "SPEND_CAP_REACHED") return SpendCapRefusal(r.allowed, r.used);
  return Error(absl::StatusCode::kInternal, "INTERNAL", "unknown create refusal " + r.reason);
}

}  // namespace

absl::Status CreateInstanceFor(const ApiDependencies& deps, const store::Principal& who,
                               store::InstanceSpec spec, std::string request_id,
                               v1::Instance* response, bool* ranked,
                               std::optional<store::AuditRow> audit, bool* audited) {
  if (ranked != nullptr) *ranked = true;
  if (audited != nullptr) *audited = false;
  store::InstanceExtras extras = std::move(spec.extras);
  SV_ASSIGN_OR_RETURN(spec, NormalizeInstanceSpec(spec));
  spec.extras = std::move(extras);
  if (request_id.empty()) {
    request_id = NewUuid();  // No retry protection was asked for.
  } else {
    SV_RETURN_IF_ERROR(ValidateRequestId(request_id));
  }
  const bool has_extras = !spec.extras.ports.empty() || !spec.extras.library_mounts.empty() ||
                          !spec.extras.app_image_id.empty();
  // The call's audit row goes into the create's transaction only when
  // nothing after the commit can fail the call: no extras to read.
  if (has_extras || audited == nullptr) audit.reset();
  SV_ASSIGN_OR_RETURN(store::CreateOutcome outcome,
                      CreateWithGate(deps, who, std::move(spec), request_id, std::move(audit)));
  if (audited != nullptr) *audited = outcome.audited;
  const bool inserted = outcome.inserted;
  store::InstanceRecord record = std::move(outcome.record);
  bool pass_ran = false;
  if (record.state == store::InstanceState::kPending && deps.loops != nullptr) {
    // Place at once when capacity allows, so the answer already shows the
    // placement; if the pass fails the loop retries it shortly. When another
    // pass holds the lock, the loop's next pass places it (docs/reliability.md)
    // and the answer is the row as committed: PENDING.
    absl::Status placed = deps.loops->PlaceNow(&pass_ran);
    if (!placed.ok()) {
      spdlog::warn("api: placement after create failed tenant={} request_id={}: {}",
                   who.tenant_id, request_id, placed.ToString());
      deps.loops->Kick();
    }
    if (pass_ran) {
      auto reread = deps.store->GetInstance(who.tenant_id, record.id);
      if (reread.ok()) record = *std::move(reread);
    }
  }
  if (ranked != nullptr) *ranked = !inserted || pass_ran;
  spdlog::info("api: instance {} gpus={} state={} tenant={} request_id={}", record.id,
               record.spec.gpu_count, store::InstanceStateName(record.state),
               who.tenant_id, request_id);
  ToProto(record, response);
  // A row this call inserted without ports, mounts or an app has none of
  // them, nor volumes (attaching needs the instance's id): nothing to read.
  if (inserted && !has_extras) return absl::OkStatus();
  return AddInstanceExtras(*deps.store, who.tenant_id, {response});
}


std::unique_ptr<grpc::Service> NewInstanceService(const ApiDependencies& deps,
                                                  const Authenticator& auth) {
  return std::make_unique<InstanceServiceImpl>(deps, auth);
}
}  // namespace sv::api::internal
