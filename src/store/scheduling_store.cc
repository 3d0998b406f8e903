#include "store/scheduling_store.h"

#include <algorithm>
#include <cassert>
#include <pqxx/pqxx>
#include <map>
#include <set>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "store/instance_events.h"
#include "store/sql_arrays.h"

namespace sv::store {
namespace {

// Shared by every svd replica: serialises queue passes, resizes and node
// state changes cluster-wide (the same key the foundation placer used).
constexpr int64_t kPlacementLockKey = 0x5356'0002;

}  // namespace

void TakePlacementLock(pqxx::work& txn) {
  txn.exec(absl::StrCat("SELECT pg_advisory_xact_lock(", kPlacementLockKey, ")"));
}

namespace {

// Why some of the waiting instances are not decided on this pass
// (docs/storage.md).
// - A volume it writes may still be mounted on a node it left: started
//   elsewhere, it would be that volume's second writer (migration 0124; the
//   partial index holds only fenced rows).
// - It shares a node-local volume that is on no node yet with an instance
//   ahead of it in the queue, or with one already placed: the volume goes
//   where that one is placed. Two such instances decided in one pass could
//   be placed on two nodes; the second was then left out when the pass
//   wrote, and if the pass had moved instances for it, the pass was rolled
//   back, the same every time, and placed nothing for anyone.
struct VolumeHolds {
  std::map<std::string, std::string> reasons;  // Instance -> why.
  int fenced = 0;                              // Of them, held for a fence.
};

VolumeHolds HeldForVolumes(pqxx::work& txn, const std::vector<PendingRow>& pending) {
  std::vector<std::string> ids;
  for (const PendingRow& p : pending) ids.push_back(p.id);
  VolumeHolds holds;
  // Instance -> (volume, an instance of it already placed, or "").
  std::multimap<std::string, std::pair<std::string, std::string>> unbound;
  for (const auto& row : txn.exec_params(
           "(SELECT DISTINCT ON (a.instance_id) a.instance_id, a.volume_id, "
           "  volume_fence_reason(a.fenced_nodes), NULL FROM volume_attachments a "
           " WHERE cardinality(a.fenced_nodes) > 0 AND NOT a.read_only "
           "  AND a.state <> 'detaching' AND a.instance_id = ANY($1::text[]) "
           " ORDER BY a.instance_id, a.volume_id) "
           "UNION ALL "
           "(SELECT a.instance_id, a.volume_id, NULL, "
           "  (SELECT min(o.instance_id) FROM volume_attachments o "
           "   WHERE o.volume_id = a.volume_id AND o.instance_id <> a.instance_id "
           "     AND EXISTS (SELECT 1 FROM gpu_reservations r "
           "                 WHERE r.instance_id = o.instance_id)) "
           " FROM volume_attachments a JOIN volumes v ON v.id = a.volume_id "
           " WHERE a.instance_id = ANY($1::text[]) AND v.kind = 'node_local' "
           "  AND v.node_id IS NULL)",
           TextArrayLiteral(ids))) {
    if (row[2].is_null()) {
      unbound.emplace(row[0].as<std::string>(),
                      std::make_pair(row[1].as<std::string>(),
                                     row[3].is_null() ? std::string() : row[3].as<std::string>()));
    } else {
      holds.reasons[row[0].as<std::string>()] =
          absl::StrCat("volume ", row[1].as<std::string>(), " is ", row[2].as<std::string>());
    }
  }
  holds.fenced = static_cast<int>(holds.reasons.size());
  if (unbound.empty()) return holds;
  std::map<std::string, std::string> first;  // Volume -> its first instance, queue order.
  for (const PendingRow& p : pending) {
    if (holds.reasons.count(p.id)) continue;
    auto [from, to] = unbound.equal_range(p.id);
    for (auto it = from; it != to && !holds.reasons.count(p.id); ++it) {
      const auto& [volume, placed] = it->second;
      auto [claim, fresh] = first.try_emplace(volume, placed.empty() ? p.id : placed);
      if (!fresh || !placed.empty()) {
        holds.reasons[p.id] =
            absl::StrCat("volume ", volume, " is node-local and on no node yet: it goes to ",
                         "the node instance ", claim->second, " is placed on first");
      }
    }
  }
  return holds;
}

// How many waiting instances are held for a fenced volume, in the whole
// queue.
int FencedStarts(pqxx::work& txn) {
  return txn
      .exec("SELECT count(DISTINCT a.instance_id) FROM volume_attachments a "
            "WHERE cardinality(a.fenced_nodes) > 0 AND NOT a.read_only "
            "  AND a.state <> 'detaching' AND EXISTS (SELECT 1 FROM instances i "
            "  WHERE i.id = a.instance_id AND i.state = 'PENDING')")[0][0]
      .as<int>();
}

void ReadQueueHead(pqxx::work& txn, int limit, FleetView& view) {
  // The queue's head in queue order (migration 0093: read through the
  // queue index, whatever the planner's statistics say; 0099: its plan kept
  // per connection).
  view.pending.clear();
  for (const auto& row : txn.exec_params(
           "SELECT id, tenant_id, gpu_count, max_leaves, priority, queue_seq, pin_node_id, "
           "  state_reason, queue_position FROM sv_queue_head($1)",
           limit)) {
    view.pending.push_back({row[0].as<std::string>(), row[1].as<std::string>(),
                            row[2].as<int>(), row[3].as<int>(), row[4].as<int>(),
                            row[5].as<int64_t>(),
                            row[6].is_null() ? std::string() : row[6].as<std::string>(),
                            row[7].as<std::string>(), row[8].as<int>()});
  }
}

void LoadPending(pqxx::work& txn, int queue_max, FleetView& view) {
  ReadQueueHead(txn, queue_max, view);
  if (view.pending.empty()) return;
  VolumeHolds holds = HeldForVolumes(txn, view.pending);
  // Starts held for a fenced volume are not decided on, so they must not
  // take the head's rows from those that can be: a dead node's instances
  // started again may be hundreds. A full head with some of them is read
  // again, longer by every such start in the queue and by the head's
  // other holds.
  if (holds.fenced > 0 && static_cast<int>(view.pending.size()) >= queue_max) {
    const int others = static_cast<int>(holds.reasons.size()) - holds.fenced;
    ReadQueueHead(txn, queue_max + FencedStarts(txn) + others, view);
    holds = HeldForVolumes(txn, view.pending);
  }
  for (PendingRow& p : view.pending) {
    if (auto it = holds.reasons.find(p.id); it != holds.reasons.end()) {
      p.held_reason = it->second;
    }
  }
}

void LoadFleet(pqxx::work& txn, FleetView& view) {
  // A node whose agent cannot list its container runtime could start
  // nothing placed there (migration 0127): for placement it is down.
  for (const auto& row : txn.exec(
           "SELECT id, name, zone, pod, leaf_switch, gpu_count, "
           "  CASE WHEN runtime_failing_since IS NOT NULL THEN 'down' ELSE state END "
           "FROM nodes ORDER BY name")) {
    view.nodes.push_back({row[0].as<std::string>(), row[1].as<std::string>(),
                          row[2].as<std::string>(), row[3].as<std::string>(),
                          row[4].as<std::string>(), row[5].as<int>(),
                          ParseNodeState(row[6].as<std::string>())});
  }
  // Each reservation's tenant is probed by the instance's primary key. A
  // join let the planner hash every instance ever created (20,000 rows, 27 ms
  // late in a benchmark run) to find the few hundred holders; the probe costs
  // a key lookup per reserved GPU whatever the table's size. The foreign key
  // makes the holder exist.
  for (const auto& row : txn.exec(
           "SELECT r.node_id, r.gpu_index, r.instance_id, "
           "  (SELECT i.tenant_id FROM instances i WHERE i.id = r.instance_id) "
           "FROM gpu_reservations r "
           "ORDER BY r.node_id, r.gpu_index")) {
    view.reservations.push_back({row[0].as<std::string>(), row[1].as<int>(),
                                 row[2].as<std::string>(), row[3].as<std::string>()});
  }
  for (const auto& row : txn.exec(
           "SELECT tenant_id, gpus_in_use_max, pending_count_max FROM tenant_quotas")) {
    TenantQuotaRow q{row[0].as<std::string>(), row[1].as<int>(), row[2].as<int>()};
    view.quotas[q.tenant_id] = q;
  }
}

// The instances a pass may move (FleetView::movable). Bounded: a pass
// moves at most a few dozen, and it picks them from the least used nodes.
constexpr int kMovableRowsMax = 10000;

void LoadMovable(pqxx::work& txn, absl::Time running_before, FleetView& view) {
  for (const auto& row : txn.exec_params(
           "SELECT i.id FROM instances i "
           "WHERE i.movable AND i.state = 'RUNNING' AND i.gpu_count < 8 "
           "  AND i.running_since <= $1::timestamptz "
           "  AND NOT EXISTS (SELECT 1 FROM volume_attachments a WHERE a.instance_id = i.id) "
           "  AND NOT EXISTS (SELECT 1 FROM volumes v WHERE v.move_to_instance_id = i.id) "
           "  AND NOT EXISTS (SELECT 1 FROM instance_ports p WHERE p.instance_id = i.id) "
           "ORDER BY i.running_since, i.id LIMIT $2",
           SqlTime(running_before), kMovableRowsMax)) {
    view.movable.push_back(row[0].as<std::string>());
  }
}

std::string GrantText(const FleetView& view, const std::vector<GpuGrant>& grants) {
  std::map<std::string, std::string> names;
  for (const auto& n : view.nodes) names[n.id] = n.name;
  std::vector<std::string> parts;
  for (const auto& g : grants) {
    parts.push_back(absl::StrCat(names[g.node_id], "[", absl::StrJoin(g.gpu_indices, ","), "]"));
  }
  return absl::StrJoin(parts, " ");
}

// Waiting instances: reason and position, only where they changed, so an
// idle pass writes nothing. The rows are compared with what the pass read
// (under the placement lock) first: a long queue whose tail only grew sends
// its few new rows, not every row to be probed again. The statement still
// compares, for a row another transaction changed since the read. A row
// another transaction holds is skipped, as in WritePlaced: the pass holds
// the rows it placed, and a delete batch that waits for its rows in id order
// (migration 0097) may hold this one while it waits for one of those. The
// skipped row keeps its old reason and position until a later pass, which
// reads them and writes them again.
void WriteWaiting(pqxx::work& txn, const FleetView& view,
                  const std::vector<const QueueVerdict*>& waiting) {
  if (waiting.empty()) return;
  absl::flat_hash_map<std::string_view, const PendingRow*> read;
  read.reserve(view.pending.size());
  for (const PendingRow& p : view.pending) read.emplace(p.id, &p);
  std::vector<std::string> ids, reasons;
  std::vector<int> positions;
  for (const QueueVerdict* v : waiting) {
    auto it = read.find(v->instance_id);
    if (it != read.end() && it->second->state_reason == v->reason &&
        it->second->queue_position == v->queue_position) {
      continue;
    }
    ids.push_back(v->instance_id);
    reasons.push_back(v->reason);
    positions.push_back(v->queue_position);
  }
  if (ids.empty()) return;
  txn.exec_params(
      "UPDATE instances i SET state_reason = v.reason, queue_position = v.position "
      "FROM unnest($1::text[], $2::text[], $3::int[]) AS v(id, reason, position) "
      "WHERE i.id = v.id AND i.state = 'PENDING' "
      "AND (i.state_reason <> v.reason OR i.queue_position <> v.position) "
      "AND i.id IN (SELECT x.id FROM instances x WHERE x.id = ANY($1::text[]) "
      "AND x.state = 'PENDING' FOR NO KEY UPDATE SKIP LOCKED)",
      TextArrayLiteral(ids), TextArrayLiteral(reasons), IntArrayLiteral(positions));
}

// The reservation rows of a pass's grants, as columns for one INSERT.
struct ReservationColumns {
  std::vector<std::string> nodes, holders;
  std::vector<int> gpus;

