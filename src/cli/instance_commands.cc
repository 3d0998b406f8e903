// svctl create, get, list and delete.
#include <algorithm>
#include <iostream>
#include <thread>

#include "CLI/CLI.hpp"
#include "cli/commands.h"
#include "common/ids.h"
#include "sv/v1/instance.grpc.pb.h"

namespace sv::cli {
namespace {

// "ins-" and base32: what svd's ids look like (common/ids.h). A name of
// that shape is taken as an id.
bool LooksLikeInstanceId(const std::string& s) {
  constexpr std::string_view kPrefix = "ins-";
  if (s.size() <= kPrefix.size() || s.size() > 64 || s.compare(0, kPrefix.size(), kPrefix) != 0) {
    return false;
  }
  for (char c : s.substr(kPrefix.size())) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'))) return false;
  }
  return true;
}

bool IsSettled(v1::InstanceState s) {
  return s == v1::RUNNING || s == v1::FAILED || s == v1::DELETED || s == v1::STOPPED;
}

// Polls until the instance settles or `wait_s` passes.
grpc::Status WaitForInstance(v1::InstanceService::Stub& stub, const Session& s, int wait_s,
                             v1::Instance* instance) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(wait_s);
  while (!IsSettled(instance->state())) {
    if (std::chrono::steady_clock::now() >= deadline) {
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                          "instance " + instance->id() + " is still " +
                              StateName(instance->state()) + " after " +
                              std::to_string(wait_s) + "s: " + instance->state_reason());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    v1::GetInstanceRequest get;
    get.set_id(instance->id());
    grpc::Status status = stub.GetInstance(s.Context().get(), get, instance);
    if (!status.ok()) return status;
  }
  return grpc::Status::OK;
}

// Retries a lost answer: setting the current value again changes nothing.
grpc::Status SetMovable(v1::InstanceService::Stub& stub, const Session& s,
                        const std::string& id, bool movable, v1::Instance* instance) {
  v1::SetInstanceMovableRequest request;
  request.set_id(id);
  request.set_movable(movable);
  grpc::Status status;
  for (int attempt = 0; attempt < 3; ++attempt) {
    status = stub.SetInstanceMovable(s.Context().get(), request, instance);
    if (status.error_code() != grpc::StatusCode::UNAVAILABLE &&
        status.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500 << attempt));
  }
  return status;
}

struct CreateArgs {
  int gpus = 0;
  int max_leaves = 0;
  std::string name, image, request_id;
  std::vector<std::string> mounts;  // Public library items.
  std::vector<int> ports;
  bool wait = false;
  int wait_s = 300;
  bool movable = false;
  bool ssh = false;
};

int RunCreate(Session& s, const CreateArgs& a) {
  std::string error;
  if (!s.Connect(&error)) return Fail(error);
  v1::InstanceService::Stub stub(s.channel);
  v1::CreateInstanceRequest request;
  request.mutable_instance()->set_gpu_count(a.gpus);
  request.mutable_instance()->set_name(a.name);
  request.mutable_instance()->set_image(a.image);
  request.mutable_instance()->set_max_leaves(a.max_leaves);
  for (const auto& m : a.mounts) request.mutable_instance()->add_library_mounts(m);
  for (int p : a.ports) request.mutable_instance()->add_ports()->set_container_port(p);
  if (a.ssh && std::find(a.ports.begin(), a.ports.end(), 22) == a.ports.end()) {
    request.mutable_instance()->add_ports()->set_container_port(22);
  }
  request.set_request_id(a.request_id.empty() ? NewUuid() : a.request_id);
  v1::Instance instance;
  // Retrying after a lost answer is safe: the request id stays the same.
  grpc::Status status;
  for (int attempt = 0; attempt < 3; ++attempt) {
    status = stub.CreateInstance(s.Context().get(), request, &instance);
    if (status.error_code() != grpc::StatusCode::UNAVAILABLE &&
        status.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500 << attempt));
  }
  if (!status.ok()) return FailRpc(status, s);
  if (a.movable) {
    // A second call (CreateInstance does not take `movable`); the instance
    // exists either way, so a failure here says so.
    status = SetMovable(stub, s, instance.id(), true, &instance);
    if (!status.ok()) {
      std::cerr << "svctl: instance " << instance.id() << " was created but is not movable\n";
      return FailRpc(status, s);
    }
  }
  if (a.wait) {
    status = WaitForInstance(stub, s, a.wait_s, &instance);
    if (!status.ok()) return FailRpc(status, s);
  }
  ShowInstance(instance, s.format());
  if (a.wait && instance.state() != v1::RUNNING) {
    return Fail("instance " + instance.id() + " ended " + StateName(instance.state()) + ": " +
                instance.state_reason());
  }
  return kExitOk;
}

