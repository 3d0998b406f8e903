#include "store/agent_store.h"

#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <pqxx/pqxx>

#include "absl/strings/str_cat.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/ids.h"
#include "common/status.h"
#include "spdlog/spdlog.h"
#include "store/instance_events.h"
#include "store/scheduling_store.h"
#include "store/sql_arrays.h"

namespace sv::store {
namespace {

// States in which an instance holds GPUs and its nodes must run it.
constexpr char kHoldingStates[] = "('SCHEDULED', 'STARTING', 'RUNNING', 'STOPPING')";

absl::Status UnknownInstance(const std::string& node_id, const std::string& instance_id) {
  return Error(absl::StatusCode::kNotFound, "UNKNOWN_INSTANCE",
               absl::StrCat("instance ", instance_id.substr(0, 64),
                            " holds no GPU on node ", node_id));
}

// Why a report names an instance that holds no GPU on the node: a late one
// (the instance exists and holds no GPU anywhere: it was deleted, stopped,
// ended or requeued after the agent sent the report; the next desired set
// tells the agent) or one the node cannot know (no such instance, or one
// placed on other nodes). `state`: the instance's state when it holds no GPU.
absl::Status NotHeldError(const std::string& node_id, const std::string& instance_id,
                          const std::optional<std::string>& state) {
  if (!state) return UnknownInstance(node_id, instance_id);
  return Error(absl::StatusCode::kFailedPrecondition, "STALE_REPORT",
               absl::StrCat("instance ", instance_id, " is ", *state,
                            " and holds no GPU; the report came after that change"));
}

absl::Status NotHeld(pqxx::work& txn, const std::string& node_id,
                     const std::string& instance_id) {
  auto rows = ExecPrepared(txn, "sv_agent_instance_state",
                           absl::StrCat("SELECT state FROM instances WHERE id = $1 AND state "
                                        "NOT IN ",
                                        kHoldingStates),
                           instance_id);
  if (rows.empty()) return NotHeldError(node_id, instance_id, std::nullopt);
  return NotHeldError(node_id, instance_id, rows[0][0].as<std::string>());
}

absl::Status InstanceNotFound(const std::string& id) {
  return Error(absl::StatusCode::kNotFound, "INSTANCE_NOT_FOUND",
               absl::StrCat("instance ", id, " not found"));
}

// Ends an instance that holds GPUs: releases them, forgets its start
// confirmations, and records the transition at `at`. Every caller is the
// platform ending it (its node reported it ended, the node went silent,
// the idle policy), not the tenant, so the tenant gets an instance_ended
// notice (migration 0113), which its webhook receives.
void EndInstance(pqxx::work& txn, const std::string& instance_id, const std::string& from,
                 const std::string& to, const std::string& reason, absl::Time at,
                 absl::Time now) {
  txn.exec_params("DELETE FROM gpu_reservations WHERE instance_id = $1", instance_id);
  txn.exec_params("DELETE FROM instance_node_starts WHERE instance_id = $1", instance_id);
  txn.exec_params(
      "WITH ended AS (UPDATE instances SET state = $2, state_reason = $3, "
      "updated_at = $4::timestamptz, running_since = NULL, idle_since = NULL WHERE id = $1 "
      "RETURNING tenant_id, name) "
      "INSERT INTO billing_notices (tenant_id, kind, instance_id, message, at) "
      "SELECT tenant_id, 'instance_ended', $1, 'Instance ' || name || ' (' || $1 || ') ' || "
      "CASE WHEN $2 = 'FAILED' THEN 'failed' ELSE 'stopped' END || ': ' || $3, "
      "$4::timestamptz FROM ended",
      instance_id, to, reason, SqlTime(now));
  RecordEvent(txn, instance_id, at, from, to, reason);
}

// The group commit of a kind of agent write (docs/agent.md), writing each
// batch with `write`; none with lanes <= 0.
template <typename Request, typename Result>
std::unique_ptr<GroupCommitter<Request, Result>> MakeCommitter(
    int lanes, typename GroupCommitter<Request, Result>::Writer write) {
  if (lanes <= 0) return nullptr;
  return std::make_unique<GroupCommitter<Request, Result>>(lanes, std::move(write));
}

// Whether a batch of `size` nodes whose transaction ended with `status` is
// done again node by node. As the create and delete batches: after any
// failure but an unreachable database, so one node's trouble costs the
// others nothing.
bool RedoAlone(const absl::Status& status, size_t size) {
  return !status.ok() && size > 1 && status.code() != absl::StatusCode::kUnavailable;
}

InstanceState ParseInstanceState(const std::string& s) {
  for (int i = 0; i <= static_cast<int>(InstanceState::kFailed); ++i) {
    auto state = static_cast<InstanceState>(i);
    if (InstanceStateName(state) == s) return state;
  }
  assert(false && "unknown instance state in database");
  return InstanceState::kFailed;
}

}  // namespace

// ---- Credentials -----------------------------------------------------------

absl::Status AgentStore::CreateNodeCredential(const std::string& id,
                                              const std::string& node_name,
                                              const std::string& secret_sha256,
                                              absl::Time now) {
  return db_.Transact([&](pqxx::work& txn) {
    txn.exec_params(
        "INSERT INTO node_credentials (id, node_name, secret_sha256, created_at) "
        "VALUES ($1, $2, $3, $4::timestamptz)",
        id, node_name, secret_sha256, SqlTime(now));
    return absl::OkStatus();
  });
}

absl::StatusOr<NodeCredentialRecord> AgentStore::LookupNodeCredential(const std::string& id) {
  std::optional<NodeCredentialRecord> found;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) {
    found.reset();
    auto rows = txn.exec_params(
        "SELECT node_name, secret_sha256, revoked_at IS NOT NULL FROM node_credentials "
        "WHERE id = $1",
        id);
    if (!rows.empty()) {
      found = NodeCredentialRecord{id, rows[0][0].as<std::string>(),
                                   rows[0][1].as<std::string>(), rows[0][2].as<bool>(),
                                   std::nullopt};
    }
    return absl::OkStatus();
  }));
  if (!found) {
    return Error(absl::StatusCode::kUnauthenticated, "NODE_CREDENTIAL_UNKNOWN",
                 "the node credential is not known");
  }
  return *found;
}