  // Returns how many GPUs `grants` hold.
  int Add(const std::string& instance_id, const std::vector<GpuGrant>& grants) {
    int count = 0;
    for (const GpuGrant& g : grants) {
      for (int gpu : g.gpu_indices) {
        nodes.push_back(g.node_id);
        gpus.push_back(gpu);
        holders.push_back(instance_id);
        ++count;
      }
    }
    return count;
  }

  // The primary key rejects a second reservation of any GPU and aborts the
  // whole pass, so no scheduler bug can double-book. Start confirmations
  // left from an earlier run of these instances (a stop keeps them) go:
  // with them, one node's confirmation could complete a gang that its
  // other nodes never started.
  void Insert(pqxx::work& txn, absl::Time now) const {
    txn.exec_params("DELETE FROM instance_node_starts WHERE instance_id = ANY($1::text[])",
                    TextArrayLiteral(holders));
    txn.exec_params(
        "INSERT INTO gpu_reservations (node_id, gpu_index, instance_id, reserved_at) "
        "SELECT n, g, h, $4::timestamptz FROM unnest($1::text[], $2::int[], $3::text[]) "
        "AS t(n, g, h)",
        TextArrayLiteral(nodes), IntArrayLiteral(gpus), TextArrayLiteral(holders), SqlTime(now));
  }
};

// One `from` -> SCHEDULED event per instance, in the order given.
void InsertScheduledEvents(pqxx::work& txn, const std::vector<std::string>& ids,
                           const std::vector<std::string>& reasons, const char* from,
                           absl::Time now) {
  txn.exec_params(
      "INSERT INTO instance_events (instance_id, at, from_state, to_state, reason) "
      "SELECT id, $3::timestamptz, $4, 'SCHEDULED', reason "
      "FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS t(id, reason, n) ORDER BY n",
      TextArrayLiteral(ids), TextArrayLiteral(reasons), SqlTime(now), from);
}

int GrantedGpus(const std::vector<GpuGrant>& grants) {
  int count = 0;
  for (const GpuGrant& g : grants) count += static_cast<int>(g.gpu_indices.size());
  return count;
}

// Moved instances: their rows locked and checked (still RUNNING and
// movable), their reservations moved, RUNNING -> SCHEDULED with the reason.
// From there the nodes' desired sets take them through STARTING to RUNNING
// on the new node, as any placement. Aborted (the pass is retried from its
// read) when a row changed or another transaction holds it: the view the
// moves were decided on is stale.
absl::Status WriteMoved(pqxx::work& txn, const FleetView& view,
                        const std::vector<const QueueVerdict*>& moved, absl::Time now) {
  if (moved.empty()) return absl::OkStatus();
  std::vector<std::string> ids, reasons;
  ReservationColumns reservations;
  int from_total = 0;
  for (const QueueVerdict* v : moved) {
    ids.push_back(v->instance_id);
    reasons.push_back(absl::StrCat("moved from ", GrantText(view, v->moved_from), " to ",
                                   GrantText(view, v->grants), " ", v->reason));
    from_total += GrantedGpus(v->moved_from);
    // A move keeps the instance's size; anything else is a bug.
    [[maybe_unused]] const int to_total = reservations.Add(v->instance_id, v->grants);
    assert(GrantedGpus(v->moved_from) == to_total);
  }
  const auto locked = txn.exec_params(
      "SELECT id FROM instances WHERE id = ANY($1::text[]) AND state = 'RUNNING' AND movable "
      "FOR NO KEY UPDATE SKIP LOCKED",
      TextArrayLiteral(ids));
  if (locked.size() != ids.size()) {
    return Error(absl::StatusCode::kAborted, "MOVE_RACED",
                 "an instance to move changed after the pass read it");
  }
  // A volume attached (or moving) to one after the pass read it ties it to
  // its data, and a node-local volume to its node: read under the locks
  // (an attach locks the instance first), such an instance stays.
  if (!txn.exec_params("SELECT 1 FROM volume_attachments WHERE instance_id = ANY($1::text[]) "
                       "UNION ALL SELECT 1 FROM volumes WHERE move_to_instance_id = "
                       "ANY($1::text[]) LIMIT 1",
                       TextArrayLiteral(ids))
           .empty()) {
    return Error(absl::StatusCode::kAborted, "MOVE_RACED",
                 "a volume was attached to an instance to move after the pass read it");
  }
  const auto released = txn.exec_params(
      "DELETE FROM gpu_reservations WHERE instance_id = ANY($1::text[]) RETURNING instance_id",
      TextArrayLiteral(ids));
  if (static_cast<int>(released.size()) != from_total) {
    return Error(absl::StatusCode::kAborted, "MOVE_RACED",
                 "an instance to move holds other GPUs than the pass read");
  }
  reservations.Insert(txn, now);
  // A move is a new run (queue_seq is the agents' run number): a chain of
  // moves can end on the node it began on with other GPUs, and an agent
  // that saw the same run kept the process on its old GPUs, which may now
  // be another tenant's.
  txn.exec_params(
      "UPDATE instances i SET state = 'SCHEDULED', state_reason = v.reason, "
      "updated_at = $3::timestamptz, running_since = NULL, idle_since = NULL, "
      "queue_seq = nextval('instances_queue_seq_seq') "
      "FROM unnest($1::text[], $2::text[]) AS v(id, reason) WHERE i.id = v.id",
      TextArrayLiteral(ids), TextArrayLiteral(reasons), SqlTime(now));
  InsertScheduledEvents(txn, ids, reasons, "RUNNING", now);
  return absl::OkStatus();
}

// Placed instances: SCHEDULED, their reservations and their events. Returns
// how many were placed. An instance deleted meanwhile is skipped, and so is
// one whose row another transaction holds (a delete batch about to commit):
// the pass does not wait for that COMMIT while it holds the rows it placed
// (deletes of those would wait for the pass in turn); if the other
// transaction leaves it PENDING, a later pass places it.
int WritePlaced(pqxx::work& txn, const FleetView& view,
                const std::vector<const QueueVerdict*>& placed,
                const std::map<std::string, int>& gpu_counts, absl::Time now,
                std::set<std::string>& written) {
  if (placed.empty()) return 0;
  std::vector<std::string> ids, reasons, nodes;
  std::map<std::string, const QueueVerdict*> by_id;
  for (const QueueVerdict* v : placed) {
    ids.push_back(v->instance_id);
    reasons.push_back(absl::StrCat("GPUs reserved on ", GrantText(view, v->grants)));
    nodes.push_back(v->grants.empty() ? std::string() : v->grants.front().node_id);
    by_id[v->instance_id] = v;
  }
  // A node-local volume with no node yet goes with the first instance of
  // this pass placed with it (in queue order): another placed on another
  // node waits for the next pass, which sees the volume's node. It used to
  // bind only when an agent first read its set, so two instances of one
  // read-many volume could be placed on two nodes (in a pass, or in two
  // passes before the agent's read) and one ran without its data.
  std::multimap<std::string, std::string> volumes_of;  // Instance -> unbound volume.
  {
    std::map<std::string, std::string> volume_node;  // Unbound volume -> node.
    for (const auto& row : ExecPrepared(txn, "sv_pass_unbound_local_volumes",
             "SELECT a.instance_id, a.volume_id FROM volume_attachments a "
             "JOIN volumes v ON v.id = a.volume_id WHERE a.instance_id = ANY($1::text[]) "
             "AND v.kind = 'node_local' AND v.node_id IS NULL",
             TextArrayLiteral(ids))) {
      volumes_of.emplace(row[0].as<std::string>(), row[1].as<std::string>());
    }
    std::vector<std::string> kept_ids, kept_reasons, kept_nodes;
    for (size_t i = 0; i < ids.size(); ++i) {
      bool clash = false;
      auto [from, to] = volumes_of.equal_range(ids[i]);
      for (auto it = from; it != to; ++it) {
        auto [known, first] = volume_node.try_emplace(it->second, nodes[i]);
        clash = clash || (!first && known->second != nodes[i]);
      }
      if (clash) continue;
      kept_ids.push_back(ids[i]);
      kept_reasons.push_back(reasons[i]);
      kept_nodes.push_back(nodes[i]);
    }
    ids.swap(kept_ids);
    reasons.swap(kept_reasons);
    nodes.swap(kept_nodes);
  }
  // Prepared: PostgreSQL plans it once per connection, not on every pass.
  // A node-local volume attached (or moving) to the instance after the pass
  // read it pins it to the volume's node: read under the row's lock (an
  // attach locks the instance first), an instance placed elsewhere stays
  // PENDING for the next pass, which sees the pin. It used to be placed
  // away from its data.
  auto updated = ExecPrepared(
      txn, "sv_pass_placed",
      "UPDATE instances i SET state = 'SCHEDULED', state_reason = v.reason, "
      "queue_position = 0, updated_at = $3::timestamptz "
      "FROM unnest($1::text[], $2::text[], $4::text[]) AS v(id, reason, node) "
      "WHERE i.id = v.id AND i.state = 'PENDING' AND i.id IN (SELECT x.id FROM instances x "
      "WHERE x.id = ANY($1::text[]) AND x.state = 'PENDING' FOR NO KEY UPDATE SKIP LOCKED) "
      "AND NOT EXISTS (SELECT 1 FROM volume_attachments a JOIN volumes vol "
      "ON vol.id = a.volume_id WHERE a.instance_id = i.id AND vol.kind = 'node_local' "
      "AND vol.node_id <> v.node) "
      "AND NOT EXISTS (SELECT 1 FROM volumes vol WHERE vol.move_to_instance_id = i.id "
      "AND vol.kind = 'node_local' AND vol.node_id <> v.node) "
      "RETURNING i.id, v.reason",
      TextArrayLiteral(ids), TextArrayLiteral(reasons), SqlTime(now), TextArrayLiteral(nodes));
  ReservationColumns reservations;
  std::vector<std::string> event_ids, event_reasons;
  for (const auto& row : updated) {
    const std::string id = row[0].as<std::string>();
    written.insert(id);
    // The decider grants exactly what was asked; anything else is a bug.
    [[maybe_unused]] const int gpu_total = reservations.Add(id, by_id.at(id)->grants);
    assert(gpu_total == gpu_counts.at(id));
    event_ids.push_back(id);
    event_reasons.push_back(row[1].as<std::string>());
  }
  (void)gpu_counts;
  if (updated.empty()) return 0;
  // The unbound volumes of the instances written bind to their nodes. A
  // volume row another transaction holds (an attach, a move) is left for
  // the agent's first read, as before: waiting for it here, holding the
  // rows just placed, could close a cycle with that transaction.
  if (!volumes_of.empty()) {
    std::set<std::string> written_now;
    for (const auto& row : updated) written_now.insert(row[0].as<std::string>());
    std::map<std::string, std::string> bind;  // Volume -> node.
    for (size_t i = 0; i < ids.size(); ++i) {
      if (!written_now.count(ids[i])) continue;
      auto [from, to] = volumes_of.equal_range(ids[i]);
      for (auto it = from; it != to; ++it) bind.try_emplace(it->second, nodes[i]);
    }
    std::vector<std::string> bind_volumes, bind_nodes;
    for (const auto& [volume, node] : bind) {
      bind_volumes.push_back(volume);
      bind_nodes.push_back(node);
    }
    if (!bind_volumes.empty()) {
      txn.exec_params(
          "UPDATE volumes vol SET node_id = b.node, updated_at = $3::timestamptz "
          "FROM unnest($1::text[], $2::text[]) AS b(id, node) "
          "WHERE vol.id = b.id AND vol.id IN (SELECT x.id FROM volumes x "
          "WHERE x.id = ANY($1::text[]) AND x.node_id IS NULL FOR NO KEY UPDATE SKIP LOCKED)",
          TextArrayLiteral(bind_volumes), TextArrayLiteral(bind_nodes), SqlTime(now));
    }
  }
  reservations.Insert(txn, now);
  InsertScheduledEvents(txn, event_ids, event_reasons, "PENDING", now);
  return static_cast<int>(updated.size());
}

absl::Status NodeNotFound(const std::string& name) {
  return Error(absl::StatusCode::kNotFound, "NODE_NOT_FOUND",
               absl::StrCat("node '", name, "' not found"));
}

NodeUsage UsageFromRow(const pqxx::row& row) {
  NodeUsage u;
  u.node = {row[0].as<std::string>(), row[1].as<std::string>(), row[2].as<std::string>(),
            row[3].as<std::string>(), row[4].as<std::string>(), row[5].as<std::string>(),
            row[6].as<int>(), ParseNodeState(row[7].as<std::string>()), row[8].as<bool>()};
  u.free_gpu_count = u.node.gpu_count - row[9].as<int>();
  u.instance_count = row[10].as<int>();
  u.state_when_back = ParseNodeState(row[11].as<std::string>());
  return u;
}

const char* const kNodeUsageSelect =
    "SELECT n.id, n.name, n.zone, n.pod, n.leaf_switch, n.gpu_model, n.gpu_count, n.state, "
    "n.simulated, "
    "(SELECT count(*) FROM gpu_reservations r WHERE r.node_id = n.id), "
    "(SELECT count(DISTINCT instance_id) FROM gpu_reservations r WHERE r.node_id = n.id), "
    "coalesce(n.state_when_back, 'ready') "
    "FROM nodes n ";

// The state a node action leads to, or why it may not happen.
NodeState NextNodeState(NodeState from, NodeAction action) {
  switch (action) {
    case NodeAction::kCordon:
      // A draining node already takes no placements; keep its stronger state.
      return from == NodeState::kDraining ? from : NodeState::kCordoned;
    case NodeAction::kUncordon:
      return NodeState::kReady;
    case NodeAction::kDrain:
      return NodeState::kDraining;
  }
  return from;
}

}  // namespace

absl::StatusOr<PassOutcome> SchedulingStore::RunQueuePass(const QueueDecider& decide,
                                                          int queue_max, absl::Time now,
                                                          const BeforeCommitHook& before_commit,
                                                          bool wait_for_lock,
                                                          std::optional<absl::Duration>
                                                              movable_running_min) {
  PassOutcome outcome;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) -> absl::Status {
    outcome = {};
    if (!wait_for_lock) {
      // A pass already running may have read the queue before this
      // caller's instance arrived; the caller asks for another pass instead
      // of queueing behind the lock (creates under load stay fast).
      if (!txn.exec1(absl::StrCat("SELECT pg_try_advisory_xact_lock(", kPlacementLockKey,
                                  ")"))[0].as<bool>()) {
        outcome.lock_busy = true;
        return absl::OkStatus();
      }
    } else {
      TakePlacementLock(txn);
    }
    FleetView view;
    LoadPending(txn, queue_max, view);
    if (view.pending.empty()) return absl::OkStatus();
    std::map<std::string, int> gpu_counts;
    for (const PendingRow& p : view.pending) gpu_counts[p.id] = p.gpu_count;
    LoadFleet(txn, view);
    if (movable_running_min.has_value() &&
        std::any_of(view.pending.begin(), view.pending.end(),
                    [](const PendingRow& p) { return p.gpu_count >= 8; })) {
      LoadMovable(txn, now - *movable_running_min, view);
    }
    SV_ASSIGN_OR_RETURN(std::vector<QueueVerdict> verdicts, decide(view));
    std::vector<const QueueVerdict*> placed, waiting, moved;
    for (const QueueVerdict& v : verdicts) {
      if (!v.moved_from.empty()) {
        moved.push_back(&v);
      } else {
        (v.grants.empty() ? waiting : placed).push_back(&v);
      }
    }
    // Moves first: the GPUs they free may be granted to a placement below.
    SV_RETURN_IF_ERROR(WriteMoved(txn, view, moved, now));
    std::set<std::string> written;
    outcome.placed = WritePlaced(txn, view, placed, gpu_counts, now, written);
    // A move is made for a placement of this pass; if that instance was
    // skipped (its row held, or deleted meanwhile), no instance restarts
    // for nothing: the whole pass is retried from its read.
    if (!moved.empty() &&
        std::any_of(placed.begin(), placed.end(),
                    [&](const QueueVerdict* v) { return !written.contains(v->instance_id); })) {
      return Error(absl::StatusCode::kAborted, "MOVE_RACED",
                   "an instance the moves made room for changed after the pass read it");
    }
    outcome.moved = static_cast<int>(moved.size());
    WriteWaiting(txn, view, waiting);
    outcome.waiting = static_cast<int>(waiting.size());
    if (before_commit) before_commit();
    return absl::OkStatus();
  }));
  return outcome;
}