int RunGet(Session& s, const std::string& id_or_name, bool wait, int wait_s) {
  std::string error;
  if (!s.Connect(&error)) return Fail(error);
  std::string id;
  if (int rc = ResolveInstance(s, id_or_name, &id); rc != kExitOk) return rc;
  v1::InstanceService::Stub stub(s.channel);
  v1::GetInstanceRequest request;
  request.set_id(id);
  v1::Instance instance;
  grpc::Status status = stub.GetInstance(s.Context().get(), request, &instance);
  if (status.ok() && wait) status = WaitForInstance(stub, s, wait_s, &instance);
  if (!status.ok()) return FailRpc(status, s);
  ShowInstance(instance, s.format());
  return kExitOk;
}

// Every page of the tenant's instances (at most 1,000 pages).
grpc::Status ListEveryInstance(Session& s, v1::ListInstancesRequest request,
                               std::vector<v1::Instance>* all) {
  v1::InstanceService::Stub stub(s.channel);
  constexpr int kPagesMax = 1000;
  for (int page = 0; page < kPagesMax; ++page) {
    v1::ListInstancesResponse response;
    grpc::Status status = stub.ListInstances(s.Context().get(), request, &response);
    if (!status.ok()) return status;
    for (auto& i : *response.mutable_instances()) all->push_back(std::move(i));
    if (response.next_page_token().empty()) break;
    request.set_page_token(response.next_page_token());
  }
  return grpc::Status::OK;
}

int RunList(Session& s, int page_size, bool show_deleted) {
  std::string error;
  if (!s.Connect(&error)) return Fail(error);
  v1::ListInstancesRequest request;
  request.set_page_size(page_size);
  request.set_show_deleted(show_deleted);
  std::vector<v1::Instance> all;
  grpc::Status status = ListEveryInstance(s, request, &all);
  if (!status.ok()) return FailRpc(status, s);
  if (s.format() == Format::kJson) {
    v1::ListInstancesResponse merged;
    for (const auto& i : all) *merged.add_instances() = i;
    PrintJson(merged, std::cout);
  } else {
    PrintInstanceTable(all, std::cout);
  }
  return kExitOk;
}

int RunDelete(Session& s, const std::string& id_or_name) {
  std::string error;
  if (!s.Connect(&error)) return Fail(error);
  std::string id;
  if (int rc = ResolveInstance(s, id_or_name, &id); rc != kExitOk) return rc;
  v1::InstanceService::Stub stub(s.channel);
  v1::DeleteInstanceRequest request;
  request.set_id(id);
  v1::Instance instance;
  grpc::Status status = stub.DeleteInstance(s.Context().get(), request, &instance);
  if (!status.ok()) return FailRpc(status, s);
  ShowInstance(instance, s.format());
  return kExitOk;
}

}  // namespace

int ResolveInstance(Session& s, const std::string& id_or_name, std::string* id) {
  if (LooksLikeInstanceId(id_or_name)) {
    *id = id_or_name;
    return kExitOk;
  }
  v1::ListInstancesRequest request;
  request.set_page_size(500);
  std::vector<v1::Instance> all;
  grpc::Status status = ListEveryInstance(s, request, &all);
  if (!status.ok()) return FailRpc(status, s);
  std::vector<std::string> named;
  for (const auto& i : all) {
    if (i.name() == id_or_name) named.push_back(i.id());
  }
  if (named.empty()) {
    return Fail("no instance is named \"" + id_or_name + "\" (svctl list shows ids and names)");
  }
  if (named.size() > 1) {
    std::string ids;
    for (const auto& i : named) ids += (ids.empty() ? "" : ", ") + i;
    return Fail(std::to_string(named.size()) + " instances are named \"" + id_or_name +
                "\" (" + ids + "); give the id");
  }
  *id = named.front();
  return kExitOk;
}