absl::StatusOr<NodeCredentialRecord> AgentStore::RevokeNodeCredential(const std::string& id,
                                                                      absl::Time now) {
  std::optional<NodeCredentialRecord> found;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) {
    found.reset();
    // coalesce keeps the first revocation's time (and then the row does
    // not change, so no second revocation signal is sent; migration 0070).
    auto rows = txn.exec_params(
        "UPDATE node_credentials SET revoked_at = coalesce(revoked_at, $2::timestamptz) "
        "WHERE id = $1 RETURNING node_name, secret_sha256, " + MicrosOf("revoked_at"),
        id, SqlTime(now));
    if (!rows.empty()) {
      found = NodeCredentialRecord{id, rows[0][0].as<std::string>(),
                                   rows[0][1].as<std::string>(), true,
                                   TimeFromMicros(rows[0][2].as<int64_t>())};
    }
    return absl::OkStatus();
  }));
  if (!found) {
    return Error(absl::StatusCode::kNotFound, "NODE_CREDENTIAL_NOT_FOUND",
                 "node credential " + id.substr(0, 64) + " not found");
  }
  return *found;
}

absl::StatusOr<std::vector<std::string>> AgentStore::RevokedNodeCredentials(
    const std::vector<std::string>& ids) {
  std::vector<std::string> revoked;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) {
    revoked.clear();
    auto rows = txn.exec_params(
        "SELECT id FROM node_credentials WHERE id = ANY($1::text[]) AND revoked_at IS NOT NULL "
        "ORDER BY id",
        TextArrayLiteral(ids));
    for (const auto& row : rows) revoked.push_back(row[0].as<std::string>());
    return absl::OkStatus();
  }));
  return revoked;
}

// ---- Registration and heartbeats -------------------------------------------

absl::StatusOr<std::string> AgentStore::RegisterNode(const NodeRecord& node, absl::Time now) {
  std::string node_id;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) -> absl::Status {
    // The fleet is a tree (zone > pod > leaf): a leaf in two pods or a pod
    // in two zones makes the scheduler's snapshot unusable, and every
    // queue pass and resize then failed, fleet-wide, for one node's bad
    // labels. Registrations check it one at a time.
    txn.exec("SELECT pg_advisory_xact_lock(hashtextextended('node-topology', 0))");
    auto clash = txn.exec_params(
        "SELECT name, zone, pod, leaf_switch FROM nodes WHERE name <> $1 "
        "AND ((leaf_switch = $4 AND pod <> $3) OR (pod = $3 AND zone <> $2)) "
        "ORDER BY name LIMIT 1",
        node.name, node.zone, node.pod, node.leaf_switch);
    if (!clash.empty()) {
      const auto& c = clash[0];
      return Error(absl::StatusCode::kFailedPrecondition, "INVALID_TOPOLOGY",
                   absl::StrCat("node ", node.name, " says leaf ", node.leaf_switch,
                                " is in pod ", node.pod, " of zone ", node.zone, ", but node ",
                                c[0].as<std::string>(), " has leaf ", c[3].as<std::string>(),
                                " in pod ", c[2].as<std::string>(), " of zone ",
                                c[1].as<std::string>(),
                                "; a leaf belongs to one pod and a pod to one zone: fix the "
                                "agent's --zone, --pod or --leaf-switch"));
    }
    // A node coming back from 'down' returns to the state an operator left
    // it in (cordoned, draining), else ready (migration 0122); cordoned and
    // draining are operator decisions and survive a reconnect too.
    auto row = txn.exec_params1(
        "INSERT INTO nodes (id, name, zone, pod, leaf_switch, gpu_model, gpu_count, "
        "state, simulated, last_heartbeat_at, created_at, fences_mounts, agent_connection) "
        "VALUES ($1, $2, $3, $4, $5, $6, $7, 'ready', $8, $9::timestamptz, $9::timestamptz, "
        "$10, NULLIF($11, '')) "
        "ON CONFLICT (name) DO UPDATE SET zone = EXCLUDED.zone, pod = EXCLUDED.pod, "
        "leaf_switch = EXCLUDED.leaf_switch, gpu_model = EXCLUDED.gpu_model, "
        "gpu_count = EXCLUDED.gpu_count, simulated = EXCLUDED.simulated, "
        "fences_mounts = EXCLUDED.fences_mounts, agent_connection = EXCLUDED.agent_connection, "
        "runtime_failing_since = NULL, "
        "last_heartbeat_at = EXCLUDED.last_heartbeat_at, "
        "state = CASE WHEN nodes.state = 'down' THEN coalesce(nodes.state_when_back, 'ready') "
        "ELSE nodes.state END, state_when_back = NULL "
        "RETURNING id",
        NewId("node"), node.name, node.zone, node.pod, node.leaf_switch, node.gpu_model,
        node.gpu_count, node.simulated, SqlTime(now), node.fences_mounts, node.connection_id);
    node_id = row[0].as<std::string>();
    return absl::OkStatus();
  }));
  return node_id;
}