absl::StatusOr<int> SchedulingStore::ResizeInstance(const std::string& tenant_id,
                                                    const std::string& id, int new_gpu_count,
                                                    int queue_max, const ResizeDecider& decide,
                                                    absl::Time now, const CreateGate& gate,
                                                    std::optional<CreateRefusal>* refusal) {
  int old_gpu_count = 0;
  absl::Status status = db_.Transact([&](pqxx::work& txn) -> absl::Status {
    TakePlacementLock(txn);
    // The gate below runs under the tenant's lock; it is taken before the
    // instance's, the order a start and a create take them in (the other
    // order let a start and a resize of one instance deadlock).
    const bool gated = gate.credit_minutes >= 0 || gate.spend_cap_since_minute >= 0;
    if (gated) txn.exec_params("SELECT 1 FROM tenants WHERE id = $1 FOR UPDATE", tenant_id);
    auto rows = txn.exec_params(
        "SELECT state, gpu_count, max_leaves FROM instances "
        "WHERE tenant_id = $1 AND id = $2 FOR UPDATE",
        tenant_id, id);
    if (rows.empty()) {
      return Error(absl::StatusCode::kNotFound, "INSTANCE_NOT_FOUND",
                   absl::StrCat("instance ", id, " not found"));
    }
    const std::string state = rows[0][0].as<std::string>();
    old_gpu_count = rows[0][1].as<int>();
    const int max_leaves = rows[0][2].as<int>();
    if (state != "RUNNING") {
      return Error(absl::StatusCode::kFailedPrecondition, "INSTANCE_NOT_RUNNING",
                   absl::StrCat("instance ", id, " is ", state,
                                "; only a RUNNING instance can be resized"));
    }
    if (old_gpu_count == new_gpu_count) return absl::OkStatus();
    // A node-local volume keeps its instance on the volume's node; a gang
    // spans several nodes, so the volume could not follow (docs/storage.md).
    // One moving to the instance counts too: the move completes later with
    // no placement check, and left the volume attaching for ever on a gang
    // (a move locks the instance's row, as this did, so either sees the other).
    if (new_gpu_count > 8) {
      auto local = txn.exec_params(
          "SELECT v.id FROM volume_attachments a JOIN volumes v ON v.id = a.volume_id "
          "WHERE a.instance_id = $1 AND v.kind = 'node_local' "
          "UNION ALL SELECT v.id FROM volumes v WHERE v.move_to_instance_id IS NOT NULL "
          "AND v.move_to_instance_id = $1 AND v.kind = 'node_local' ORDER BY 1 LIMIT 1",
          id);
      if (!local.empty()) {
        return Error(absl::StatusCode::kFailedPrecondition, "VOLUME_NODE_MISMATCH",
                     absl::StrCat("instance ", id, " has node-local volume ",
                                  local[0][0].as<std::string>(), "; a gang of ", new_gpu_count,
                                  " GPUs spans several nodes. Detach it or use a network "
                                  "volume"));
      }
    }
    // Growth: the create's gate for the GPUs added (the instance's rent at
    // its old size is in the tenant's committed rent) and the spend cap,
    // under the tenant's lock; the caller's check ran without it, so
    // concurrent resizes each passed.
    if (new_gpu_count > old_gpu_count && gated) {
      SV_RETURN_IF_ERROR(CheckCreateGateLocked(txn, id, new_gpu_count - old_gpu_count, gate,
                                               now, refusal));
    }
    FleetView view;
    LoadPending(txn, queue_max, view);
    LoadFleet(txn, view);
    SV_ASSIGN_OR_RETURN(ResizeVerdict verdict, decide(view, id, tenant_id, new_gpu_count, max_leaves));
    for (const auto& g : verdict.removed) {
      txn.exec_params(
          "DELETE FROM gpu_reservations WHERE node_id = $1 "
          "AND gpu_index = ANY($2::int[]) AND instance_id = $3",
          g.node_id, IntArrayLiteral(g.gpu_indices), id);
    }
    for (const auto& g : verdict.added) {
      for (int gpu : g.gpu_indices) {
        txn.exec_params(
            "INSERT INTO gpu_reservations (node_id, gpu_index, instance_id, reserved_at) "
            "VALUES ($1, $2, $3, $4::timestamptz)",
            g.node_id, gpu, id, SqlTime(now));
      }
    }
    const int held = txn.exec_params1(
        "SELECT count(*) FROM gpu_reservations WHERE instance_id = $1", id)[0].as<int>();
    assert(held == new_gpu_count);
    (void)held;
    const std::string reason =
        absl::StrCat("resized from ", old_gpu_count, " to ", new_gpu_count, " GPUs");
    txn.exec_params(
        "UPDATE instances SET gpu_count = $2, state_reason = $3, updated_at = $4::timestamptz "
        "WHERE id = $1",
        id, new_gpu_count, reason, SqlTime(now));
    RecordEvent(txn, id, now, "RUNNING", "RUNNING", reason);
    // Billing reads the size of each RUNNING interval from here.
    txn.exec_params(
        "INSERT INTO instance_resizes (instance_id, at, from_gpu_count, to_gpu_count) "
        "VALUES ($1, $2::timestamptz, $3, $4)",
        id, SqlTime(now), old_gpu_count, new_gpu_count);
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  return old_gpu_count;
}

absl::StatusOr<std::map<std::string, int>> SchedulingStore::QueuePositions(
    const std::string& tenant_id, const std::vector<std::string>& ids) {
  std::map<std::string, int> positions;
  if (ids.empty()) return positions;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) {
    positions.clear();
    for (const auto& row : txn.exec_params(
             "SELECT id, queue_position FROM instances WHERE tenant_id = $1 "
             "AND id = ANY($2::text[]) AND state = 'PENDING'",
             tenant_id, TextArrayLiteral(ids))) {
      positions[row[0].as<std::string>()] = row[1].as<int>();
    }
    return absl::OkStatus();
  }));
  return positions;
}

