// svctl volumes create|list|get|delete|attach|detach|move (docs/storage.md).
#include <cstring>
#include <iostream>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "cli/commands.h"
#include "common/ids.h"
#include "sv/v1/volume.grpc.pb.h"

namespace sv::cli {
namespace {

std::string StateOf(const v1::Volume& v) {
  std::string s = v1::VolumeState_Name(v.state());
  return s == "VOLUME_DELETED" ? "DELETED" : s;
}

void PrintVolume(const v1::Volume& v, Format format) {
  if (format == Format::kJson) {
    PrintJson(v, std::cout);
    return;
  }
  std::vector<std::vector<std::string>> rows = {
      {"id:", v.id()},
      {"name:", v.name()},
      {"size:", absl::StrCat(v.size_gib(), " GiB")},
      {"kind:", v.kind() == v1::NODE_LOCAL ? "node-local" : "network"},
      {"read-many:", v.read_many() ? "yes" : "no"},
      {"state:", StateOf(v)}};
  if (!v.node_id().empty()) rows.push_back({"node:", v.node_id()});
  for (const auto& a : v.attachments()) {
    std::string state = v1::AttachmentState_Name(a.state()).substr(strlen("ATTACHMENT_"));
    rows.push_back({"attachment:", absl::StrCat(a.instance_id(), " at ", a.mount_path(),
                                                a.read_only() ? " (ro) " : " (rw) ", state,
                                                a.reason().empty() ? "" : ": " + a.reason())});
  }
  if (!v.move_to_instance_id().empty()) rows.push_back({"moving to:", v.move_to_instance_id()});
  if (v.has_unpaid_since_time()) {
    rows.push_back({"unpaid since:", FormatTime(v.unpaid_since_time())});
    if (v.has_unpaid_delete_time()) {
      rows.push_back({"deleted at:", absl::StrCat(FormatTime(v.unpaid_delete_time()),
                                                  " unless storage is paid (top up)")});
    }
  }
  PrintTable(rows, std::cout);
}

template <typename Call>
// `instance`, when given, is the instance argument as typed: an id or a
// name, resolved to the id before the call.
Action VolumeCall(Call call, std::shared_ptr<std::string> instance = nullptr) {
  return [call, instance](Session& s) {
    std::string error;
    if (!s.Connect(&error)) return Fail(error);
    if (instance) {
      std::string id;
      if (int rc = ResolveInstance(s, *instance, &id); rc != kExitOk) return rc;
      *instance = id;
    }
    v1::VolumeService::Stub stub(s.channel);
    v1::Volume volume;
    grpc::Status status = call(s, stub, &volume);
    if (!status.ok()) return FailRpc(status, s);
    PrintVolume(volume, s.format());
    return kExitOk;
  };
}

int RunList(Session& s, bool show_deleted) {
  std::string error;
  if (!s.Connect(&error)) return Fail(error);
  v1::VolumeService::Stub stub(s.channel);
  v1::ListVolumesRequest request;
  request.set_show_deleted(show_deleted);
  v1::ListVolumesResponse merged;
  for (int page = 0; page < 1000; ++page) {
    v1::ListVolumesResponse response;
    grpc::Status status = stub.ListVolumes(s.Context().get(), request, &response);
    if (!status.ok()) return FailRpc(status, s);
    for (const auto& v : response.volumes()) *merged.add_volumes() = v;
    if (response.next_page_token().empty()) break;
    request.set_page_token(response.next_page_token());
  }
  if (s.format() == Format::kJson) {
    PrintJson(merged, std::cout);
    return kExitOk;
  }
  std::vector<std::vector<std::string>> rows = {
      {"ID", "NAME", "SIZE", "KIND", "STATE", "ATTACHED TO"}};
  for (const auto& v : merged.volumes()) {
    std::string to;
    for (const auto& a : v.attachments()) to += (to.empty() ? "" : ",") + a.instance_id();
    rows.push_back({v.id(), v.name(), absl::StrCat(v.size_gib(), "G"),
                    v.kind() == v1::NODE_LOCAL ? "node-local" : "network", StateOf(v),
                    to.empty() ? "-" : to});
  }
  PrintTable(rows, std::cout);
  return kExitOk;
}

}  // namespace

void AddVolumeCommands(CLI::App& app, Action* action) {
  auto* volumes = app.add_subcommand("volumes", "Cloud disks: create, attach, detach, move");
  volumes->require_subcommand(1);

  auto kind = std::make_shared<std::string>("network");
  auto* c = volumes->add_subcommand("create", "Create a volume");
  auto size = std::make_shared<int>(0);
  auto name = std::make_shared<std::string>();
  auto node = std::make_shared<std::string>();
  auto read_many = std::make_shared<bool>(false);
  auto request_id = std::make_shared<std::string>();
  c->add_option("--size-gib", *size, "Size in GiB (1-65536)")->required();
  c->add_option("--name", *name, "Name (lower-case letters, digits, dashes)");
  c->add_option("--kind", *kind, "network (default) or node-local")
      ->check(CLI::IsMember({"network", "node-local"}));
  c->add_option("--node", *node, "node-local: the node (id or name) it lives on");
  c->add_flag("--read-many", *read_many, "Many instances may mount it read-only");
  c->add_option("--request-id", *request_id, "Idempotency key (default: a fresh UUID)");
  c->callback([=] {
    *action = VolumeCall([=](Session& s, v1::VolumeService::Stub& stub, v1::Volume* out) {
      v1::CreateVolumeRequest request;
      auto* v = request.mutable_volume();
      v->set_name(*name);
      v->set_size_gib(*size);
      v->set_kind(*kind == "node-local" ? v1::NODE_LOCAL : v1::NETWORK);
      v->set_node_id(*node);
      v->set_read_many(*read_many);
      request.set_request_id(request_id->empty() ? NewUuid() : *request_id);
      return stub.CreateVolume(s.Context().get(), request, out);
    });
  });

  auto show_deleted = std::make_shared<bool>(false);
  auto* l = volumes->add_subcommand("list", "List volumes");
  l->add_flag("--show-deleted", *show_deleted, "Include deleted volumes");
  l->callback([=] { *action = [=](Session& s) { return RunList(s, *show_deleted); }; });

  auto id = std::make_shared<std::string>();
  auto* g = volumes->add_subcommand("get", "Show a volume");
  g->add_option("id", *id, "Volume id")->required();
  g->callback([=] {
    *action = VolumeCall([=](Session& s, v1::VolumeService::Stub& stub, v1::Volume* out) {
      v1::GetVolumeRequest request;
      request.set_id(*id);
      return stub.GetVolume(s.Context().get(), request, out);
    });
  });

  auto* d = volumes->add_subcommand("delete", "Delete a volume (refused while attached)");
  d->add_option("id", *id, "Volume id")->required();
  d->callback([=] {
    *action = VolumeCall([=](Session& s, v1::VolumeService::Stub& stub, v1::Volume* out) {
      v1::DeleteVolumeRequest request;
      request.set_id(*id);
      return stub.DeleteVolume(s.Context().get(), request, out);
    });
  });

  auto instance = std::make_shared<std::string>();
  auto mount_path = std::make_shared<std::string>();
  auto read_only = std::make_shared<bool>(false);
  auto* a = volumes->add_subcommand("attach", "Attach a volume to an instance (also running)");
  a->add_option("id", *id, "Volume id")->required();
  a->add_option("instance", *instance, "Instance id or name")->required();
  a->add_option("--mount-path", *mount_path, "Where it appears (default /mnt/<volume name>)");
  a->add_flag("--read-only", *read_only, "Mount read-only");
  a->callback([=] {
    *action = VolumeCall([=](Session& s, v1::VolumeService::Stub& stub, v1::Volume* out) {
      v1::AttachVolumeRequest request;
      request.set_volume_id(*id);
      request.set_instance_id(*instance);
      request.set_mount_path(*mount_path);
      request.set_read_only(*read_only);
      return stub.AttachVolume(s.Context().get(), request, out);
    }, instance);
  });

  auto* de = volumes->add_subcommand("detach", "Detach a volume from an instance");
  de->add_option("id", *id, "Volume id")->required();
  de->add_option("instance", *instance, "Instance id or name")->required();
  de->callback([=] {
    *action = VolumeCall([=](Session& s, v1::VolumeService::Stub& stub, v1::Volume* out) {
      v1::DetachVolumeRequest request;
      request.set_volume_id(*id);
      request.set_instance_id(*instance);
      return stub.DetachVolume(s.Context().get(), request, out);
    }, instance);
  });

  auto* m = volumes->add_subcommand("move", "Move a volume to another instance of yours");
  m->add_option("id", *id, "Volume id")->required();
  m->add_option("instance", *instance, "Target instance id or name")->required();
  m->add_option("--mount-path", *mount_path, "Where it appears (default /mnt/<volume name>)");
  m->callback([=] {
    *action = VolumeCall([=](Session& s, v1::VolumeService::Stub& stub, v1::Volume* out) {
      v1::MoveVolumeRequest request;
      request.set_volume_id(*id);
      request.set_to_instance_id(*instance);
      request.set_mount_path(*mount_path);
      return stub.MoveVolume(s.Context().get(), request, out);
    }, instance);
  });
}

}  // namespace sv::cli