absl::StatusOr<bool> AgentStore::Heartbeat(
    const std::string& node_id, absl::Time now,
    const std::optional<std::vector<std::string>>& listed, const std::string& connection_id,
    std::optional<bool> runtime_listed) {
  bool alive = false;
  bool began_failing = false;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) {
    // A heartbeat after the node was declared down does not revive it. The
    // fences are looked at in the same round trip; the partial index says
    // at once when no volume is fenced anywhere. Only the node's latest
    // connection ends them (migration 0125).
    // Whether its runtime could be listed, when the agent says (migration
    // 0127): the queue pass places nothing on a node that cannot.
    pqxx::row row = txn.exec_params1(
        "WITH hb AS (UPDATE nodes SET last_heartbeat_at = $2::timestamptz, "
        "  runtime_failing_since = CASE WHEN $6 = 'f' "
        "    THEN coalesce(runtime_failing_since, $2::timestamptz) END "
        "  WHERE id = $1 AND state <> 'down' "
        "  RETURNING agent_connection IS NOT DISTINCT FROM NULLIF($5, '') AS latest, "
        "    runtime_failing_since = $2::timestamptz AS began_failing) "
        "SELECT EXISTS (SELECT 1 FROM hb), (SELECT volume_attachments_unfence($1, "
        "  $4::text[], $2::timestamptz) WHERE $3 AND EXISTS (SELECT 1 FROM hb WHERE latest) "
        "  AND EXISTS (SELECT 1 FROM volume_attachments WHERE cardinality(fenced_nodes) > 0 "
        "   AND fenced_nodes @> ARRAY[$1])), "
        "  coalesce((SELECT began_failing FROM hb), false)",
        node_id, SqlTime(now), listed.has_value(),
        TextArrayLiteral(listed.value_or(std::vector<std::string>{})), connection_id,
        std::string(!runtime_listed.has_value() ? "" : *runtime_listed ? "t" : "f"));
    alive = row[0].as<bool>();
    began_failing = row[2].as<bool>();
    return absl::OkStatus();
  }));
  if (began_failing) {
    spdlog::warn("agent: node {} cannot list its container runtime; nothing is placed there "
                 "until it can",
                 node_id);
  }
  return alive;
}

// ---- Lifecycle ---------------------------------------------------------------

void AgentStore::SetDesiredBatchLanes(int lanes) {
  desired_ = MakeCommitter<DesiredSetRequest, DesiredSetResult>(
      lanes, [this](const auto& batch) { return DesiredForNodes(batch); });
}

absl::StatusOr<std::vector<AgentAssignment>> AgentStore::DesiredForNode(
    const std::string& node_id, absl::Time now) {
  // Keyed by node, as the confirmations: a node is in at most one batch in
  // flight.
  if (desired_ != nullptr) return desired_->Submit(node_id, DesiredSetRequest{node_id, now});
  return std::move(DesiredForNodes({DesiredSetRequest{node_id, now}}).front());
}