void AddInstanceCommands(CLI::App& app, Action* action) {
  auto create_args = std::make_shared<CreateArgs>();
  auto* create = app.add_subcommand("create", "Create an instance");
  create->add_option("--gpus", create_args->gpus, "GPUs: 1-8, or a multiple of 8 up to 128")
      ->required();
  create->add_option("--name", create_args->name, "Name (lower-case letters, digits, dashes)");
  create->add_option("--image", create_args->image, "Image to run");
  create->add_option("--max-leaves", create_args->max_leaves,
                     "Gangs only: the most leaf switches to span (0: no limit)");
  create->add_option("--request-id", create_args->request_id,
                     "Idempotency key (default: a fresh UUID per invocation)");
  create->add_option("--mount", create_args->mounts,
                     "Public library item to mount read-only at /public/<name> (repeatable)");
  create->add_option("--port", create_args->ports,
                     "Container port to publish, e.g. 7860 (repeatable); see its URL in get");
  create->add_flag("--ssh", create_args->ssh,
                   "Publish port 22: log in as root with your SSH keys (svctl ssh-keys; the "
                   "image runs sshd)");
  create->add_flag("--movable", create_args->movable,
                   "Let svd restart it on another node to free whole nodes (1-7 GPUs; see "
                   "svctl movable)");
  create->add_flag("--wait", create_args->wait, "Wait until the instance is RUNNING");
  create->add_option("--wait-timeout", create_args->wait_s, "How long --wait waits, seconds");
  create->callback([=] { *action = [=](Session& s) { return RunCreate(s, *create_args); }; });

  auto movable_id = std::make_shared<std::string>();
  auto movable_value = std::make_shared<std::string>();
  auto* movable = app.add_subcommand(
      "movable",
      "Let svd restart a 1-7 GPU instance on another node (on) to free whole nodes, or not (off)");
  movable->add_option("id", *movable_id, "Instance id or name")->required();
  movable->add_option("value", *movable_value, "on or off")
      ->required()
      ->check(CLI::IsMember({"on", "off"}));
  movable->callback([=] {
    *action = [=](Session& s) {
      std::string error;
      if (!s.Connect(&error)) return Fail(error);
      std::string id;
      if (int rc = ResolveInstance(s, *movable_id, &id); rc != kExitOk) return rc;
      v1::InstanceService::Stub stub(s.channel);
      v1::Instance instance;
      grpc::Status status = SetMovable(stub, s, id, *movable_value == "on", &instance);
      if (!status.ok()) return FailRpc(status, s);
      ShowInstance(instance, s.format());
      return kExitOk;
    };
  });

  auto get_id = std::make_shared<std::string>();
  auto get_wait = std::make_shared<bool>(false);
  auto* get = app.add_subcommand("get", "Show one instance");
  get->add_option("id", *get_id, "Instance id or name")->required();
  get->add_flag("--wait", *get_wait, "Wait until it settles (RUNNING, STOPPED, FAILED, DELETED)");
  get->callback([=] {
    *action = [=](Session& s) { return RunGet(s, *get_id, *get_wait, 300); };
  });

  auto page_size = std::make_shared<int>(0);
  auto show_deleted = std::make_shared<bool>(false);
  auto* list = app.add_subcommand("list", "List instances");
  list->add_option("--page-size", *page_size, "Instances per page (default 50, max 500)");
  list->add_flag("--show-deleted", *show_deleted, "Include deleted instances");
  list->callback([=] {
    *action = [=](Session& s) { return RunList(s, *page_size, *show_deleted); };
  });

  auto delete_id = std::make_shared<std::string>();
  auto* del = app.add_subcommand("delete", "Delete an instance and release its GPUs");
  del->add_option("id", *delete_id, "Instance id or name")->required();
  del->callback([=] { *action = [=](Session& s) { return RunDelete(s, *delete_id); }; });
}

}  // namespace sv::cli