absl::StatusOr<AdmissionView> SchedulingStore::LoadAdmission(const std::string& tenant_id,
                                                             const std::string& request_id) {
  AdmissionView view;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) {
    view = {};
    auto row = txn.exec_params1(
        "SELECT EXISTS (SELECT 1 FROM instances WHERE tenant_id = $1 AND request_id = $2), "
        "(SELECT count(*) FROM instances WHERE tenant_id = $1 AND state = 'PENDING')",
        tenant_id, request_id);
    view.request_seen = row[0].as<bool>();
    view.pending_count = row[1].as<int>();
    auto quota = txn.exec_params(
        "SELECT tenant_id, gpus_in_use_max, pending_count_max FROM tenant_quotas "
        "WHERE tenant_id = $1",
        tenant_id);
    if (!quota.empty()) {
      view.quota = TenantQuotaRow{quota[0][0].as<std::string>(), quota[0][1].as<int>(),
                                  quota[0][2].as<int>()};
    }
    return absl::OkStatus();
  }));
  return view;
}

absl::StatusOr<std::vector<NodeUsage>> SchedulingStore::ListNodes(const std::string& after_name,
                                                                  int limit) {
  assert(limit > 0 && limit <= 1001);
  std::vector<NodeUsage> nodes;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) {
    nodes.clear();
    for (const auto& row :
         txn.exec_params(std::string(kNodeUsageSelect) + "WHERE n.name > $1 ORDER BY n.name "
                                                         "LIMIT $2",
                         after_name, limit)) {
      nodes.push_back(UsageFromRow(row));
    }
    return absl::OkStatus();
  }));
  return nodes;
}