std::vector<DesiredSetResult> AgentStore::DesiredForNodes(
    const std::vector<DesiredSetRequest>& requests) {
  std::map<std::string, absl::Time> asked;  // Node -> its latest request.
  absl::Time told_at = absl::InfinitePast();
  for (const auto& r : requests) {
    auto [it, fresh] = asked.emplace(r.node_id, r.now);
    if (!fresh) it->second = std::max(it->second, r.now);
    told_at = std::max(told_at, r.now);
  }
  std::map<std::string, std::vector<AgentAssignment>> sets;  // Of the nodes not down.
  absl::Status status = db_.Transact([&](pqxx::work& txn) -> absl::Status {
    sets.clear();
    std::vector<std::string> nodes;
    for (const auto& [node, now] : asked) nodes.push_back(node);
    // Agents read these whenever their set changes: prepared statements,
    // parsed and planned once per connection (docs/reliability.md).
    for (const auto& row : ExecPrepared(txn, "sv_agent_nodes_up",
             "SELECT id FROM nodes WHERE id = ANY ($1::text[]) AND state <> 'down'",
             TextArrayLiteral(nodes))) {
      sets[row[0].as<std::string>()];
    }
    if (sets.empty()) return absl::OkStatus();
    std::vector<std::string> up;
    for (const auto& [node, set] : sets) up.push_back(node);
    auto rows = ExecPrepared(
        txn, "sv_agent_desired_nodes",
        absl::StrCat("SELECT r.node_id, i.id, i.image, i.state, array_agg(r.gpu_index ORDER BY "
                     "r.gpu_index)::text, i.queue_seq FROM gpu_reservations r JOIN instances i "
                     "ON i.id = r.instance_id JOIN nodes n ON n.id = r.node_id "
                     "WHERE r.node_id = ANY ($1::text[]) AND n.state <> 'down' AND i.state IN ",
                     kHoldingStates,
                     " GROUP BY r.node_id, i.id, i.image, i.state, i.queue_seq "
                     "ORDER BY r.node_id, i.id"),
        TextArrayLiteral(up));
    std::set<std::string> scheduled;  // Each once, though a gang is on several nodes.
    std::vector<std::string> all_ids;
    for (const auto& row : rows) {
      AgentAssignment a{row[1].as<std::string>(), {}, row[2].as<std::string>(),
                        row[3].as<std::string>() != "RUNNING", row[5].as<int64_t>(), {}, {}};
      std::string gpus = row[4].as<std::string>();  // "{0,1,2}"
      for (const auto& part : absl::StrSplit(gpus.substr(1, gpus.size() - 2), ',')) {
        int gpu = 0;
        if (absl::SimpleAtoi(part, &gpu)) a.gpu_indices.push_back(gpu);
      }
      if (row[3].as<std::string>() == "SCHEDULED") scheduled.insert(a.instance_id);
      all_ids.push_back(a.instance_id);
      sets[row[0].as<std::string>()].push_back(std::move(a));
    }
    if (!scheduled.empty()) {
      // In one statement for every node's set (a node handed eight
      // instances used to take 24 round trips here), locking in id order as
      // every batch does. Confirmations from an earlier run of an instance
      // do not count. `told` (migration 0095): its end must signal the
      // nodes from now on.
      const std::vector<std::string> scheduled_ids(scheduled.begin(), scheduled.end());
      std::set<std::string> moved;
      for (const auto& row : ExecPrepared(txn, "sv_agent_starting_many",
               "WITH moved AS (UPDATE instances SET state = 'STARTING', state_reason = $2, "
               "updated_at = $3::timestamptz, told = true WHERE id = ANY ($1::text[]) "
               "AND state = 'SCHEDULED' RETURNING id), "
               "forgotten AS (DELETE FROM instance_node_starts s USING moved "
               "WHERE s.instance_id = moved.id) "
               "INSERT INTO instance_events (instance_id, at, from_state, to_state, reason) "
               "SELECT id, $3::timestamptz, 'SCHEDULED', 'STARTING', $2 FROM moved "
               "RETURNING instance_id",
               TextArrayLiteral(scheduled_ids), "the node agents were told to start it",
               SqlTime(told_at))) {
        moved.insert(row[0].as<std::string>());
      }
      // One not moved here changed since the read above. Another node's
      // read may have moved it (a gang): it is told, and stays. Any other
      // (deleted, say) is not: its end sent no signal, so a set naming it
      // would not be corrected, and it is left out.
      std::vector<std::string> unmoved;
      for (const auto& id : scheduled_ids) {
        if (!moved.count(id)) unmoved.push_back(id);
      }
      if (!unmoved.empty()) {
        for (const auto& row : ExecPrepared(txn, "sv_agent_told",
                 absl::StrCat("SELECT id FROM instances WHERE id = ANY ($1::text[]) AND told "
                              "AND state IN ",
                              kHoldingStates),
                 TextArrayLiteral(unmoved))) {
          moved.insert(row[0].as<std::string>());
        }
        for (auto& [node, set] : sets) {
          std::erase_if(set, [&](const AgentAssignment& a) {
            return std::find(unmoved.begin(), unmoved.end(), a.instance_id) != unmoved.end() &&
                   !moved.count(a.instance_id);
          });
        }
      }
    }
    if (all_ids.empty()) return absl::OkStatus();
    // Ports, volumes, library mounts and SSH keys, for the nodes that run an
    // instance with any: most sets have none, and one probe of all the
    // batch's instances spares their nodes five statements each.
    std::set<std::string> with_resources;
    for (const auto& row : ExecPrepared(txn, "sv_agent_resources_probe",
             "SELECT u.id FROM unnest($1::text[]) AS u(id) WHERE "
             "EXISTS (SELECT 1 FROM instance_ports p WHERE p.instance_id = u.id) OR "
             "EXISTS (SELECT 1 FROM volume_attachments a WHERE a.instance_id = u.id) OR "
             "EXISTS (SELECT 1 FROM instance_library_mounts m WHERE m.instance_id = u.id) OR "
             "EXISTS (SELECT 1 FROM instances i JOIN ssh_keys k ON k.tenant_id = i.tenant_id "
             "WHERE i.id = u.id)",
             TextArrayLiteral(all_ids))) {
      with_resources.insert(row[0].as<std::string>());
    }
    if (with_resources.empty()) return absl::OkStatus();
    for (auto& [node, set] : sets) {
      const bool needs = std::any_of(set.begin(), set.end(), [&](const AgentAssignment& a) {
        return with_resources.count(a.instance_id) > 0;
      });
      if (!needs) continue;
      SV_RETURN_IF_ERROR(LoadAssignmentResources(txn, node, asked.at(node), set));
    }
    return absl::OkStatus();
  });
  std::vector<DesiredSetResult> results;
  results.reserve(requests.size());
  if (RedoAlone(status, requests.size())) {
    for (const auto& r : requests) results.push_back(std::move(DesiredForNodes({r}).front()));
    return results;
  }
  for (const auto& r : requests) {
    if (!status.ok()) {
      results.emplace_back(status);
    } else if (auto it = sets.find(r.node_id); it == sets.end()) {
      results.emplace_back(Error(absl::StatusCode::kFailedPrecondition, "NODE_DOWN",
                                 absl::StrCat("node ", r.node_id,
                                              " is down; its agent must register again")));
    } else {
      results.emplace_back(it->second);
    }
  }
  return results;
}

namespace {

// Locks an instance that holds GPUs on `node_id` and returns its state, or
// nothing when the node holds no such instance.
std::optional<std::string> LockHeldInstance(pqxx::work& txn, const std::string& node_id,
                                            const std::string& instance_id) {
  auto rows = ExecPrepared(txn, "sv_agent_lock_held",
      absl::StrCat("SELECT i.state FROM instances i WHERE i.id = $1 AND i.state IN ",
                   kHoldingStates,
                   " AND EXISTS (SELECT 1 FROM gpu_reservations r WHERE r.instance_id = "
                   "i.id AND r.node_id = $2) FOR UPDATE"),
      instance_id, node_id);
  if (rows.empty()) return std::nullopt;
  return rows[0][0].as<std::string>();
}

}  // namespace

absl::StatusOr<bool> AgentStore::ConfirmStarted(const std::string& node_id,
                                                const std::string& instance_id,
                                                absl::Time now) {
  auto results = ConfirmStartedMany(node_id, {instance_id}, now);
  if (!results.ok()) return results.status();
  return std::move(results->front());
}

void AgentStore::SetConfirmBatchLanes(int lanes) {
  confirms_ = MakeCommitter<StartConfirmation, StartConfirmationResult>(
      lanes, [this](const auto& batch) { return ConfirmStartedBatch(batch); });
}

StartConfirmationResult AgentStore::ConfirmStartedMany(
    const std::string& node_id, const std::vector<std::string>& instance_ids, absl::Time now) {
  if (instance_ids.empty()) return std::vector<absl::StatusOr<bool>>{};
  StartConfirmation confirmation{node_id, instance_ids, now};
  // Keyed by node: a node is in at most one batch in flight, and its
  // reports are written in the order they came.
  if (confirms_ != nullptr) return confirms_->Submit(node_id, std::move(confirmation));
  return std::move(ConfirmStartedBatch({std::move(confirmation)}).front());
}

