// svctl: the command-line client of sv. Exit code 0 on success; otherwise
// one line on stderr naming the cause (1: the call failed, 2: bad usage).
#include <iostream>
#include <thread>

#include "CLI/CLI.hpp"
#include "cli/client.h"
#include "cli/output.h"
#include "common/ids.h"
#include "sv/v1/account.grpc.pb.h"
#include "sv/v1/instance.grpc.pb.h"

namespace {

using sv::cli::Format;

constexpr int kExitFailed = 1;
constexpr int kExitUsage = 2;

struct Globals {
  sv::cli::ConnectionFlags connection;
  std::string output = "table";
};

int Fail(const std::string& message) {
  std::cerr << "svctl: error: " << message << "\n";
  return kExitFailed;
}

int FailRpc(const grpc::Status& status, const sv::cli::Connection& c) {
  return Fail(sv::cli::DescribeError(status, c.endpoint));
}

Format OutputFormat(const Globals& g) { return g.output == "json" ? Format::kJson : Format::kTable; }

void Show(const sv::v1::Instance& instance, Format format) {
  if (format == Format::kJson) {
    sv::cli::PrintJson(instance, std::cout);
  } else {
    sv::cli::PrintInstanceDetail(instance, std::cout);
  }
}

bool IsSettled(sv::v1::InstanceState s) {
  return s == sv::v1::RUNNING || s == sv::v1::FAILED || s == sv::v1::DELETED ||
         s == sv::v1::STOPPED;
}

// Polls until the instance settles or `wait_s` passes.
grpc::Status WaitForInstance(sv::v1::InstanceService::Stub& stub,
                             const sv::cli::Connection& c, int wait_s,
                             sv::v1::Instance* instance) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(wait_s);
  while (!IsSettled(instance->state())) {
    if (std::chrono::steady_clock::now() >= deadline) {
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                          "instance " + instance->id() + " is still " +
                              sv::cli::StateName(instance->state()) + " after " +
                              std::to_string(wait_s) + "s: " + instance->state_reason());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    grpc::ClientContext ctx;
    sv::cli::Prepare(c, &ctx);
    sv::v1::GetInstanceRequest get;
    get.set_id(instance->id());
    grpc::Status status = stub.GetInstance(&ctx, get, instance);
    if (!status.ok()) return status;
  }
  return grpc::Status::OK;
}

}  // namespace

