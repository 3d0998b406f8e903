// svctl whoami and svctl admin ...
#include <iostream>

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
}

}  // namespace sv::cli