std::vector<StartConfirmationResult> AgentStore::ConfirmStartedBatch(
    const std::vector<StartConfirmation>& confirmations) {
  using Pair = std::pair<std::string, std::string>;  // (instance id, node id)
  // Each (instance, node) once, at the latest time it was reported.
  std::map<Pair, absl::Time> reported;
  for (const auto& c : confirmations) {
    for (const auto& id : c.instance_ids) {
      auto [it, fresh] = reported.emplace(Pair{id, c.node_id}, c.now);
      if (!fresh) it->second = std::max(it->second, c.now);
    }
  }
  std::map<Pair, std::string> held;              // State under the lock, or RUNNING read.
  std::set<std::string> running;                 // RUNNING once the batch is written.
  std::map<std::string, std::string> released;   // Held nowhere: id -> state.
  absl::Status status = db_.Transact([&](pqxx::work& txn) -> absl::Status {
    held.clear();
    running.clear();
    released.clear();
    std::vector<std::string> ids, nodes;
    for (const auto& [pair, at] : reported) {
      ids.push_back(pair.first);
      nodes.push_back(pair.second);
    }
    // Running here and confirmed by this node: nothing to write (the usual
    // case of a heartbeat's list). Everything else held here is locked, in
    // id order as every batch locks instances, and read again under the lock.
    std::vector<std::string> pending_ids, pending_nodes;
    for (const auto& row : ExecPrepared(txn, "sv_agent_confirm_read_pairs",
             absl::StrCat("SELECT u.id, u.node, i.state = 'RUNNING' AND EXISTS (SELECT 1 FROM "
                          "instance_node_starts s WHERE s.instance_id = i.id AND s.node_id = "
                          "u.node) FROM unnest($1::text[], $2::text[]) AS u(id, node) JOIN "
                          "instances i ON i.id = u.id WHERE i.state IN ",
                          kHoldingStates,
                          " AND EXISTS (SELECT 1 FROM gpu_reservations r WHERE r.instance_id = "
                          "i.id AND r.node_id = u.node)"),
             TextArrayLiteral(ids), TextArrayLiteral(nodes))) {
      Pair pair{row[0].as<std::string>(), row[1].as<std::string>()};
      if (row[2].as<bool>()) {
        held[pair] = "RUNNING";
        running.insert(pair.first);
      } else {
        pending_ids.push_back(pair.first);
        pending_nodes.push_back(pair.second);
      }
    }
    std::vector<std::string> locked_ids, locked_nodes, locked_at;
    // Locked and waiting for confirmations: id -> (state, latest report here).
    std::map<std::string, std::pair<std::string, absl::Time>> starting;
    // A confirmation is a sign of life too, so a node that dies right after
    // it never ends a RUNNING interval before it began: node -> its latest
    // locked report here.
    std::map<std::string, absl::Time> alive;
    if (!pending_ids.empty()) {
      for (const auto& row : ExecPrepared(txn, "sv_agent_confirm_lock_pairs",
               absl::StrCat("SELECT u.id, u.node, i.state FROM unnest($1::text[], $2::text[]) "
                            "AS u(id, node) JOIN instances i ON i.id = u.id WHERE i.state IN ",
                            kHoldingStates,
                            " AND EXISTS (SELECT 1 FROM gpu_reservations r WHERE "
                            "r.instance_id = i.id AND r.node_id = u.node) ORDER BY i.id "
                            "FOR UPDATE OF i"),
               TextArrayLiteral(pending_ids), TextArrayLiteral(pending_nodes))) {
        Pair pair{row[0].as<std::string>(), row[1].as<std::string>()};
        const std::string state = row[2].as<std::string>();
        const absl::Time at = reported.at(pair);
        held[pair] = state;
        if (state == "RUNNING") running.insert(pair.first);
        locked_ids.push_back(pair.first);
        locked_nodes.push_back(pair.second);
        locked_at.push_back(SqlTime(at));
        auto [node_it, node_fresh] = alive.emplace(pair.second, at);
        if (!node_fresh) node_it->second = std::max(node_it->second, at);
        // Not SCHEDULED: no node has been told of this run yet (the first
        // desired set naming it makes it STARTING and forgets earlier
        // confirmations), so what confirms it is an earlier run's process
        // still running there, and it must not start the new run's rent.
        if (state == "STARTING") {
          auto [it, fresh] = starting.emplace(pair.first, std::make_pair(state, at));
          if (!fresh) it->second.second = std::max(it->second.second, at);
        }
      }
    }
    if (!locked_ids.empty()) {
      ExecPrepared(txn, "sv_agent_start_confirm_pairs",
          "INSERT INTO instance_node_starts (instance_id, node_id, confirmed_at) "
          "SELECT u.id, u.node, u.at FROM unnest($1::text[], $2::text[], "
          "$3::timestamptz[]) AS u(id, node, at) ON CONFLICT DO NOTHING",
          TextArrayLiteral(locked_ids), TextArrayLiteral(locked_nodes),
          TextArrayLiteral(locked_at));
      std::vector<std::string> alive_nodes, alive_at;
      for (const auto& [node, at] : alive) {
        alive_nodes.push_back(node);
        alive_at.push_back(SqlTime(at));
      }
      ExecPrepared(txn, "sv_agent_nodes_alive",
          "UPDATE nodes n SET last_heartbeat_at = GREATEST(n.last_heartbeat_at, u.at) "
          "FROM unnest($1::text[], $2::timestamptz[]) AS u(node, at) "
          "WHERE n.id = u.node AND n.state <> 'down'",
          TextArrayLiteral(alive_nodes), TextArrayLiteral(alive_at));
    }
    if (!starting.empty()) {
      // Those every node of which has now confirmed run, as of the latest
      // of their confirmations in this batch.
      std::vector<std::string> start_ids, start_from, start_at;
      for (const auto& [id, state_at] : starting) {
        start_ids.push_back(id);
        start_from.push_back(state_at.first);
        start_at.push_back(SqlTime(state_at.second));
      }
      const std::string reason = "every node confirmed the start";
      for (const auto& row : ExecPrepared(txn, "sv_agent_running_pairs",
               "WITH done AS (SELECT u.id, u.from_state, u.at FROM unnest($1::text[], "
               "$2::text[], $3::timestamptz[]) AS u(id, from_state, at) WHERE NOT EXISTS "
               "(SELECT 1 FROM gpu_reservations r WHERE r.instance_id = u.id AND NOT EXISTS "
               "(SELECT 1 FROM instance_node_starts s WHERE s.instance_id = u.id AND "
               "s.node_id = r.node_id))), "
               "moved AS (UPDATE instances i SET state = 'RUNNING', state_reason = $4, "
               "running_since = done.at, updated_at = done.at, idle_since = NULL "
               "FROM done WHERE i.id = done.id RETURNING i.id, done.from_state, done.at), "
               "events AS (INSERT INTO instance_events (instance_id, at, from_state, to_state, "
               "reason) SELECT id, at, from_state, 'RUNNING', $4 FROM moved), "
               // Webhooks hear of it (migration 0116); no webhook, no row.
               "notices AS (INSERT INTO billing_notices (tenant_id, kind, instance_id, "
               "message, at) SELECT i.tenant_id, 'instance_running', i.id, 'Instance ' || "
               "i.name || ' (' || i.id || ') is running on ' || i.gpu_count || "
               "CASE WHEN i.gpu_count = 1 THEN ' GPU' ELSE ' GPUs' END || "
               "'; its rent runs from ' || to_char(moved.at AT TIME ZONE 'UTC', "
               "'YYYY-MM-DD HH24:MI:SS') || ' UTC', moved.at FROM moved JOIN instances i ON "
               "i.id = moved.id WHERE EXISTS (SELECT 1 FROM tenant_webhooks w WHERE "
               "w.tenant_id = i.tenant_id)) "
               "SELECT id FROM moved",
               TextArrayLiteral(start_ids), TextArrayLiteral(start_from),
               TextArrayLiteral(start_at), reason)) {
        running.insert(row[0].as<std::string>());
      }
    }
    // The ids that hold no GPU on the node that named them: late reports,
    // or ones that node cannot know (NotHeldError).
    std::vector<std::string> unheld;
    for (const auto& [pair, at] : reported) {
      if (!held.count(pair)) unheld.push_back(pair.first);
    }
    if (!unheld.empty()) {
      for (const auto& row : ExecPrepared(txn, "sv_agent_instance_states",
               absl::StrCat("SELECT id, state FROM instances WHERE id = ANY ($1::text[]) "
                            "AND state NOT IN ",
                            kHoldingStates),
               TextArrayLiteral(unheld))) {
        released[row[0].as<std::string>()] = row[1].as<std::string>();
      }
    }
    return absl::OkStatus();
  });
  std::vector<StartConfirmationResult> results;
  results.reserve(confirmations.size());
  if (RedoAlone(status, confirmations.size())) {
    for (const auto& c : confirmations) {
      results.push_back(std::move(ConfirmStartedBatch({c}).front()));
    }
    return results;
  }
  for (const auto& c : confirmations) {
    if (!status.ok()) {
      results.emplace_back(status);
      continue;
    }
    std::vector<absl::StatusOr<bool>> answers;
    answers.reserve(c.instance_ids.size());
    for (const std::string& id : c.instance_ids) {
      if (held.count(Pair{id, c.node_id})) {
        answers.emplace_back(running.count(id) > 0);
      } else if (auto r = released.find(id); r != released.end()) {
        answers.emplace_back(NotHeldError(c.node_id, id, r->second));
      } else {
        answers.emplace_back(NotHeldError(c.node_id, id, std::nullopt));
      }
    }
    results.emplace_back(std::move(answers));
  }
  return results;
}