absl::StatusOr<DrainOutcome> SchedulingStore::ChangeNode(const std::string& name,
                                                         NodeAction action) {
  DrainOutcome outcome;
  absl::Status status = db_.Transact([&](pqxx::work& txn) -> absl::Status {
    outcome = {};
    // Under the placement lock, so a pass that read the node as ready has
    // committed before this returns: after a cordon, nothing new lands.
    TakePlacementLock(txn);
    auto rows = txn.exec_params(
        "SELECT id, state, coalesce(state_when_back, 'ready') FROM nodes WHERE name = $1 "
        "FOR UPDATE",
        name);
    if (rows.empty()) return NodeNotFound(name);
    const std::string node_id = rows[0][0].as<std::string>();
    const NodeState state = ParseNodeState(rows[0][1].as<std::string>());
    if (state == NodeState::kDown) {
      // Down and up are the heartbeat's; the operator's decision is kept
      // for when the node's agent registers again (migration 0122). It used
      // to be refused, so a node could not be cordoned before it came back.
      const NodeState back =
          NextNodeState(ParseNodeState(rows[0][2].as<std::string>()), action);
      txn.exec_params("UPDATE nodes SET state_when_back = nullif($2, 'ready') WHERE id = $1",
                      node_id, NodeStateName(back));
    } else {
      txn.exec_params("UPDATE nodes SET state = $2 WHERE id = $1", node_id,
                      NodeStateName(NextNodeState(state, action)));
    }
    outcome.node = UsageFromRow(txn.exec_params1(
        std::string(kNodeUsageSelect) + "WHERE n.id = $1", node_id));
    for (const auto& row : txn.exec_params(
             "SELECT i.id, i.tenant_id, i.state, i.gpu_count FROM instances i "
             "WHERE i.id IN (SELECT instance_id FROM gpu_reservations WHERE node_id = $1) "
             "ORDER BY i.id",
             node_id)) {
      outcome.instances_to_move.push_back({row[0].as<std::string>(), row[1].as<std::string>(),
                                           row[2].as<std::string>(), row[3].as<int>()});
    }
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  return outcome;
}

absl::StatusOr<NodeUsage> SchedulingStore::ForgetNodeMounts(const std::string& name,
                                                           absl::Time now, int* released) {
  NodeUsage usage;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) -> absl::Status {
    // Locked: an agent registering meanwhile waits, and one that did is seen.
    auto rows = txn.exec_params("SELECT id, state FROM nodes WHERE name = $1 FOR UPDATE", name);
    if (rows.empty()) return NodeNotFound(name);
    const std::string node_id = rows[0][0].as<std::string>();
    if (rows[0][1].as<std::string>() != "down") {
      return Error(absl::StatusCode::kFailedPrecondition, "NODE_NOT_DOWN",
                   absl::StrCat("node ", name, " is ", rows[0][1].as<std::string>(),
                                "; its agent says itself what it still mounts"));
    }
    *released = txn.exec_params1("SELECT volume_attachments_unfence($1, NULL, $2::timestamptz)",
                                 node_id, SqlTime(now))[0]
                    .as<int>();
    usage = UsageFromRow(
        txn.exec_params1(std::string(kNodeUsageSelect) + "WHERE n.id = $1", node_id));
    return absl::OkStatus();
  }));
  return usage;
}

