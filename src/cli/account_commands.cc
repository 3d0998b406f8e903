// svctl whoami and svctl admin ...
#include <iostream>
#include <memory>
#include <string>
#include <type_traits>

#include "CLI/CLI.hpp"
#include "cli/commands.h"
#include "sv/v1/account.grpc.pb.h"
#include "sv/v1/admin.grpc.pb.h"

namespace sv::cli {

void AddAccountCommands(CLI::App& app, Action* action) {
  auto* whoami = app.add_subcommand("whoami", "Show the caller's user and tenant");
  whoami->callback([=] {
    *action = [](Session& s) {
      std::string error;
      if (!s.Connect(&error)) return Fail(error);
      v1::AccountService::Stub stub(s.channel);
      v1::Account account;
      grpc::Status status =
          stub.GetCurrentAccount(s.Context().get(), v1::GetCurrentAccountRequest(), &account);
      if (!status.ok()) return FailRpc(status, s);
      if (s.format() == Format::kJson) {
        PrintJson(account, std::cout);
      } else {
        PrintAccount(account, std::cout);
      }
      return kExitOk;
    };
  });
}

namespace {

// svctl admin tenant|suspend|resume: resolves the tenant, fills `Request`
// (its tenant_id, and `reason` when given), calls `rpc`, and prints the
// answer as JSON or with `print`.
template <typename Request, typename Response, typename Print>
Action TenantCall(std::shared_ptr<std::string> tenant, std::shared_ptr<std::string> reason,
                  grpc::Status (v1::AdminService::Stub::*rpc)(grpc::ClientContext*,
                                                              const Request&, Response*),
                  Print print) {
  return [=](Session& s) {
    s.flags.admin = true;
    std::string error;
    if (!s.Connect(&error)) return Fail(error);
    Request request;
    if (int rc = ResolveTenant(s, *tenant, request.mutable_tenant_id()); rc != kExitOk) {
      return rc;
    }
    if constexpr (!std::is_same_v<Request, v1::GetTenantRequest>) request.set_reason(*reason);
    v1::AdminService::Stub stub(s.channel);
    Response response;
    grpc::Status status = (stub.*rpc)(s.Context().get(), request, &response);
    if (!status.ok()) return FailRpc(status, s);
    if (s.format() == Format::kJson) {
      PrintJson(response, std::cout);
    } else {
      print(response);
    }
    return kExitOk;
  };
}

// "tenant acme (ten-...) <what>".
void SayTenant(const v1::Tenant& t, const std::string& what) {
  std::cout << "tenant " << t.name() << " (" << t.id() << ") " << what << "\n";
}

void AddTenantStandingCommands(CLI::App& admin, Action* action) {
  auto tenant = std::make_shared<std::string>();
  auto reason = std::make_shared<std::string>();
  auto* show = admin.add_subcommand("tenant", "Show a tenant and its suspensions");
  show->add_option("tenant", *tenant, "Tenant id or name")->required();
  show->callback([=] {
    *action = TenantCall(tenant, reason, &v1::AdminService::Stub::GetTenant,
                         [](const v1::TenantStanding& r) { PrintTenantStanding(r, std::cout); });
  });
  auto* suspend = admin.add_subcommand(
      "suspend", "Suspend a tenant: stop its instances, refuse its creates and starts");
  auto* resume = admin.add_subcommand(
      "resume", "Lift a tenant's suspension (its stopped instances stay stopped)");
  for (auto* c : {suspend, resume}) {
    c->add_option("tenant", *tenant, "Tenant id or name")->required();
    c->add_option("--reason", *reason, "Why; the tenant is shown it")->required();
  }
  suspend->callback([=] {
    *action = TenantCall(tenant, reason, &v1::AdminService::Stub::SuspendTenant,
                         [](const v1::SuspendTenantResponse& r) {
                           SayTenant(r.tenant(),
                                     (r.newly_suspended() ? "suspended; "
                                                          : "was already suspended; ") +
                                         std::to_string(r.instances_stopped()) +
                                         " instance(s) stopped");
                         });
  });
  resume->callback([=] {
    *action = TenantCall(tenant, reason, &v1::AdminService::Stub::ResumeTenant,
                         [](const v1::ResumeTenantResponse& r) {
                           SayTenant(r.tenant(), r.was_suspended() ? "resumed"
                                                                   : "was not suspended");
                         });
  });
}

}  // namespace

void AddAdminCommands(CLI::App& app, Action* action) {
  auto* admin = app.add_subcommand("admin", "Operator commands (they use the admin key)");
  admin->require_subcommand(1);
  auto name = std::make_shared<std::string>();
  auto email = std::make_shared<std::string>();
  auto* create_tenant = admin->add_subcommand("create-tenant", "Create a tenant and its owner");
  create_tenant->add_option("name", *name, "Tenant name")->required();
  create_tenant->add_option("--owner-email", *email, "Owner's e-mail")->required();
  create_tenant->callback([=] {
    *action = [=](Session& s) {
      s.flags.admin = true;
      std::string error;
      if (!s.Connect(&error)) return Fail(error);
      v1::AdminService::Stub stub(s.channel);
      v1::CreateTenantRequest request;
      request.set_name(*name);
      request.set_owner_email(*email);
      v1::CreateTenantResponse response;
      grpc::Status status = stub.CreateTenant(s.Context().get(), request, &response);
      if (!status.ok()) return FailRpc(status, s);
      PrintJson(response, std::cout);
      return kExitOk;
    };
  });
  AddTenantStandingCommands(*admin, action);
}

}  // namespace sv::cli