absl::Status AgentStore::ReportEnded(const std::string& node_id,
                                     const std::string& instance_id, bool failed,
                                     const std::string& reason, absl::Time now, int64_t run) {
  return db_.Transact([&](pqxx::work& txn) -> absl::Status {
    std::optional<std::string> held = LockHeldInstance(txn, node_id, instance_id);
    if (!held) return NotHeld(txn, node_id, instance_id);
    if (run != 0) {
      // Under the lock: the run is the instance's queue_seq, renewed by
      // every start and every move.
      const int64_t current =
          txn.exec_params1("SELECT queue_seq FROM instances WHERE id = $1", instance_id)[0]
              .as<int64_t>();
      if (current != run) {
        return Error(absl::StatusCode::kFailedPrecondition, "STALE_REPORT",
                     absl::StrCat("the report is of run ", run, " of instance ", instance_id,
                                  ", which has been started again since (run ", current,
                                  ")"));
      }
    }
    EndInstance(txn, instance_id, *held, failed ? "FAILED" : "STOPPED",
                reason.empty() ? std::string("the instance ended on its node") : reason, now,
                now);
    return absl::OkStatus();
  });
}

absl::StatusOr<std::vector<DownedNode>> AgentStore::MarkSilentNodesDown(
    absl::Duration timeout, absl::Time now) {
  std::vector<DownedNode> downed;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) {
    downed.clear();
    const std::string silent_before = SqlTime(now - timeout);
    if (txn.exec_params("SELECT 1 FROM nodes WHERE state <> 'down' "
                        "AND last_heartbeat_at < $1::timestamptz LIMIT 1",
                        silent_before)
            .empty()) {
      return absl::OkStatus();
    }
    // Under the placement lock: a pass that read the node as ready commits
    // first, and its placements on the node are stopped below. Without it
    // they landed after this sweep, on a node no longer asked for anything:
    // SCHEDULED or STARTING for ever, holding GPUs and the tenant's quota.
    TakePlacementLock(txn);
    auto nodes = txn.exec_params(
        "UPDATE nodes SET state = 'down', state_when_back = CASE WHEN state IN "
        "('cordoned', 'draining') THEN state END WHERE state <> 'down' "
        "AND last_heartbeat_at < $1::timestamptz RETURNING id, name, " +
            MicrosOf("last_heartbeat_at"),
        silent_before);
    for (const auto& node : nodes) {
      DownedNode d{node[0].as<std::string>(), node[1].as<std::string>(),
                   TimeFromMicros(node[2].as<int64_t>()), {}};
      // The instances are locked, in id order as every writer locks them,
      // and read again under the locks by a later statement: a resize, a
      // move or a delete of one that committed while this waited is seen
      // (its new reservations included), never overwritten from a stale
      // read (a deleted instance made STOPPED again, or a grown one left
      // holding GPUs while STOPPED).
      std::vector<std::string> candidates;
      for (const auto& row : txn.exec_params(
               "SELECT id FROM instances WHERE id IN (SELECT instance_id FROM "
               "gpu_reservations WHERE node_id = $1) ORDER BY id FOR UPDATE",
               d.node_id)) {
        candidates.push_back(row[0].as<std::string>());
      }
      if (candidates.empty()) {
        downed.push_back(std::move(d));
        continue;
      }
      auto instances = txn.exec_params(
          absl::StrCat("SELECT i.id, i.state, ", MicrosOf("i.running_since"),
                       " FROM instances i WHERE i.id = ANY($2::text[]) AND i.state IN ",
                       kHoldingStates,
                       " AND EXISTS (SELECT 1 FROM gpu_reservations r WHERE r.instance_id = "
                       "i.id AND r.node_id = $1) ORDER BY i.id"),
          d.node_id, TextArrayLiteral(candidates));
      for (const auto& row : instances) {
        const std::string id = row[0].as<std::string>();
        const std::string from = row[1].as<std::string>();
        // Billing ends at the last sign of life, never later; an instance
        // that started after it (it cannot, but clocks are clocks) ends at
        // its start, so its interval is empty rather than negative. (A
        // resize recorded after the last heartbeat moves the end to the
        // resize: migration 0118 never lets an interval end before its
        // latest event.)
        absl::Time at = now;
        if (from == "RUNNING") {
          at = d.last_heartbeat_at;
          if (!row[2].is_null()) at = std::max(at, TimeFromMicros(row[2].as<int64_t>()));
        }
        const std::string reason =
            absl::StrCat("node ", d.node_name, " missed heartbeats since ",
                         absl::FormatTime("%Y-%m-%d %H:%M:%E3S UTC", d.last_heartbeat_at,
                                          absl::UTCTimeZone()),
                         "; stopped as of its last heartbeat");
        EndInstance(txn, id, from, "STOPPED", reason, at, now);
        d.stopped_instance_ids.push_back(id);
      }
      downed.push_back(std::move(d));
    }
    return absl::OkStatus();
  }));
  return downed;
}

