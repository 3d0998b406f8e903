// svctl whoami and svctl admin ...
#include <iostream>
#include <memory>
#include <string>

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

// svctl admin tenant|suspend|resume: `call` runs the RPC for the resolved
// tenant id and prints its answer.
template <typename Call>
Action TenantCall(std::shared_ptr<std::string> tenant, Call call) {
  return [=](Session& s) {
    s.flags.admin = true;
    std::string error;
    if (!s.Connect(&error)) return Fail(error);
    std::string id;
    if (int rc = ResolveTenant(s, *tenant, &id); rc != kExitOk) return rc;
    v1::AdminService::Stub stub(s.channel);
    return call(s, stub, id);
  };
}

void AddTenantStandingCommands(CLI::App& admin, Action* action) {
  auto tenant = std::make_shared<std::string>();
  auto reason = std::make_shared<std::string>();
  auto* show = admin.add_subcommand("tenant", "Show a tenant and its suspensions");
  show->add_option("tenant", *tenant, "Tenant id or name")->required();
  show->callback([=] {
    *action = TenantCall(tenant, [](Session& s, v1::AdminService::Stub& stub,
                                    const std::string& id) {
      v1::GetTenantRequest request;
      request.set_tenant_id(id);
      v1::TenantStanding standing;
      grpc::Status status = stub.GetTenant(s.Context().get(), request, &standing);
      if (!status.ok()) return FailRpc(status, s);
      if (s.format() == Format::kJson) {
        PrintJson(standing, std::cout);
      } else {
        PrintTenantStanding(standing, std::cout);
      }
      return kExitOk;
    });
  });
  auto* suspend = admin.add_subcommand(
      "suspend", "Suspend a tenant: stop its instances, refuse its creates and starts");
  suspend->add_option("tenant", *tenant, "Tenant id or name")->required();
  suspend->add_option("--reason", *reason, "Why; the tenant is shown it")->required();
  suspend->callback([=] {
    *action = TenantCall(tenant, [=](Session& s, v1::AdminService::Stub& stub,
                                     const std::string& id) {
      v1::SuspendTenantRequest request;
      request.set_tenant_id(id);
      request.set_reason(*reason);
      v1::SuspendTenantResponse response;
      grpc::Status status = stub.SuspendTenant(s.Context().get(), request, &response);
      if (!status.ok()) return FailRpc(status, s);
      if (s.format() == Format::kJson) {
        PrintJson(response, std::cout);
      } else {
        std::cout << "tenant " << response.tenant().name() << " ("
                  << response.tenant().id() << ") "
                  << (response.newly_suspended() ? "suspended" : "was already suspended")
                  << "; " << response.instances_stopped() << " instance(s) stopped\n";
      }
      return kExitOk;
    });
  });
  auto* resume = admin.add_subcommand(
      "resume", "Lift a tenant's suspension (its stopped instances stay stopped)");
  resume->add_option("tenant", *tenant, "Tenant id or name")->required();
  resume->add_option("--reason", *reason, "Why; the tenant is shown it")->required();
  resume->callback([=] {
    *action = TenantCall(tenant, [=](Session& s, v1::AdminService::Stub& stub,
                                     const std::string& id) {
      v1::ResumeTenantRequest request;
      request.set_tenant_id(id);
      request.set_reason(*reason);
      v1::ResumeTenantResponse response;
      grpc::Status status = stub.ResumeTenant(s.Context().get(), request, &response);
      if (!status.ok()) return FailRpc(status, s);
      if (s.format() == Format::kJson) {
        PrintJson(response, std::cout);
      } else {
        std::cout << "tenant " << response.tenant().name() << " ("
                  << response.tenant().id() << ") "
                  << (response.was_suspended() ? "resumed" : "was not suspended") << "\n";
      }
      return kExitOk;
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
