#include "sla/runtime.h"

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "billing/sla_refunds.h"
#include "common/status.h"
#include "metrics/metrics.h"
#include "absl/strings/str_format.h"
#include "sla/evidence.h"
#include "sla/policy.h"
#include "spdlog/spdlog.h"

namespace sv::sla {
namespace {

metrics::Registry& Metrics() { return metrics::Registry::Default(); }

absl::Time MinuteStart(int64_t minute) { return absl::FromUnixSeconds(minute * 60); }

// A JSON string; our texts are ASCII, escaped all the same.
void AppendJsonString(const std::string& text, std::string* out) {
  *out += '"';
  for (char c : text) {
    if (c == '"' || c == '\\') {
      *out += '\\';
      *out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      absl::StrAppend(out, absl::StrFormat("\\u%04x", static_cast<int>(c)));
    } else {
      *out += c;
    }
  }
  *out += '"';
}

// One verdict as JSON, written by hand: the judge writes 100,000s of them
// per hour, and this is several times faster than building a json object.
void AppendVerdictJson(const MetricVerdict& v, const std::string& key, int64_t transfer_id,
                       std::string* out) {
  absl::StrAppend(out, "{\"metric\":\"", MetricName(v.definition.metric),
                  "\",\"aggregation\":\"", AggregationName(v.definition.aggregation),
                  "\",\"comparison\":\"", ComparisonName(v.definition.comparison),
                  "\",\"threshold\":", v.definition.threshold,
                  ",\"refund_basis_points\":", v.definition.refund_basis_points,
                  ",\"observed\":", v.observed,
                  ",\"missing_telemetry\":", v.missing_telemetry ? "true" : "false",
                  ",\"breached\":", v.breached ? "true" : "false",
                  ",\"refund_micros\":", v.refund_micros, ",\"explanation\":");
  AppendJsonString(v.explanation, out);
  *out += ",\"refund_key\":";
  AppendJsonString(key, out);
  absl::StrAppend(out, ",\"refund_transfer_id\":", transfer_id, "}");
}

// One instance-hour being judged.
struct Pending {
  store::SlaRent rent;
  const Evidence* evidence = nullptr;  // Into the maps of JudgeHour, or `owned`.
  std::unique_ptr<Evidence> owned;     // An empty window: no telemetry at all.
  HourJudgement judgement;
  absl::Time billed_from;
  absl::Time billed_to;
};

}  // namespace

std::string RefundKey(const std::string& instance_id, absl::Time hour_start, Metric metric) {
  return absl::StrCat("sla:", instance_id, ":", absl::ToUnixSeconds(hour_start) / 3600, ":",
                      MetricName(metric));
}

Runtime::Runtime(store::Database& db, const Clock& clock, SlaOptions options)
    : db_(db),
      clock_(clock),
      options_(std::move(options)),
      monitor_(options_.monitor),
      store_(db) {}

absl::Status Runtime::Restore() {
  SV_ASSIGN_OR_RETURN(auto rows, store_.LoadCheckpoints(options_.replica));
  std::vector<Evidence> windows;
  std::vector<std::string> ids;
  for (const auto& row : rows) {
    auto evidence = DecodeEvidence(row.hour_start, row.evidence);
    if (!evidence.ok()) {
      spdlog::warn("sla: checkpoint of {} at {} unreadable: {}", row.instance_id,
                   absl::FormatTime(row.hour_start), evidence.status().ToString());
      continue;
    }
    windows.push_back(*std::move(evidence));
    ids.push_back(row.instance_id);
  }
  monitor_.Restore(windows, ids);
  spdlog::info("sla: restored {} open window(s) from the checkpoint of replica {}",
               windows.size(), options_.replica);
  return absl::OkStatus();
}

absl::Status Runtime::Checkpoint() {
  std::vector<WindowSnapshot> dirty = monitor_.TakeDirty();
  std::vector<store::SlaCheckpoint> rows;
  rows.reserve(dirty.size());
  for (const auto& w : dirty) {
    rows.push_back({w.instance_id, w.hour_start, w.gpu_count, w.evidence, options_.replica});
  }
  absl::Status status = store_.WriteCheckpoints(options_.replica, rows, clock_.Now());
  if (!status.ok()) {
    monitor_.MarkDirty(dirty);
    Metrics().IncrementCounter("sv_sla_checkpoint_failures_total",
                               "SLA checkpoint writes that failed (retried).", {});
    return status;
  }
  auto late = monitor_.TakeLateCounts();
  if (!late.empty()) {
    // Late samples of judged hours are added to their window records.
    absl::Status added = store_.AddLateSamples(late);
    if (!added.ok()) spdlog::warn("sla: recording late samples: {}", added.ToString());
  }
  // Every replica drops the windows of the hours the leader has judged.
  // Only the leader's judge did: a replica serving agents' streams without
  // leading kept a window per instance-hour for ever, until windows_max
  // was reached and every later sample was dropped (all its instances then
  // judged silent: three breaches an hour each).
  auto judged = store_.JudgedBefore();
  if (!judged.ok()) {
    spdlog::warn("sla: reading the judge's cursor: {}", judged.status().ToString());
  } else if (judged->has_value()) {
    monitor_.ForgetHoursBefore(**judged);
  }
  return absl::OkStatus();
}

std::vector<SlaDefinition> Runtime::Effective(
    const std::vector<store::SlaOverrideRow>& rows) const {
  std::vector<SlaDefinition> overrides;
  for (const auto& r : rows) {
    auto metric = ParseMetric(r.metric);
    auto aggregation = ParseAggregation(r.aggregation);
    auto comparison = ParseComparison(r.comparison);
    if (!metric.ok() || !aggregation.ok() || !comparison.ok()) continue;  // CHECKed in SQL.
    overrides.push_back({*metric, *aggregation, *comparison, r.threshold,
                         r.refund_basis_points});
  }
  auto merged = ApplyOverrides(options_.definitions, overrides);
  return merged.ok() ? *merged : options_.definitions;
}

absl::StatusOr<std::vector<SlaDefinition>> Runtime::DefinitionsFor(const std::string& tenant_id) {
  SV_ASSIGN_OR_RETURN(auto rows, store_.Overrides(tenant_id));
  return Effective(rows);
}

absl::StatusOr<JudgeResult> Runtime::JudgeDue(absl::Time now) {
  JudgeResult total;
  SV_ASSIGN_OR_RETURN(auto cursor, store_.JudgedBefore());
  // The rent of an hour is final once metering billed its last minute.
  SV_ASSIGN_OR_RETURN(auto billed, store_.BilledBefore());
  if (!billed) return total;
  absl::Time hour = cursor ? *cursor : HourOf(now - options_.first_run_lookback);
  const absl::Duration wait =
      absl::Hours(1) + options_.monitor.grace + options_.replica_flush_allowance;
  // Bounded: a long outage catches up a day per turn.
  for (int i = 0; i < 24 && hour + wait <= now && hour + absl::Hours(1) <= *billed;
       ++i, hour += absl::Hours(1)) {
    SV_ASSIGN_OR_RETURN(JudgeResult r, JudgeHour(hour, now));
    total.hours += r.hours;
    total.windows += r.windows;
    total.breaches += r.breaches;
    total.refunds_posted += r.refunds_posted;
    total.refund_micros += r.refund_micros;
  }
  return total;
}

absl::StatusOr<JudgeResult> Runtime::JudgeHour(absl::Time hour_start, absl::Time now) {
  const absl::Time hour_end = hour_start + absl::Hours(1);
  // Close the hour here first, so no sample counts after the evidence was
  // taken. This replica's evidence comes from memory (a superset of its
  // checkpoint, which Restore loaded at start); it stays there until the
  // judgement commits, so a failed one is simply retried.
  std::map<std::string, Evidence> mine;
  for (auto& [id, e] : monitor_.CloseAndCollect(hour_end)) {
    if (e.window.hour_start() == hour_start) mine.emplace(id, std::move(e));
  }

  JudgeResult result;
  std::vector<Pending> judged;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) -> absl::Status {
    result = JudgeResult();
    judged.clear();
    const std::optional<absl::Time> cursor = store::SlaStore::LockCursor(txn);
    std::set<std::string> done;
    for (auto& id : store::SlaStore::JudgedInstances(txn, hour_start)) done.insert(id);
    // Other replicas' evidence, merged with ours (copies only for those).
    std::map<std::string, Evidence> merged;
    for (const auto& row :
         store::SlaStore::ReadCheckpointsOfHour(txn, hour_start, options_.replica)) {
      auto e = DecodeEvidence(hour_start, row.evidence);
      if (!e.ok()) {
        spdlog::warn("sla: evidence of {} unreadable, judged as missing: {}", row.instance_id,
                     e.status().ToString());
        continue;
      }
      auto it = merged.find(row.instance_id);
      if (it == merged.end()) {
        auto own = mine.find(row.instance_id);
        it = merged.emplace(row.instance_id, own != mine.end() ? own->second : *e).first;
        if (own == mine.end()) continue;
      }
      MergeEvidence(it->second, *e);
    }
    std::map<std::string, std::vector<store::SlaOverrideRow>> overrides;
    for (auto& o : store::SlaStore::ReadAllOverrides(txn)) overrides[o.tenant_id].push_back(o);
    std::vector<billing::SlaRefund> refunds;
    std::vector<std::string> silent;  // Rent and no evidence at all.
    for (auto& rent : store::SlaStore::ReadRents(txn, hour_start)) {
      if (done.count(rent.instance_id)) continue;
      if ((rent.charged_minutes & ((uint64_t{1} << 60) - 1)) == 0) {
        // Nothing of the hour to judge (every minute given back): a window
        // row needs at least one billed minute, and one refused row would
        // stop the judge at this hour for every instance.
        continue;
      }
      Pending p;
      p.billed_from = std::max(hour_start, MinuteStart(rent.first_minute));
      p.billed_to = std::min(hour_end, MinuteStart(rent.last_minute + 1));
      if (auto m = merged.find(rent.instance_id); m != merged.end()) {
        p.evidence = &m->second;
      } else if (auto o = mine.find(rent.instance_id); o != mine.end()) {
        p.evidence = &o->second;
      } else {
        p.owned = std::make_unique<Evidence>(Evidence{
            InstanceHourWindow(hour_start, std::clamp(rent.gpu_count, 1, kInstanceGpusMax)),
            {}, 0});
        p.evidence = p.owned.get();
        silent.push_back(rent.instance_id);
      }
      auto defs = overrides.count(rent.tenant_id) ? Effective(overrides[rent.tenant_id])
                                                  : options_.definitions;
      p.judgement = Judge(p.evidence->window, rent.charged_minutes, rent.rent_micros, defs);
      for (const MetricVerdict& v : p.judgement.verdicts) {
        if (!v.breached) continue;
        ++result.breaches;
        if (v.refund_micros <= 0) continue;
        refunds.push_back({RefundKey(rent.instance_id, hour_start, v.definition.metric),
                           rent.tenant_id, rent.instance_id,
                           absl::ToUnixSeconds(hour_start) / 60, v.refund_micros,
                           rent.rent_micros, rent.trial_rent_micros});
      }
      p.rent = std::move(rent);
      judged.push_back(std::move(p));
    }
    // A silent instance's window names the nodes it holds GPUs on.
    auto reserved = store::SlaStore::ReservedNodes(txn, silent);
    for (Pending& p : judged) {
      if (p.owned) p.owned->node_names = reserved[p.rent.instance_id];
    }
    SV_ASSIGN_OR_RETURN(auto posted, billing::PostSlaRefunds(txn, refunds, now));
    std::map<std::string, int64_t> transfer_of;
    for (const auto& r : posted) {
      transfer_of[r.key] = r.transfer_id;
      if (!r.replay) ++result.refunds_posted;
    }
    store::SlaStore::WindowWriter writer(txn);
    for (const Pending& p : judged) {
      store::SlaWindowRow w;
      w.instance_id = p.rent.instance_id;
      w.tenant_id = p.rent.tenant_id;
      w.hour_start = hour_start;
      w.gpu_count = p.evidence->window.gpu_count();
      w.billed_from = p.billed_from;
      w.billed_to = p.billed_to;
      w.charged_minutes = p.rent.charged_minutes;
      w.rent_micros = p.rent.rent_micros;
      w.evidence = EncodeEvidence(*p.evidence);
      std::string verdicts = "[";
      for (const MetricVerdict& v : p.judgement.verdicts) {
        std::string key;
        int64_t transfer = 0;
        if (v.breached && v.refund_micros > 0) {
          key = RefundKey(p.rent.instance_id, hour_start, v.definition.metric);
          transfer = transfer_of[key];
          assert(transfer > 0);  // PostSlaRefunds returned every key it was given.
        }
        if (v.breached) w.breached_metrics.push_back(MetricName(v.definition.metric));
        if (verdicts.size() > 1) verdicts += ',';
        AppendVerdictJson(v, key, transfer, &verdicts);
      }
      w.verdicts_json = verdicts + "]";
      w.refund_micros_total = p.judgement.refund_micros_total;
      result.refund_micros += p.judgement.refund_micros_total;
      w.node_names = p.evidence->node_names;
      w.late_samples_ignored = p.evidence->late_samples_ignored;
      w.judged_at = now;
      writer.Write(w);
    }
    writer.Complete();
    store::SlaStore::DeleteCheckpointsBefore(txn, hour_end);
    store::SlaStore::SetCursor(txn, cursor ? std::max(*cursor, hour_end) : hour_end, now);
    result.hours = 1;
    result.windows = static_cast<int64_t>(judged.size());
    return absl::OkStatus();
  }));
  monitor_.ForgetHoursBefore(hour_end);
  Metrics().IncrementCounter("sv_sla_windows_judged_total", "Instance-hours judged.", {},
                             static_cast<double>(result.windows));
  for (const Pending& p : judged) {
    for (const MetricVerdict& v : p.judgement.verdicts) {
      if (!v.breached) continue;
      const std::string metric = MetricName(v.definition.metric);
      Metrics().IncrementCounter("sv_sla_breaches_total", "Breached SLA metric-hours.",
                                 {{"metric", metric}});
      Metrics().IncrementCounter("sv_sla_refund_micros_total",
                                 "SLA refunds posted, micro-yuan.", {{"metric", metric}},
                                 static_cast<double>(v.refund_micros));
    }
  }
  Metrics().IncrementCounter("sv_sla_refunds_total", "SLA refund transfers posted.", {},
                             static_cast<double>(result.refunds_posted));
  if (result.windows > 0) {
    spdlog::info("sla: judged hour {}: {} window(s), {} breach(es), {} refund(s), {} micros",
                 absl::FormatTime(hour_start), result.windows, result.breaches,
                 result.refunds_posted, result.refund_micros);
  }
  return result;
}

CheckpointLoop::CheckpointLoop(Runtime& runtime)
    : loop_(
          "sla-checkpoint", runtime.options().checkpoint_interval,
          [&runtime] {
            absl::Status s = runtime.Checkpoint();
            if (!s.ok()) spdlog::warn("sla: checkpoint failed: {}", s.ToString());
          },
          [&runtime] {
            absl::Status s = runtime.Checkpoint();
            if (!s.ok()) spdlog::error("sla: final checkpoint failed: {}", s.ToString());
          }) {}

JudgeLoop::JudgeLoop(Runtime& runtime, const Clock& clock)
    : runtime_(runtime),
      clock_(clock),
      loop_("sla-judge", runtime.options().judge_interval, [this] { Turn(); }) {}

// One turn, while this replica leads (store::LeaderLoop).
void JudgeLoop::Turn() {
  auto result = runtime_.JudgeDue(clock_.Now());
  metrics::Registry::Default().IncrementCounter("sv_sla_judge_runs_total",
                                                "SLA judgement runs, by result.",
                                                {{"result", result.ok() ? "ok" : "error"}});
  if (!result.ok()) spdlog::warn("sla: judgement failed: {}", result.status().ToString());
}

}  // namespace sv::sla