// ---- Telemetry and idle auto-stop --------------------------------------------

absl::StatusOr<std::vector<NodeGpuHolder>> AgentStore::RunningOnNode(
    const std::string& node_name) {
  std::vector<NodeGpuHolder> out;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) {
    out.clear();
    for (const auto& row : txn.exec_params(
             "SELECT r.gpu_index, i.id, i.gpu_count, i.idle_seconds, i.idle_utilization_pct, "
             "(SELECT count(*) FROM gpu_reservations o WHERE o.instance_id = i.id AND "
             " (o.node_id, o.gpu_index) < (r.node_id, r.gpu_index))::int, "
             "coalesce(floor(extract(epoch FROM i.running_since)), 0)::bigint "
             "FROM gpu_reservations r JOIN instances i ON i.id = r.instance_id "
             "JOIN nodes n ON n.id = r.node_id WHERE n.name = $1 AND i.state = 'RUNNING' "
             "ORDER BY r.gpu_index",
             node_name)) {
      NodeGpuHolder h;
      h.node_gpu_index = row[0].as<int>();
      h.instance_id = row[1].as<std::string>();
      h.instance_gpu_count = row[2].as<int>();
      h.idle_seconds = row[3].as<int>();
      h.idle_utilization_pct = row[4].as<int>();
      h.instance_gpu_ordinal = row[5].as<int>();
      h.running_since_s = row[6].as<int64_t>();
      out.push_back(std::move(h));
    }
    return absl::OkStatus();
  }));
  return out;
}

absl::Status AgentStore::UpdateIdleStreaks(const std::map<std::string, bool>& idle,
                                           absl::Time now, absl::Duration telemetry_interval) {
  // Longer than the writes' spacing plus a batch interval, so a streak
  // reported without pause is never taken for one with a silence.
  const absl::Duration gap =
      std::max(kIdleGap, kIdleSeenEvery + 3 * telemetry_interval);
  if (idle.empty()) return absl::OkStatus();
  std::vector<std::string> idle_ids, busy_ids;
  for (const auto& [id, is_idle] : idle) (is_idle ? idle_ids : busy_ids).push_back(id);
  return db_.Transact([&](pqxx::work& txn) {
    // The streak starts at the first idle batch and ends at a busy one; it
    // counts only the time telemetry saw it (migration 0126): idle_seen_at
    // is when an idle batch last said it goes on, and an idle batch after a
    // silence of more than `gap` moves the start forward by the silence.
    // Every node sends a batch every few seconds (10 s by default), so a
    // streak in progress writes its row only at the first batch at least
    // kIdleSeenEvery after the last write, and once more when it has lasted
    // its policy's duration, for the monitor to stop it.
    txn.exec_params(
        "UPDATE instances SET "
        "idle_since = CASE WHEN id = ANY($2::text[]) THEN NULL "
        "  WHEN idle_since IS NULL THEN $3::timestamptz "
        "  WHEN $3::timestamptz - coalesce(idle_seen_at, idle_since) > make_interval(secs => $5) "
        "  THEN idle_since + ($3::timestamptz - coalesce(idle_seen_at, idle_since)) "
        "  ELSE idle_since END, "
        "idle_seen_at = CASE WHEN id = ANY($2::text[]) THEN NULL ELSE $3::timestamptz END "
        "WHERE (id = ANY($1::text[]) AND state = 'RUNNING' AND (idle_since IS NULL "
        "  OR $3::timestamptz - coalesce(idle_seen_at, idle_since) >= make_interval(secs => $4) "
        "  OR ($3::timestamptz >= idle_since + make_interval(secs => idle_seconds) "
        "      AND coalesce(idle_seen_at, idle_since) "
        "          < idle_since + make_interval(secs => idle_seconds)))) "
        "OR (id = ANY($2::text[]) AND idle_since IS NOT NULL)",
        TextArrayLiteral(idle_ids), TextArrayLiteral(busy_ids), SqlTime(now),
        absl::ToInt64Seconds(kIdleSeenEvery), absl::ToDoubleSeconds(gap));
    return absl::OkStatus();
  });
}