absl::StatusOr<InstanceOnNode> SchedulingStore::SetInstancePriority(const std::string& id,
                                                                    int priority,
                                                                    absl::Time now) {
  InstanceOnNode result;
  absl::Status status = db_.Transact([&](pqxx::work& txn) -> absl::Status {
    auto rows = txn.exec_params(
        "SELECT tenant_id, state, gpu_count FROM instances WHERE id = $1 FOR UPDATE", id);
    if (rows.empty()) {
      return Error(absl::StatusCode::kNotFound, "INSTANCE_NOT_FOUND",
                   absl::StrCat("instance ", id, " not found"));
    }
    result = {id, rows[0][0].as<std::string>(), rows[0][1].as<std::string>(),
              rows[0][2].as<int>()};
    if (result.state == "DELETED" || result.state == "FAILED") {
      return Error(absl::StatusCode::kFailedPrecondition, "INSTANCE_FINISHED",
                   absl::StrCat("instance ", id, " is ", result.state));
    }
    txn.exec_params(
        "UPDATE instances SET priority = $2, updated_at = $3::timestamptz WHERE id = $1", id,
        priority, SqlTime(now));
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  return result;
}

absl::StatusOr<TenantQuotaRow> SchedulingStore::SetTenantQuota(const TenantQuotaRow& quota,
                                                               absl::Time now) {
  absl::Status status = db_.Transact([&](pqxx::work& txn) -> absl::Status {
    if (txn.exec_params("SELECT 1 FROM tenants WHERE id = $1", quota.tenant_id).empty()) {
      return Error(absl::StatusCode::kNotFound, "TENANT_NOT_FOUND",
                   absl::StrCat("tenant ", quota.tenant_id, " not found"));
    }
    txn.exec_params(
        "INSERT INTO tenant_quotas (tenant_id, gpus_in_use_max, pending_count_max, updated_at, "
        "instances_max) VALUES ($1, $2, $3, $4::timestamptz, nullif($5, 0)) "
        "ON CONFLICT (tenant_id) DO UPDATE SET gpus_in_use_max = $2, pending_count_max = $3, "
        "updated_at = $4::timestamptz, instances_max = nullif($5, 0)",
        quota.tenant_id, quota.gpus_in_use_max, quota.pending_count_max, SqlTime(now),
        quota.instances_max);
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  return quota;
}

absl::StatusOr<std::optional<TenantQuotaRow>> SchedulingStore::GetTenantQuota(
    const std::string& tenant_id) {
  std::optional<TenantQuotaRow> quota;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) -> absl::Status {
    quota.reset();
    if (txn.exec_params("SELECT 1 FROM tenants WHERE id = $1", tenant_id).empty()) {
      return Error(absl::StatusCode::kNotFound, "TENANT_NOT_FOUND",
                   absl::StrCat("tenant ", tenant_id, " not found"));
    }
    auto rows = txn.exec_params(
        "SELECT tenant_id, gpus_in_use_max, pending_count_max, coalesce(instances_max, 0) "
        "FROM tenant_quotas WHERE tenant_id = $1",
        tenant_id);
    if (!rows.empty()) {
      quota = TenantQuotaRow{rows[0][0].as<std::string>(), rows[0][1].as<int>(),
                             rows[0][2].as<int>(), rows[0][3].as<int>()};
    }
    return absl::OkStatus();
  }));
  return quota;
}

}  // namespace sv::store
