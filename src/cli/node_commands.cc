// Scheduling commands: svctl resize, svctl admin nodes list|cordon|uncordon|
// drain, svctl admin quota set|get, svctl admin priority and svctl admin
// node-credential create|revoke. The admin ones use the admin key.
#include <iostream>

#include "CLI/CLI.hpp"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "cli/commands.h"
#include "sv/v1/admin.grpc.pb.h"
#include "sv/v1/agent.grpc.pb.h"
#include "sv/v1/instance.grpc.pb.h"

namespace sv::cli {
namespace {

constexpr int kNodePagesMax = 1000;

std::string NodeStateText(v1::FleetNodeState state) {
  switch (state) {
    case v1::FLEET_NODE_READY: return "ready";
    case v1::FLEET_NODE_CORDONED: return "cordoned";
    case v1::FLEET_NODE_DRAINING: return "draining";
    case v1::FLEET_NODE_DOWN: return "down";
    default: return "unknown";
  }
}

void PrintNodes(const std::vector<v1::FleetNode>& nodes, std::ostream& out) {
  std::vector<std::vector<std::string>> rows = {
      {"NAME", "STATE", "FREE", "GPUS", "INSTANCES", "LEAF", "POD", "ZONE"}};
  for (const auto& n : nodes) {
    std::string state = NodeStateText(n.state());
    if (n.state() == v1::FLEET_NODE_DOWN &&
        n.state_when_back() != v1::FLEET_NODE_STATE_UNSPECIFIED &&
        n.state_when_back() != v1::FLEET_NODE_READY) {
      state += " (" + NodeStateText(n.state_when_back()) + " when back)";
    }
    rows.push_back({n.name(), state, std::to_string(n.free_gpu_count()),
                    std::to_string(n.gpu_count()), std::to_string(n.instance_count()),
                    n.leaf_switch(), n.pod(), n.zone()});
  }
  PrintTable(rows, out);
}

bool ConnectAdmin(Session& s, std::string* error) {
  s.flags.admin = true;
  return s.Connect(error);
}

int RunListNodes(Session& s) {
  std::string error;
  if (!ConnectAdmin(s, &error)) return Fail(error);
  v1::SchedulerAdminService::Stub stub(s.channel);
  v1::ListFleetNodesRequest request;
  v1::ListFleetNodesResponse merged;
  for (int page = 0; page < kNodePagesMax; ++page) {
    v1::ListFleetNodesResponse response;
    grpc::Status status = stub.ListNodes(s.Context().get(), request, &response);
    if (!status.ok()) return FailRpc(status, s);
    for (const auto& n : response.nodes()) *merged.add_nodes() = n;
    if (response.next_page_token().empty()) break;
    request.set_page_token(response.next_page_token());
  }
  if (s.format() == Format::kJson) {
    PrintJson(merged, std::cout);
  } else {
    PrintNodes({merged.nodes().begin(), merged.nodes().end()}, std::cout);
  }
  return kExitOk;
}

struct FleetInstanceArgs {
  std::string tenant;
  std::string node;
  std::string state;
};

int RunListFleetInstances(Session& s, const FleetInstanceArgs& args) {
  std::string error;
  if (!ConnectAdmin(s, &error)) return Fail(error);
  v1::ListFleetInstancesRequest request;
  if (!args.state.empty()) {
    v1::InstanceState state = v1::INSTANCE_STATE_UNSPECIFIED;
    if (!v1::InstanceState_Parse(absl::AsciiStrToUpper(args.state), &state) ||
        state == v1::INSTANCE_STATE_UNSPECIFIED) {
      return Fail("--state must be pending, scheduled, starting, running, stopping, stopped, "
                  "deleted or failed, got '" + args.state + "'");
    }
    request.set_state(state);
  }
  if (!args.tenant.empty()) {
    if (int rc = ResolveTenant(s, args.tenant, request.mutable_tenant_id()); rc != kExitOk) {
      return rc;
    }
  }
  request.set_node(args.node);
  request.set_page_size(500);
  v1::SchedulerAdminService::Stub stub(s.channel);
  v1::ListFleetInstancesResponse merged;
  for (int page = 0; page < kNodePagesMax; ++page) {
    v1::ListFleetInstancesResponse response;
    grpc::Status status = stub.ListFleetInstances(s.Context().get(), request, &response);
    if (!status.ok()) return FailRpc(status, s);
    for (const auto& i : response.instances()) *merged.add_instances() = i;
    if (response.next_page_token().empty()) break;
    request.set_page_token(response.next_page_token());
  }
  if (s.format() == Format::kJson) {
    PrintJson(merged, std::cout);
  } else {
    PrintFleetInstanceTable({merged.instances().begin(), merged.instances().end()}, std::cout);
  }
  return kExitOk;
}

int RunNodeAction(Session& s, const std::string& action, const std::string& name) {
  std::string error;
  if (!ConnectAdmin(s, &error)) return Fail(error);
  v1::SchedulerAdminService::Stub stub(s.channel);
  grpc::Status status;
  v1::DrainNodeResponse response;
  if (action == "cordon") {
    v1::CordonNodeRequest request;
    request.set_name(name);
    status = stub.CordonNode(s.Context().get(), request, response.mutable_node());
  } else if (action == "uncordon") {
    v1::UncordonNodeRequest request;
    request.set_name(name);
    status = stub.UncordonNode(s.Context().get(), request, response.mutable_node());
  } else {
    v1::DrainNodeRequest request;
    request.set_name(name);
    status = stub.DrainNode(s.Context().get(), request, &response);
  }
  if (!status.ok()) return FailRpc(status, s);
  if (s.format() == Format::kJson) {
    PrintJson(response, std::cout);
    return kExitOk;
  }
  PrintNodes({response.node()}, std::cout);
  if (action == "drain") {
    std::cout << response.instances_to_move_size() << " instance(s) must move";
    for (const auto& i : response.instances_to_move()) {
      std::cout << "\n  " << i.instance_id() << "  tenant " << i.tenant_id() << "  "
                << i.gpu_count() << " GPUs  " << StateName(i.state());
    }
    std::cout << "\n";
  }
  return kExitOk;
}

int RunForgetNodeMounts(Session& s, const std::string& name, const std::string& reason) {
  std::string error;
  if (!ConnectAdmin(s, &error)) return Fail(error);
  v1::SchedulerAdminService::Stub stub(s.channel);
  v1::ForgetNodeMountsRequest request;
  request.set_name(name);
  request.set_reason(reason);
  v1::ForgetNodeMountsResponse response;
  grpc::Status status = stub.ForgetNodeMounts(s.Context().get(), request, &response);
  if (!status.ok()) return FailRpc(status, s);
  if (s.format() == Format::kJson) {
    PrintJson(response, std::cout);
    return kExitOk;
  }
  PrintNodes({response.node()}, std::cout);
  std::cout << response.released_count() << " volume attachment(s) released\n";
  return kExitOk;
}

int RunNodeCredential(Session& s, const std::string& verb, const std::string& arg) {
  std::string error;
  if (!ConnectAdmin(s, &error)) return Fail(error);
  v1::NodeCredentialService::Stub stub(s.channel);
  if (verb == "create") {
    v1::CreateNodeCredentialRequest request;
    request.set_node_name(arg);
    v1::CreateNodeCredentialResponse response;
    grpc::Status status = stub.CreateNodeCredential(s.Context().get(), request, &response);
    if (!status.ok()) return FailRpc(status, s);
    if (s.format() == Format::kJson) {
      PrintJson(response, std::cout);
    } else {
      std::cout << "credential " << response.credential_id() << " for node "
                << response.node_name() << " (shown once):\n" << response.credential() << "\n";
    }
    return kExitOk;
  }
  v1::RevokeNodeCredentialRequest request;
  request.set_credential_id(arg);
  v1::RevokeNodeCredentialResponse response;
  grpc::Status status = stub.RevokeNodeCredential(s.Context().get(), request, &response);
  if (!status.ok()) return FailRpc(status, s);
  if (s.format() == Format::kJson) {
    PrintJson(response, std::cout);
  } else {
    std::cout << "revoked " << response.credential_id() << " of node " << response.node_name()
              << "\n";
  }
  return kExitOk;
}

void AddNodeCredentialSubcommands(CLI::App& admin, Action* action) {
  auto* credential = admin.add_subcommand("node-credential", "Mint or revoke node credentials");
  credential->require_subcommand(1);
  for (const char* verb : {"create", "revoke"}) {
    const std::string what = verb;
    auto arg = std::make_shared<std::string>();
    auto* sub = credential->add_subcommand(
        verb, what == "create" ? "Mint a credential for a node's svagent (shown once)"
                               : "Revoke a credential: its agent is refused from now on");
    sub->add_option(what == "create" ? "node_name" : "credential_id", *arg,
                    what == "create" ? "Node name" : "Credential id (ncr-...)")
        ->required();
    sub->callback([=] {
      *action = [=](Session& s) { return RunNodeCredential(s, what, *arg); };
    });
  }
}

struct QuotaArgs {
  std::string tenant_id;
  int gpus_max = -1;
  int pending_max = -1;
  int instances_max = 0;
};

int RunQuota(Session& s, const QuotaArgs& a, bool set) {
  std::string error;
  if (!ConnectAdmin(s, &error)) return Fail(error);
  std::string tenant_id;
  if (int rc = ResolveTenant(s, a.tenant_id, &tenant_id); rc != kExitOk) return rc;
  v1::SchedulerAdminService::Stub stub(s.channel);
  v1::TenantQuota quota;
  grpc::Status status;
  if (set) {
    v1::SetTenantQuotaRequest request;
    request.mutable_quota()->set_tenant_id(tenant_id);
    request.mutable_quota()->set_gpus_in_use_max(a.gpus_max);
    request.mutable_quota()->set_pending_count_max(a.pending_max);
    request.mutable_quota()->set_instances_max(a.instances_max);
    status = stub.SetTenantQuota(s.Context().get(), request, &quota);
  } else {
    v1::GetTenantQuotaRequest request;
    request.set_tenant_id(tenant_id);
    status = stub.GetTenantQuota(s.Context().get(), request, &quota);
  }
  if (!status.ok()) return FailRpc(status, s);
  PrintJson(quota, std::cout);
  return kExitOk;
}

int RunPriority(Session& s, const std::string& id, int priority) {
  std::string error;
  if (!ConnectAdmin(s, &error)) return Fail(error);
  v1::SchedulerAdminService::Stub stub(s.channel);
  v1::SetInstancePriorityRequest request;
  request.set_instance_id(id);
  request.set_priority(priority);
  v1::InstancePriority response;
  grpc::Status status = stub.SetInstancePriority(s.Context().get(), request, &response);
  if (!status.ok()) return FailRpc(status, s);
  PrintJson(response, std::cout);
  return kExitOk;
}

int RunResize(Session& s, const std::string& id_or_name, int gpus) {
  std::string error;
  if (!s.Connect(&error)) return Fail(error);
  std::string id;
  if (int rc = ResolveInstance(s, id_or_name, &id); rc != kExitOk) return rc;
  v1::InstanceService::Stub stub(s.channel);
  v1::ResizeInstanceRequest request;
  request.set_id(id);
  request.set_gpu_count(gpus);
  v1::ResizeInstanceResponse response;
  grpc::Status status = stub.ResizeInstance(s.Context().get(), request, &response);
  if (!status.ok()) return FailRpc(status, s);
  if (s.format() == Format::kJson) {
    PrintJson(response, std::cout);
  } else {
    std::cout << "resized from " << response.previous_gpu_count() << " to "
              << response.instance().gpu_count() << " GPUs\n";
    PrintInstanceDetail(response.instance(), std::cout);
  }
  return kExitOk;
}

void AddNodeSubcommands(CLI::App& admin, Action* action) {
  auto* nodes = admin.add_subcommand("nodes", "List, cordon, uncordon and drain nodes; release a dead node's mounts");
  nodes->require_subcommand(1);
  nodes->add_subcommand("list", "Nodes with their state and free GPUs")->callback([=] {
    *action = [](Session& s) { return RunListNodes(s); };
  });
  for (const char* verb : {"cordon", "uncordon", "drain"}) {
    auto name = std::make_shared<std::string>();
    const std::string what = verb;
    auto* sub = nodes->add_subcommand(
        verb, what == "cordon"     ? "Take no new placements on a node"
              : what == "uncordon" ? "Make a cordoned or draining node ready again"
                                   : "Cordon a node and list the instances that must move");
    sub->add_option("name", *name, "Node name")->required();
    sub->callback([=] {
      *action = [=](Session& s) { return RunNodeAction(s, what, *name); };
    });
  }
  auto name = std::make_shared<std::string>();
  auto reason = std::make_shared<std::string>();
  auto* forget = nodes->add_subcommand(
      "forget-mounts",
      "For a down node that will not come back as it was (powered off, wiped): release "
      "the volumes its instances had mounted");
  forget->add_option("name", *name, "Node name")->required();
  forget->add_option("--reason", *reason, "Why nothing on the node can still mount a volume")
      ->required();
  forget->callback([=] {
    *action = [=](Session& s) { return RunForgetNodeMounts(s, *name, *reason); };
  });
}

void AddFleetInstancesSubcommand(CLI::App& admin, Action* action) {
  auto args = std::make_shared<FleetInstanceArgs>();
  auto* list = admin.add_subcommand(
      "instances", "Every tenant's instances (not deleted ones unless --state deleted)");
  list->add_option("--tenant", args->tenant, "Only this tenant's (id or name)");
  list->add_option("--node", args->node, "Only those holding GPUs on this node");
  list->add_option("--state", args->state, "Only this state, e.g. running or pending");
  list->callback([=] { *action = [=](Session& s) { return RunListFleetInstances(s, *args); }; });
}

void AddQuotaSubcommands(CLI::App& admin, Action* action) {
  auto* quota = admin.add_subcommand("quota", "Per-tenant scheduling quotas");
  quota->require_subcommand(1);
  auto set_args = std::make_shared<QuotaArgs>();
  auto* set = quota->add_subcommand("set", "Set a tenant's quota");
  set->add_option("tenant_id", set_args->tenant_id, "Tenant id or name")->required();
  set->add_option("--gpus-max", set_args->gpus_max, "GPUs in use at once")
      ->required()
      ->check(CLI::Range(0, 1000000));
  set->add_option("--pending-max", set_args->pending_max, "Pending instances at once")
      ->required()
      ->check(CLI::Range(0, 1000));
  set->add_option("--instances-max", set_args->instances_max,
                  "Unfinished instances at once (0: the default, 1000)")
      ->check(CLI::Range(0, 1000));
  set->callback([=] { *action = [=](Session& s) { return RunQuota(s, *set_args, true); }; });
  auto get_args = std::make_shared<QuotaArgs>();
  auto* get = quota->add_subcommand("get", "Show a tenant's quota");
  get->add_option("tenant_id", get_args->tenant_id, "Tenant id or name")->required();
  get->callback([=] { *action = [=](Session& s) { return RunQuota(s, *get_args, false); }; });
}

}  // namespace

void AddSchedulingCommands(CLI::App& app, Action* action) {
  auto id = std::make_shared<std::string>();
  auto gpus = std::make_shared<int>(0);
  auto* resize = app.add_subcommand("resize", "Grow or shrink a running whole-node instance");
  resize->add_option("id", *id, "Instance id or name")->required();
  resize->add_option("--gpus", *gpus, "New GPU count: a multiple of 8 from 8 to 128")
      ->required();
  resize->callback([=] { *action = [=](Session& s) { return RunResize(s, *id, *gpus); }; });

  CLI::App* admin = app.get_subcommand("admin");  // made by AddAdminCommands
  AddNodeSubcommands(*admin, action);
  AddFleetInstancesSubcommand(*admin, action);
  AddQuotaSubcommands(*admin, action);
  AddNodeCredentialSubcommands(*admin, action);
  auto instance = std::make_shared<std::string>();
  auto priority = std::make_shared<int>(0);
  auto* prio = admin->add_subcommand("priority", "Set an instance's queue priority");
  prio->add_option("instance_id", *instance, "Instance id")->required();
  prio->add_option("priority", *priority, "Higher goes first; default 0")
      ->required()
      ->check(CLI::Range(-1000, 1000));
  prio->callback([=] {
    *action = [=](Session& s) { return RunPriority(s, *instance, *priority); };
  });
}

}  // namespace sv::cli