absl::StatusOr<std::vector<std::string>> AgentStore::StopIdleInstances(absl::Time now) {
  std::vector<std::string> stopped;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) {
    stopped.clear();
    auto rows = txn.exec_params(
        "SELECT id, idle_seconds, idle_utilization_pct FROM instances "
        "WHERE state = 'RUNNING' AND idle_seconds > 0 AND idle_since IS NOT NULL "
        "AND idle_since + make_interval(secs => idle_seconds) <= idle_seen_at "
        "AND idle_seen_at <= $1::timestamptz "
        "ORDER BY id FOR UPDATE",
        SqlTime(now));
    for (const auto& row : rows) {
      const std::string id = row[0].as<std::string>();
      const std::string reason =
          absl::StrCat("idle: average GPU utilization below ", row[2].as<int>(), "% for ",
                       row[1].as<int>(), " s (auto-stop policy)");
      EndInstance(txn, id, "RUNNING", "STOPPED", reason, now, now);
      stopped.push_back(id);
    }
    return absl::OkStatus();
  }));
  return stopped;
}

// ---- Tenant views and settings -----------------------------------------------

absl::StatusOr<std::vector<InstanceEventRecord>> AgentStore::ListInstanceEvents(
    const std::string& tenant_id, const std::string& instance_id, int64_t after_id,
    int limit) {
  assert(limit > 0 && limit <= 1001);
  std::vector<InstanceEventRecord> events;
  bool found = false;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) {
    events.clear();
    found = !txn.exec_params("SELECT 1 FROM instances WHERE tenant_id = $1 AND id = $2",
                             tenant_id, instance_id)
                 .empty();
    if (!found) return absl::OkStatus();
    auto rows = txn.exec_params(
        "SELECT e.id, " + MicrosOf("e.at") +
            ", e.from_state, e.to_state, e.reason FROM instance_events e "
            "JOIN instances i ON i.id = e.instance_id "
            "WHERE i.tenant_id = $1 AND e.instance_id = $2 AND e.id > $3 "
            "ORDER BY e.id LIMIT $4",
        tenant_id, instance_id, after_id, limit);
    for (const auto& row : rows) {
      InstanceEventRecord e;
      e.id = row[0].as<int64_t>();
      e.at = TimeFromMicros(row[1].as<int64_t>());
      if (!row[2].is_null()) e.from_state = ParseInstanceState(row[2].as<std::string>());
      e.to_state = ParseInstanceState(row[3].as<std::string>());
      e.reason = row[4].as<std::string>();
      events.push_back(std::move(e));
    }
    return absl::OkStatus();
  }));
  if (!found) return InstanceNotFound(instance_id);
  return events;
}

namespace {

// Runs `update` on the tenant's instance under its row lock unless the
// instance is finished (DELETED, FAILED), which is left as it ended:
// FAILED_PRECONDITION / INSTANCE_FINISHED, "instance X is STATE and <what>".
absl::Status UpdateUnfinished(Database& db, const std::string& tenant_id,
                              const std::string& instance_id, const char* what,
                              const std::function<void(pqxx::work&)>& update) {
  std::optional<std::string> state;
  SV_RETURN_IF_ERROR(db.Transact([&](pqxx::work& txn) {
    state.reset();
    auto rows = txn.exec_params(
        "SELECT state FROM instances WHERE tenant_id = $1 AND id = $2 FOR NO KEY UPDATE",
        tenant_id, instance_id);
    if (rows.empty()) return absl::OkStatus();
    state = rows[0][0].as<std::string>();
    if (*state == "DELETED" || *state == "FAILED") return absl::OkStatus();
    update(txn);
    return absl::OkStatus();
  }));
  if (!state.has_value()) return InstanceNotFound(instance_id);
  if (*state == "DELETED" || *state == "FAILED") {
    return Error(absl::StatusCode::kFailedPrecondition, "INSTANCE_FINISHED",
                 absl::StrCat("instance ", instance_id, " is ", *state, " and ", what));
  }
  return absl::OkStatus();
}

}  // namespace

// A finished instance takes no policy: the write moved a deleted instance's
// update time (shown as when it was deleted) and answered OK.
absl::Status AgentStore::SetIdlePolicy(const std::string& tenant_id,
                                       const std::string& instance_id, int idle_seconds,
                                       int utilization_pct, absl::Time now) {
  return UpdateUnfinished(db_, tenant_id, instance_id, "has no idle policy to set",
                          [&](pqxx::work& txn) {
                            txn.exec_params(
                                "UPDATE instances SET idle_seconds = $2, "
                                "idle_utilization_pct = $3, idle_since = NULL, "
                                "updated_at = $4::timestamptz WHERE id = $1",
                                instance_id, idle_seconds, utilization_pct, SqlTime(now));
                          });
}

absl::Status AgentStore::SetInstanceMovable(const std::string& tenant_id,
                                            const std::string& instance_id, bool movable,
                                            absl::Time now) {
  return UpdateUnfinished(db_, tenant_id, instance_id, "can no longer be moved or pinned",
                          [&](pqxx::work& txn) {
                            txn.exec_params(
                                "UPDATE instances SET movable = $2, "
                                "updated_at = $3::timestamptz "
                                "WHERE id = $1 AND movable IS DISTINCT FROM $2",
                                instance_id, movable, SqlTime(now));
                          });
}

}  // namespace sv::store