int main(int argc, char** argv) {
  Globals g;
  CLI::App app{"svctl - command-line client of the sv GPU cloud"};
  app.require_subcommand(1);
  app.add_option("--endpoint", g.connection.endpoint, "svd address host:port");
  app.add_option("--token", g.connection.token, "API key");
  app.add_option("--config", g.connection.config_path, "Config file path");
  app.add_option("--timeout", g.connection.timeout_s, "Deadline of each call, seconds")
      ->check(CLI::Range(1, 3600));
  app.add_option("-o,--output", g.output, "Output format")
      ->check(CLI::IsMember({"table", "json"}));

  sv::v1::Instance create_spec;
  int create_gpus = 0;
  std::string create_name, create_image, create_request_id;
  bool create_wait = false;
  int wait_s = 300;
  auto* create = app.add_subcommand("create", "Create an instance");
  create->add_option("--gpus", create_gpus, "GPUs: 1-8, or a multiple of 8 up to 128")->required();
  create->add_option("--name", create_name, "Name (lower-case letters, digits, dashes)");
  create->add_option("--image", create_image, "Image to run");
  create->add_option("--request-id", create_request_id,
                     "Idempotency key (default: a fresh UUID per invocation)");
  create->add_flag("--wait", create_wait, "Wait until the instance is RUNNING");
  create->add_option("--wait-timeout", wait_s, "How long --wait waits, seconds");

  std::string get_id;
  bool get_wait = false;
  auto* get = app.add_subcommand("get", "Show one instance");
  get->add_option("id", get_id, "Instance id")->required();
  get->add_flag("--wait", get_wait, "Wait until it settles (RUNNING, STOPPED, FAILED, DELETED)");

  int list_page_size = 0;
  bool list_all = false;
  auto* list = app.add_subcommand("list", "List instances");
  list->add_option("--page-size", list_page_size, "Instances per page (default 50, max 500)");
  list->add_flag("--show-deleted", list_all, "Include deleted instances");

  std::string delete_id;
  auto* del = app.add_subcommand("delete", "Delete an instance and release its GPUs");
  del->add_option("id", delete_id, "Instance id")->required();

  auto* whoami = app.add_subcommand("whoami", "Show the caller's user and tenant");

  std::string tenant_name, tenant_email;
  auto* admin = app.add_subcommand("admin", "Operator commands (use the admin key)");
  admin->require_subcommand(1);
  auto* create_tenant = admin->add_subcommand("create-tenant", "Create a tenant and its owner");
  create_tenant->add_option("name", tenant_name, "Tenant name")->required();
  create_tenant->add_option("--owner-email", tenant_email, "Owner's e-mail")->required();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);
    return code == 0 ? 0 : kExitUsage;
  }

  g.connection.admin = admin->parsed();
  sv::cli::Connection c;
  std::string error;
  if (!sv::cli::ResolveConnection(g.connection, &c, &error)) return Fail(error);
  auto channel = sv::cli::Dial(c);
  sv::v1::InstanceService::Stub instances(channel);
  const Format format = OutputFormat(g);
  grpc::ClientContext ctx;
  sv::cli::Prepare(c, &ctx);

  if (create->parsed()) {
    sv::v1::CreateInstanceRequest request;
    request.mutable_instance()->set_gpu_count(create_gpus);
    request.mutable_instance()->set_name(create_name);
    request.mutable_instance()->set_image(create_image);
    request.set_request_id(create_request_id.empty() ? sv::NewUuid() : create_request_id);
    sv::v1::Instance instance;
    // Retries after a lost answer are safe: the request id is the same.
    grpc::Status status;
    for (int attempt = 0; attempt < 3; ++attempt) {
      grpc::ClientContext attempt_ctx;
      sv::cli::Prepare(c, &attempt_ctx);
      status = instances.CreateInstance(&attempt_ctx, request, &instance);
      if (status.error_code() != grpc::StatusCode::UNAVAILABLE &&
          status.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(500 << attempt));
    }
    if (!status.ok()) return FailRpc(status, c);
    if (create_wait) {
      status = WaitForInstance(instances, c, wait_s, &instance);
      if (!status.ok()) return FailRpc(status, c);
    }
    Show(instance, format);
    if (create_wait && instance.state() != sv::v1::RUNNING) {
      return Fail("instance " + instance.id() + " ended " + sv::cli::StateName(instance.state()) +
                  ": " + instance.state_reason());
    }
    return 0;
  }
  if (get->parsed()) {
    sv::v1::GetInstanceRequest request;
    request.set_id(get_id);
    sv::v1::Instance instance;
    grpc::Status status = instances.GetInstance(&ctx, request, &instance);
    if (status.ok() && get_wait) status = WaitForInstance(instances, c, wait_s, &instance);
    if (!status.ok()) return FailRpc(status, c);
    Show(instance, format);
    return 0;
  }
  if (list->parsed()) {
    sv::v1::ListInstancesRequest request;
    request.set_page_size(list_page_size);
    request.set_show_deleted(list_all);
    std::vector<sv::v1::Instance> all;
    sv::v1::ListInstancesResponse merged;
    constexpr int kPagesMax = 1000;
    for (int page = 0; page < kPagesMax; ++page) {
      grpc::ClientContext page_ctx;
      sv::cli::Prepare(c, &page_ctx);
      sv::v1::ListInstancesResponse response;
      grpc::Status status = instances.ListInstances(&page_ctx, request, &response);
      if (!status.ok()) return FailRpc(status, c);
      for (const auto& i : response.instances()) {
        all.push_back(i);
        *merged.add_instances() = i;
      }
      if (response.next_page_token().empty()) break;
      request.set_page_token(response.next_page_token());
    }
    if (format == Format::kJson) {
      sv::cli::PrintJson(merged, std::cout);
    } else {
      sv::cli::PrintInstanceTable(all, std::cout);
    }
    return 0;
  }
  if (del->parsed()) {
    sv::v1::DeleteInstanceRequest request;
    request.set_id(delete_id);
    sv::v1::Instance instance;
    grpc::Status status = instances.DeleteInstance(&ctx, request, &instance);
    if (!status.ok()) return FailRpc(status, c);
    Show(instance, format);
    return 0;
  }
  if (whoami->parsed()) {
    sv::v1::AccountService::Stub accounts(channel);
    sv::v1::Account account;
    grpc::Status status =
        accounts.GetCurrentAccount(&ctx, sv::v1::GetCurrentAccountRequest(), &account);
    if (!status.ok()) return FailRpc(status, c);
    if (format == Format::kJson) {
      sv::cli::PrintJson(account, std::cout);
    } else {
      sv::cli::PrintAccount(account, std::cout);
    }
    return 0;
  }
  if (create_tenant->parsed()) {
    sv::v1::AdminService::Stub admin_stub(channel);
    sv::v1::CreateTenantRequest request;
    request.set_name(tenant_name);
    request.set_owner_email(tenant_email);
    sv::v1::CreateTenantResponse response;
    grpc::Status status = admin_stub.CreateTenant(&ctx, request, &response);
    if (!status.ok()) return FailRpc(status, c);
    sv::cli::PrintJson(response, std::cout);
    return 0;
  }
  return kExitUsage;
}
