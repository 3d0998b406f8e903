#include "api/internal/agent_resources.h"

#include <map>

#include "absl/strings/match.h"
#include "common/status.h"

namespace sv::api::internal {
namespace {

constexpr int kReportMountsMax = 256;
constexpr size_t kAddressLengthMax = 255;

// "ipv4:10.0.0.5:43122" -> "10.0.0.5"; "ipv6:[::1]:43122" -> "::1".
std::string PeerHost(const std::string& peer) {
  std::string rest = peer;
  if (absl::StartsWith(rest, "ipv4:")) {
    rest = rest.substr(5);
    return rest.substr(0, rest.rfind(':'));
  }
  if (absl::StartsWith(rest, "ipv6:")) {
    rest = rest.substr(5);
    if (!rest.empty() && rest[0] == '[') return rest.substr(1, rest.find(']') - 1);
    return rest.substr(0, rest.rfind(':'));
  }
  return "";
}

}  // namespace

void AddAssignmentResources(const store::AgentAssignment& a, v1::InstanceAssignment* out) {
  for (const auto& m : a.mounts) {
    auto* v = out->add_volumes();
    v->set_source(m.source);
    v->set_target(m.target);
    v->set_read_only(m.read_only);
    v->set_volume_id(m.volume_id);
  }
  for (const auto& p : a.ports) {
    auto* port = out->add_ports();
    port->set_host_port(p.node_port);
    port->set_container_port(p.container_port);
    port->set_protocol(p.protocol);
  }
  for (const auto& k : a.authorized_keys) out->add_authorized_keys(k);
}

bool SameAssignmentResources(const store::AgentAssignment& a, const store::AgentAssignment& b) {
  return a.mounts == b.mounts && a.ports == b.ports && a.authorized_keys == b.authorized_keys;
}

void RememberSentMounts(const std::vector<store::AgentAssignment>& sent,
                        std::set<std::pair<std::string, std::string>>& ever_sent) {
  for (const auto& a : sent) {
    for (const auto& m : a.mounts) {
      if (!m.volume_id.empty()) ever_sent.insert({a.instance_id, m.volume_id});
    }
  }
}

absl::Status RememberEarlierMounts(store::Database& db, const std::string& node_id,
                                   std::set<std::pair<std::string, std::string>>& ever_sent) {
  return db.Transact([&](pqxx::work& txn) -> absl::Status {
    auto rows = store::ExecPrepared(
        txn, "sv_agent_earlier_mounts",
        "SELECT DISTINCT a.instance_id, a.volume_id FROM volume_attachments a "
        "JOIN gpu_reservations r ON r.instance_id = a.instance_id AND r.node_id = $1",
        node_id);
    for (const auto& r : rows) ever_sent.insert({r[0].as<std::string>(), r[1].as<std::string>()});
    return absl::OkStatus();
  });
}

absl::Status SettleUnsentDetaches(store::Database& db, const std::string& node_id,
                                  const std::set<std::pair<std::string, std::string>>& ever_sent,
                                  absl::Time now) {
  return db.Transact([&](pqxx::work& txn) -> absl::Status {
    auto rows = store::ExecPrepared(
        txn, "sv_agent_unsent_detaches",
        "SELECT DISTINCT a.instance_id, a.volume_id FROM volume_attachments a "
        "JOIN gpu_reservations r ON r.instance_id = a.instance_id AND r.node_id = $1 "
        "WHERE a.state = 'detaching' AND NOT ($1 = ANY(a.confirmed_nodes))",
        node_id);
    std::map<std::string, std::vector<store::ReportedMount>> settle;
    for (const auto& r : rows) {
      std::pair<std::string, std::string> key{r[0].as<std::string>(), r[1].as<std::string>()};
      if (!ever_sent.count(key)) settle[key.first];
    }
    for (const auto& [instance_id, none] : settle) {
      // What the agent was sent for the instance, less never-sent volumes:
      // reporting the sent ones keeps their attaches waiting for the agent.
      std::vector<store::ReportedMount> sent;
      for (const auto& [i, v] : ever_sent) {
        if (i == instance_id) sent.push_back({v, ""});
      }
      auto status = store::ConfirmDetachesOnly(txn, node_id, instance_id, sent, now);
      if (!status.ok()) return status;
    }
    return absl::OkStatus();
  });
}

absl::Status RecordNodeNetwork(store::Database& db, const std::string& node_id,
                               const v1::RegisterNode& registration,
                               const std::string& grpc_peer) {
  std::string address = registration.advertise_address();
  if (address.size() > kAddressLengthMax) {
    return Error(absl::StatusCode::kInvalidArgument, "INVALID_ADDRESS",
                 "advertise_address is longer than 255 characters");
  }
  if (address.empty()) address = PeerHost(grpc_peer);
  return db.Transact([&](pqxx::work& txn) {
    return store::SetNodeNetwork(txn, node_id, address, registration.node_port_min(),
                                 registration.node_port_max());
  });
}

absl::Status HandleMountReport(store::Database& db, const std::string& node_id,
                               const v1::MountReport& report, absl::Time now) {
  if (report.mounts_size() > kReportMountsMax) {
    return Error(absl::StatusCode::kInvalidArgument, "TOO_MANY_MOUNTS",
                 "a mount report lists more than 256 mounts");
  }
  std::vector<store::ReportedMount> mounts;
  for (const auto& m : report.mounts()) mounts.push_back({m.volume_id(), m.target()});
  return db.Transact([&](pqxx::work& txn) {
    return store::ConfirmMounts(txn, node_id, report.instance_id(), mounts, report.error(), now);
  });
}

}  // namespace sv::api::internal
