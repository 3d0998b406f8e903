// SlaTelemetryService, SlaService, SlaAdminService and DevClockService.
#include "api/sla_service.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <mutex>
#include <set>

#include "absl/strings/str_cat.h"
#include "agent/telemetry.h"
#include "absl/strings/numbers.h"
#include "api/errors.h"
#include "api/internal/service_util.h"
#include "api/validation.h"
#include "common/status.h"
#include "google/protobuf/util/time_util.h"
#include "metrics/metrics.h"
#include "nlohmann/json.hpp"
#include "sla/evidence.h"
#include "sla/policy.h"
#include "spdlog/spdlog.h"
#include "store/agent_store.h"
#include "sv/v1/dev_clock.grpc.pb.h"
#include "sv/v1/sla.grpc.pb.h"

namespace sv::api {
namespace {

using google::protobuf::util::TimeUtil;
using internal::ToProto;

// Limits on one telemetry batch: an hour of 5-second samples of 8 GPUs.
constexpr int kGpuSamplesPerBatchMax = 8 * 720;
constexpr int kProbesPerBatchMax = 4096;
constexpr int kWindowsPageDefault = 24;
constexpr int kWindowsPageMax = 1000;
constexpr int64_t kProbeBytesMax = int64_t{1} << 40;
constexpr absl::Duration kHoldersRefreshMin = absl::Milliseconds(250);
constexpr absl::Duration kAdvanceMax = absl::Hours(24 * 31);

absl::Time FromProto(const google::protobuf::Timestamp& t, absl::Time fallback) {
  if (t.seconds() == 0 && t.nanos() == 0) return fallback;
  return absl::FromUnixSeconds(t.seconds()) + absl::Nanoseconds(t.nanos());
}

bool ValidTimestamp(const google::protobuf::Timestamp& t) {
  return t.seconds() >= -62'135'596'800 && t.seconds() <= 253'402'300'799 && t.nanos() >= 0 &&
         t.nanos() <= 999'999'999;
}

absl::Status Invalid(const char* reason, const std::string& message) {
  return Error(absl::StatusCode::kInvalidArgument, reason, message);
}

metrics::Registry& Metrics() { return metrics::Registry::Default(); }

// ---- Definitions <-> proto ----------------------------------------------------

v1::SlaMetric MetricToProto(sla::Metric m) {
  switch (m) {
    case sla::Metric::kGpuUsable: return v1::GPU_USABLE;
    case sla::Metric::kStorageWrite: return v1::STORAGE_WRITE;
    case sla::Metric::kNetworkLatency: return v1::NETWORK_LATENCY;
  }
  return v1::SLA_METRIC_UNSPECIFIED;
}

v1::SlaAggregation AggregationToProto(sla::Aggregation a) {
  switch (a) {
    case sla::Aggregation::kShareOfTime: return v1::SHARE_OF_TIME;
    case sla::Aggregation::kMean: return v1::MEAN;
    case sla::Aggregation::kMinimum: return v1::MINIMUM;
    case sla::Aggregation::kP99: return v1::P99;
  }
  return v1::SLA_AGGREGATION_UNSPECIFIED;
}

void DefinitionToProto(const sla::SlaDefinition& d, v1::SlaDefinition* out) {
  out->set_metric(MetricToProto(d.metric));
  out->set_aggregation(AggregationToProto(d.aggregation));
  out->set_comparison(d.comparison == sla::Comparison::kAtLeast ? v1::AT_LEAST : v1::AT_MOST);
  out->set_threshold(d.threshold);
  out->set_refund_basis_points(d.refund_basis_points);
}

absl::StatusOr<sla::SlaDefinition> DefinitionFromProto(const v1::SlaDefinition& p) {
  sla::SlaDefinition d{};
  switch (p.metric()) {
    case v1::GPU_USABLE: d.metric = sla::Metric::kGpuUsable; break;
    case v1::STORAGE_WRITE: d.metric = sla::Metric::kStorageWrite; break;
    case v1::NETWORK_LATENCY: d.metric = sla::Metric::kNetworkLatency; break;
    default: return Invalid("INVALID_SLA_DEFINITION", "each definition needs a metric");
  }
  switch (p.aggregation()) {
    case v1::SHARE_OF_TIME: d.aggregation = sla::Aggregation::kShareOfTime; break;
    case v1::MEAN: d.aggregation = sla::Aggregation::kMean; break;
    case v1::MINIMUM: d.aggregation = sla::Aggregation::kMinimum; break;
    case v1::P99: d.aggregation = sla::Aggregation::kP99; break;
    default: return Invalid("INVALID_SLA_DEFINITION", "each definition needs an aggregation");
  }
  switch (p.comparison()) {
    case v1::AT_LEAST: d.comparison = sla::Comparison::kAtLeast; break;
    case v1::AT_MOST: d.comparison = sla::Comparison::kAtMost; break;
    default: return Invalid("INVALID_SLA_DEFINITION", "each definition needs a comparison");
  }
  d.threshold = p.threshold();
  d.refund_basis_points = p.refund_basis_points();
  return d;
}

// ---- Windows -> proto ----------------------------------------------------------

// `charged`: the minutes judged, as sla::MinuteBits.
void AggregatesToProto(const sla::Evidence& e, uint64_t charged, v1::SlaWindow* out) {
  const sla::InstanceHourWindow& w = e.window;
  const sla::SlotMask judged = sla::JudgedSlots(w, charged);
  out->set_gpu_count(w.gpu_count());
  out->set_slots(static_cast<int32_t>(judged.count()));
  out->set_slots_reported(w.ReportedSlots(judged));
  out->set_slots_usable(w.UsableSlots(judged));
  out->set_storage_probe_count(w.storage_probe_count());
  out->set_storage_mean_bytes_per_second(w.storage_mean_bytes_per_second());
  out->set_storage_min_bytes_per_second(w.storage_min_bytes_per_second());
  out->set_latency_sample_count(w.latency().count());
  out->set_latency_p99_ns(w.latency().Quantile(0.99));
  out->set_late_samples_ignored(e.late_samples_ignored);
  for (const auto& n : e.node_names) out->add_node_names(n);
}

absl::Status JudgedToProto(const store::SlaWindowRow& row, v1::SlaWindow* out) {
  SV_ASSIGN_OR_RETURN(sla::Evidence e, sla::DecodeEvidence(row.hour_start, row.evidence));
  e.late_samples_ignored = row.late_samples_ignored;
  out->set_instance_id(row.instance_id);
  *out->mutable_hour_start_time() = ToProto(row.hour_start);
  out->set_state(v1::JUDGED);
  AggregatesToProto(e, row.charged_minutes, out);
  out->clear_node_names();
  for (const auto& n : row.node_names) out->add_node_names(n);
  *out->mutable_billed_start_time() = ToProto(row.billed_from);
  *out->mutable_billed_end_time() = ToProto(row.billed_to);
  out->set_rent_micros(row.rent_micros);
  out->set_refund_micros_total(row.refund_micros_total);
  *out->mutable_judge_time() = ToProto(row.judged_at);
  nlohmann::json verdicts = nlohmann::json::parse(row.verdicts_json, nullptr, false);
  if (!verdicts.is_array()) {
    return Error(absl::StatusCode::kInternal, "SLA_WINDOW_CORRUPT", "verdicts do not parse");
  }
  for (const auto& v : verdicts) {
    auto* p = out->add_verdicts();
    auto metric = sla::ParseMetric(v.value("metric", ""));
    auto aggregation = sla::ParseAggregation(v.value("aggregation", ""));
    auto comparison = sla::ParseComparison(v.value("comparison", ""));
    if (metric.ok() && aggregation.ok() && comparison.ok()) {
      DefinitionToProto({*metric, *aggregation, *comparison, v.value("threshold", int64_t{0}),
                         v.value("refund_basis_points", 0)},
                        p->mutable_definition());
    }
    p->set_observed(v.value("observed", int64_t{0}));
    p->set_missing_telemetry(v.value("missing_telemetry", false));
    p->set_breached(v.value("breached", false));
    p->set_refund_micros(v.value("refund_micros", int64_t{0}));
    p->set_explanation(v.value("explanation", ""));
    p->set_refund_idempotency_key(v.value("refund_key", ""));
    p->set_refund_transfer_id(v.value("refund_transfer_id", int64_t{0}));
  }
  return absl::OkStatus();
}

// ---- Telemetry ingest ----------------------------------------------------------

// The node's GPUs -> RUNNING instances, refreshed per stream, in the form
// the hot loop wants: one ingest target per instance, a GPU's target by
// vector index, and scratch space reused by every batch of the stream.
// The most a latency bucket (or the zero bucket) of one batch may count,
// so that sums over an hour cannot overflow int64.
constexpr int64_t kLatencyCountMax = int64_t{1} << 40;

struct Holders {
  std::vector<store::NodeGpuHolder> rows;  // As loaded; targets point into it.
  struct Gpu {
    int target = -1;  // -1: no RUNNING instance holds it (or no such GPU).
    int ordinal = 0;  // The GPU's number within its instance.
  };
  std::vector<Gpu> by_gpu;                   // Node GPU index -> holder.
  std::map<std::string, int> by_instance;    // Instance id -> target.
  std::vector<sla::IngestTarget> targets;    // One per instance.
  std::vector<const store::NodeGpuHolder*> target_rows;  // Any GPU of it.
  std::chrono::steady_clock::time_point loaded;
  bool valid = false;

  // Per batch, reused.
  sla::PackedBatch packed;
  std::vector<std::pair<int64_t, int64_t>> utilization;  // Per target: (sum, samples).

  const Gpu* GpuAt(int node_gpu_index) const {
    if (node_gpu_index < 0 || static_cast<size_t>(node_gpu_index) >= by_gpu.size()) {
      return nullptr;
    }
    const Gpu& g = by_gpu[node_gpu_index];
    return g.target < 0 ? nullptr : &g;
  }
};

}  // namespace

struct SlaApi::Impl {
  Impl(store::Store& s, const Clock& c, sla::Runtime& r, AgentApi& a, AuthOptions o,
       FakeClock* f, SlaApiOptions opts)
      : store(s), agents(s.database()), clock(c), runtime(r), agent_api(a), auth(s, c, o),
        fake_clock(f), options(opts) {}

  store::Store& store;
  store::AgentStore agents;
  const Clock& clock;
  sla::Runtime& runtime;
  AgentApi& agent_api;
  Authenticator auth;
  FakeClock* fake_clock;
  SlaApiOptions options;
  std::vector<std::unique_ptr<grpc::Service>> services;

  std::mutex mutex;
  bool stopping = false;
  std::set<grpc::ServerContext*> live;

  bool Track(grpc::ServerContext* c) {
    std::lock_guard<std::mutex> lock(mutex);
    if (stopping) return false;
    live.insert(c);
    return true;
  }
  void Untrack(grpc::ServerContext* c) {
    std::lock_guard<std::mutex> lock(mutex);
    live.erase(c);
  }

  absl::Status Refresh(const std::string& node, Holders& h) {
    SV_ASSIGN_OR_RETURN(auto rows, agents.RunningOnNode(node));
    h.rows = std::move(rows);
    h.by_gpu.clear();
    h.by_instance.clear();
    h.targets.clear();
    h.target_rows.clear();
    constexpr int kNodeGpusMax = 1024;  // Bounds the vector; real nodes have 8.
    for (const auto& row : h.rows) {
      if (row.node_gpu_index < 0 || row.node_gpu_index >= kNodeGpusMax) continue;
      auto [it, added] = h.by_instance.try_emplace(row.instance_id, 0);
      if (added) {
        it->second = static_cast<int>(h.targets.size());
        h.targets.push_back({&row.instance_id, row.instance_gpu_count});
        h.target_rows.push_back(&row);
      }
      h.target_rows[it->second] = &row;  // As before: the last row of the instance.
      if (static_cast<size_t>(row.node_gpu_index) >= h.by_gpu.size()) {
        h.by_gpu.resize(row.node_gpu_index + 1);
      }
      h.by_gpu[row.node_gpu_index] = {it->second, row.instance_gpu_ordinal};
    }
    h.loaded = std::chrono::steady_clock::now();
    h.valid = true;
    return absl::OkStatus();
  }

  void AddFleetUtilization(const std::string& node, const v1::SlaTelemetryBatch& batch,
                           absl::Time now);
  absl::Status IngestBatch(const std::string& node, const v1::SlaTelemetryBatch& batch,
                           Holders& holders, v1::StreamTelemetryResponse& totals);

  // The caller may read this instance's windows: its tenant, or an operator.
  absl::StatusOr<std::pair<std::string, int>> CheckOwner(const store::Principal& who,
                                                         const std::string& instance_id) {
    SV_RETURN_IF_ERROR(internal::CheckInstanceId(instance_id));
    SV_ASSIGN_OR_RETURN(auto owner, runtime.store().InstanceOwner(instance_id));
    if (!owner || (owner->first != who.tenant_id && !who.platform_admin())) {
      return Error(absl::StatusCode::kNotFound, "INSTANCE_NOT_FOUND",
                   absl::StrCat("instance ", instance_id.substr(0, 64), " not found"));
    }
    return *owner;
  }

  // The window of an hour not judged yet: this replica's memory merged with
  // the other replicas' checkpoints.
  absl::StatusOr<std::optional<sla::Evidence>> OpenEvidence(const std::string& instance_id,
                                                           absl::Time hour) {
    std::optional<sla::Evidence> e = runtime.monitor().Find(instance_id, hour);
    SV_ASSIGN_OR_RETURN(auto rows, runtime.store().CheckpointsOf(instance_id, hour));
    for (const auto& row : rows) {
      // Our own row is older than our memory, unless memory was forgotten.
      if (row.replica == runtime.options().replica && e) continue;
      auto decoded = sla::DecodeEvidence(hour, row.evidence);
      if (!decoded.ok()) continue;
      if (!e) {
        e = *std::move(decoded);
      } else {
        sla::MergeEvidence(*e, *decoded);
      }
    }
    return e;
  }

  // The hour so far, judged as the judge would if the hour ended now: on
  // the minutes charged so far, and on the later minutes with reports,
  // which billing has not reached yet (before the first charge, those
  // alone). So a fresh instance is not shown the hour before it started,
  // nor its last seconds, not yet reported, as missing.
  absl::Status OpenToProto(const std::string& instance_id, absl::Time hour,
                           const sla::Evidence& e, v1::SlaWindow* out) {
    SV_ASSIGN_OR_RETURN(auto rent, runtime.store().RentOf(instance_id, hour));
    out->set_instance_id(instance_id);
    *out->mutable_hour_start_time() = ToProto(hour);
    out->set_state(v1::OPEN);
    uint64_t minutes = 0;
    int after = 0;  // Minutes of the hour billing has not reached.
    if (rent) {
      *out->mutable_billed_start_time() =
          ToProto(std::max(hour, absl::FromUnixSeconds(rent->first_minute * 60)));
      *out->mutable_billed_end_time() = ToProto(std::min(
          hour + absl::Hours(1), absl::FromUnixSeconds((rent->last_minute + 1) * 60)));
      out->set_rent_micros(rent->rent_micros);
      minutes = rent->charged_minutes;
      after = static_cast<int>(rent->last_minute + 1 - absl::ToUnixSeconds(hour) / 60);
    }
    const sla::SlotMask reported = e.window.AnyReported();
    constexpr int kSlotsPerMinute = 60 / sla::kSlotSeconds;
    for (int m = std::max(after, 0); m < 60; ++m) {
      for (int s = m * kSlotsPerMinute; s < (m + 1) * kSlotsPerMinute; ++s) {
        if (reported[s]) minutes |= uint64_t{1} << m;
      }
    }
    AggregatesToProto(e, minutes, out);
    return absl::OkStatus();
  }
};

// The dashboard's fleet utilization: every sample of the batch, held GPU or
// idle, summed per hour (a batch rarely spans two).
void SlaApi::Impl::AddFleetUtilization(const std::string& node,
                                       const v1::SlaTelemetryBatch& batch, absl::Time now) {
  int64_t hour = -1, sum = 0, count = 0;
  auto add = [&] {
    if (count > 0) {
      options.fleet_utilization->Add(node, absl::FromUnixSeconds(hour * 3600), sum, count);
    }
    sum = count = 0;
  };
  for (const auto& s : batch.gpu_samples()) {
    if (!ValidTimestamp(s.sample_time())) continue;
    const int64_t seconds = s.sample_time().seconds() == 0 && s.sample_time().nanos() == 0
                                ? absl::ToUnixSeconds(now)
                                : s.sample_time().seconds();
    // Clock nonsense from an agent does not make hours of its own.
    if (seconds < 0 || seconds > absl::ToUnixSeconds(now) + 3600) continue;
    if (seconds / 3600 != hour) {
      add();
      hour = seconds / 3600;
    }
    sum += std::clamp(s.utilization_pct(), 0, 100);
    ++count;
  }
  add();
}

absl::Status SlaApi::Impl::IngestBatch(const std::string& node,
                                       const v1::SlaTelemetryBatch& batch, Holders& holders,
                                       v1::StreamTelemetryResponse& totals) {
  if (batch.gpu_samples_size() > kGpuSamplesPerBatchMax ||
      batch.storage_probes_size() > kProbesPerBatchMax ||
      batch.latency_size() > kProbesPerBatchMax) {
    return Invalid("TELEMETRY_TOO_LARGE",
                   absl::StrCat("a telemetry batch carries at most ", kGpuSamplesPerBatchMax,
                                " GPU samples and ", kProbesPerBatchMax,
                                " probes and histograms of each kind"));
  }
  const absl::Time now = clock.Now();
  if (options.fleet_utilization != nullptr) AddFleetUtilization(node, batch, now);
  const auto age = std::chrono::steady_clock::now() - holders.loaded;
  if (!holders.valid || age > absl::ToChronoNanoseconds(options.holders_ttl)) {
    SV_RETURN_IF_ERROR(Refresh(node, holders));
  }
  // The target of a probe's or histogram's instance id; they come in runs
  // of one instance, so the map is searched once per run.
  const std::string* last_id = nullptr;
  int last_target = -1;
  auto target_of = [&](const std::string& id) {
    if (last_id == nullptr || *last_id != id) {
      auto h = holders.by_instance.find(id);
      last_id = &id;
      last_target = h == holders.by_instance.end() ? -1 : h->second;
    }
    return last_target;
  };
  // A GPU or instance we do not know may have started since: look again,
  // at most every kHoldersRefreshMin.
  bool unknown = false;
  for (const auto& s : batch.gpu_samples()) unknown |= holders.GpuAt(s.gpu_index()) == nullptr;
  for (const auto& p : batch.storage_probes()) unknown |= target_of(p.instance_id()) < 0;
  for (const auto& l : batch.latency()) unknown |= target_of(l.instance_id()) < 0;
  if (unknown && std::chrono::steady_clock::now() - holders.loaded >
                     absl::ToChronoNanoseconds(kHoldersRefreshMin)) {
    SV_RETURN_IF_ERROR(Refresh(node, holders));
  }
  last_id = nullptr;

  // Attribution, in the packed form (sla/monitor.h): a GPU's instance by
  // vector index, times without absl::Time arithmetic, nothing allocated
  // once the stream's scratch has grown to its batches.
  sla::PackedBatch& in = holders.packed;
  in.Clear();
  in.node_name = node;
  in.targets = holders.targets;
  const sla::PackedTime received = sla::PackTime(now);
  auto packed_time = [&received](const google::protobuf::Timestamp& t) {
    if (t.seconds() == 0 && t.nanos() == 0) return received;  // As FromProto.
    return sla::PackedTime{t.seconds(), t.nanos()};
  };
  int64_t dropped = 0;
  // A sample from before the instance's run began here is refused: a node
  // may not back-date samples onto time another node served. One slot
  // (10 s) of slack keeps the samples of the slot the run began in.
  auto before_run = [&holders](int target, const sla::PackedTime& at) {
    return at.seconds < holders.target_rows[target]->running_since_s - 10;
  };
  holders.utilization.assign(holders.targets.size(), {0, 0});
  bool idle_watched = false;
  in.gpu_samples.reserve(batch.gpu_samples_size());
  for (const auto& s : batch.gpu_samples()) {
    const Holders::Gpu* h = holders.GpuAt(s.gpu_index());
    if (h == nullptr || !ValidTimestamp(s.sample_time()) ||
        before_run(h->target, packed_time(s.sample_time()))) {
      ++dropped;  // An idle GPU belongs to nobody.
      continue;
    }
    in.gpu_samples.push_back(
        {packed_time(s.sample_time()), static_cast<uint32_t>(h->target), h->ordinal,
         s.xid_errors() > 0 || s.ecc_uncorrected_errors() > 0 ||
             (s.throttle_reasons() & agent::kThrottleUnhealthyMask) != 0});
    if (holders.target_rows[h->target]->idle_seconds > 0) {
      auto& u = holders.utilization[h->target];
      u.first += std::clamp(s.utilization_pct(), 0, 100);
      ++u.second;
      idle_watched = true;
    }
  }
  in.storage_probes.reserve(batch.storage_probes_size());
  for (const auto& p : batch.storage_probes()) {
    const int target = target_of(p.instance_id());
    // 0 bytes: the agent's probe failed (its writes or fsync), 0 B/s.
    if (target < 0 || p.bytes_written() < 0 || p.bytes_written() > kProbeBytesMax ||
        p.duration_us() <= 0 || !ValidTimestamp(p.probe_time()) ||
        before_run(target, packed_time(p.probe_time()))) {
      ++dropped;
      continue;
    }
    in.storage_probes.push_back({packed_time(p.probe_time()), static_cast<uint32_t>(target),
                                 p.bytes_written() * 1'000'000 / p.duration_us()});
  }
  in.latency.reserve(batch.latency_size());
  for (const auto& l : batch.latency()) {
    const int target = target_of(l.instance_id());
    bool ok = target >= 0 && ValidTimestamp(l.sample_time()) &&
              !before_run(target, packed_time(l.sample_time())) &&
              l.bucket_indices_size() == l.bucket_counts_size() &&
              l.bucket_indices_size() <= sla::LatencyHistogram::kBucketsMax &&
              l.zero_count() >= 0 && l.zero_count() <= kLatencyCountMax;
    for (int i = 0; ok && i < l.bucket_indices_size(); ++i) {
      ok = l.bucket_counts(i) >= 0 && l.bucket_counts(i) <= kLatencyCountMax &&
           sla::LatencyHistogram::ValidBucket(l.bucket_indices(i));
    }
    if (!ok) {
      ++dropped;
      continue;
    }
    in.latency.push_back({packed_time(l.sample_time()), static_cast<uint32_t>(target),
                          l.zero_count(), static_cast<uint32_t>(in.bucket_indices.size()),
                          static_cast<uint32_t>(l.bucket_indices_size())});
    in.bucket_indices.insert(in.bucket_indices.end(), l.bucket_indices().begin(),
                             l.bucket_indices().end());
    in.bucket_counts.insert(in.bucket_counts.end(), l.bucket_counts().begin(),
                            l.bucket_counts().end());
  }
  sla::IngestCounts counts = runtime.monitor().Ingest(in, now);
  counts.dropped += dropped;
  totals.set_batches(totals.batches() + 1);
  totals.set_samples_accepted(totals.samples_accepted() + counts.accepted);
  totals.set_samples_dropped(totals.samples_dropped() + counts.dropped);
  totals.set_samples_late(totals.samples_late() + counts.late);
  const char* help = "SLA telemetry samples received, by outcome.";
  if (counts.accepted) {
    Metrics().IncrementCounter("sv_sla_samples_total", help, {{"result", "accepted"}},
                               static_cast<double>(counts.accepted));
  }
  if (counts.dropped) {
    Metrics().IncrementCounter("sv_sla_samples_total", help, {{"result", "dropped"}},
                               static_cast<double>(counts.dropped));
  }
  if (counts.late) {
    Metrics().IncrementCounter("sv_sla_samples_total", help, {{"result", "late"}},
                               static_cast<double>(counts.late));
    spdlog::info("sla: node {} sent {} sample(s) after their hour's grace period; ignored",
                 node, counts.late);
  }
  if (idle_watched) {
    std::map<std::string, bool> idle;
    for (size_t t = 0; t < holders.utilization.size(); ++t) {
      const auto& [sum, samples] = holders.utilization[t];
      if (samples == 0) continue;
      const store::NodeGpuHolder& row = *holders.target_rows[t];
      idle[row.instance_id] = sum < static_cast<int64_t>(row.idle_utilization_pct) * samples;
    }
    absl::Status s = agents.UpdateIdleStreaks(idle, now, options.telemetry_interval);
    if (!s.ok()) spdlog::warn("sla: node {}: idle streaks not updated: {}", node, s.ToString());
  }
  return absl::OkStatus();
}

namespace {

class TelemetryServiceImpl final : public v1::SlaTelemetryService::Service {
 public:
  explicit TelemetryServiceImpl(SlaApi::Impl& api) : api_(api) {}

  grpc::Status StreamTelemetry(grpc::ServerContext* context,
                               grpc::ServerReader<v1::SlaTelemetryBatch>* reader,
                               v1::StreamTelemetryResponse* response) override {
    // The stream is ended when its node credential is revoked.
    auto node = api_.agent_api.AuthenticateNodeStream(context);
    if (!node.ok()) {
      spdlog::warn("sla: rejected a telemetry stream from {}: {}", context->peer(),
                   node.status().ToString());
      return ToGrpcStatus(node.status());
    }
    if (!api_.Track(context)) {
      api_.agent_api.EndNodeStream(context);
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "svd is stopping");
    }
    Holders holders;
    v1::SlaTelemetryBatch batch;
    absl::Status status;
    while (status.ok() && reader->Read(&batch)) {
      status = api_.IngestBatch(*node, batch, holders, *response);
    }
    api_.Untrack(context);
    api_.agent_api.EndNodeStream(context);
    if (!status.ok()) {
      spdlog::warn("sla: node {}: telemetry stream ended: {}", *node, status.ToString());
    }
    return ToGrpcStatus(status);
  }

 private:
  SlaApi::Impl& api_;
};

class SlaServiceImpl final : public v1::SlaService::Service {
 public:
  explicit SlaServiceImpl(SlaApi::Impl& api) : api_(api) {}

  grpc::Status GetSlaWindow(grpc::ServerContext* context, const v1::GetSlaWindowRequest* request,
                            v1::SlaWindow* response) override {
    auto who = api_.auth.Authenticate(*context);
    if (!who.ok()) return internal::Finish("GetSlaWindow", nullptr, "", who.status());
    return internal::Finish("GetSlaWindow", &*who, "", Get(*who, *request, response));
  }

  grpc::Status ListSlaWindows(grpc::ServerContext* context,
                              const v1::ListSlaWindowsRequest* request,
                              v1::ListSlaWindowsResponse* response) override {
    auto who = api_.auth.Authenticate(*context);
    if (!who.ok()) return internal::Finish("ListSlaWindows", nullptr, "", who.status());
    return internal::Finish("ListSlaWindows", &*who, "", List(*who, *request, response));
  }

 private:
  absl::Status Get(const store::Principal& who, const v1::GetSlaWindowRequest& r,
                   v1::SlaWindow* out) {
    SV_RETURN_IF_ERROR(api_.CheckOwner(who, r.instance_id()).status());
    const auto& t = r.hour_start_time();
    if (!ValidTimestamp(t) || t.nanos() != 0 || t.seconds() % 3600 != 0) {
      return Invalid("INVALID_HOUR", "hour_start_time must be a whole hour (UTC)");
    }
    const absl::Time hour = absl::FromUnixSeconds(t.seconds());
    SV_ASSIGN_OR_RETURN(auto row, api_.runtime.store().GetWindow(r.instance_id(), hour));
    if (row) return JudgedToProto(*row, out);
    SV_ASSIGN_OR_RETURN(auto cursor, api_.runtime.store().JudgedBefore());
    const bool judged_hour = cursor && hour < *cursor;
    const absl::Time now = api_.clock.Now();
    if (!judged_hour && hour <= now) {
      SV_ASSIGN_OR_RETURN(auto evidence, api_.OpenEvidence(r.instance_id(), hour));
      if (evidence) return api_.OpenToProto(r.instance_id(), hour, *evidence, out);
    }
    return Error(absl::StatusCode::kNotFound, "SLA_WINDOW_NOT_FOUND",
                 "no SLA window for that instance-hour (no rent, or no telemetry yet)");
  }

  absl::Status List(const store::Principal& who, const v1::ListSlaWindowsRequest& r,
                    v1::ListSlaWindowsResponse* out) {
    SV_RETURN_IF_ERROR(api_.CheckOwner(who, r.instance_id()).status());
    if (r.page_size() < 0) return Invalid("INVALID_PAGE_SIZE", "page_size must be >= 0");
    const int limit = r.page_size() == 0 ? kWindowsPageDefault
                                         : std::min(r.page_size(), kWindowsPageMax);
    absl::Time before = absl::InfiniteFuture();
    if (!r.page_token().empty()) {
      int64_t seconds = 0;
      if (!absl::SimpleAtoi(r.page_token(), &seconds) || seconds % 3600 != 0 ||
          seconds < kTimestampSecondsMin || seconds > kTimestampSecondsMax) {
        return Invalid("INVALID_PAGE_TOKEN", "page_token is not one this server returned");
      }
      before = absl::FromUnixSeconds(seconds);
    } else {
      // Open hours come first, newest first, on the first page only: those
      // in this replica's memory and those other replicas checkpointed
      // (the agents' streams may reach any replica).
      SV_ASSIGN_OR_RETURN(auto cursor, api_.runtime.store().JudgedBefore());
      SV_ASSIGN_OR_RETURN(auto hours, api_.runtime.store().CheckpointHoursOf(r.instance_id()));
      for (absl::Time hour : api_.runtime.monitor().HoursOf(r.instance_id())) {
        hours.push_back(hour);
      }
      std::sort(hours.begin(), hours.end(), std::greater<>());
      hours.erase(std::unique(hours.begin(), hours.end()), hours.end());
      for (absl::Time hour : hours) {
        if (cursor && hour < *cursor) continue;
        SV_ASSIGN_OR_RETURN(auto evidence, api_.OpenEvidence(r.instance_id(), hour));
        if (!evidence) continue;
        SV_RETURN_IF_ERROR(
            api_.OpenToProto(r.instance_id(), hour, *evidence, out->add_windows()));
      }
      // The judged part starts at 9999 so every judged hour is listed.
      before = absl::FromUnixSeconds(253'402'297'200);
    }
    SV_ASSIGN_OR_RETURN(auto rows,
                        api_.runtime.store().ListWindows(r.instance_id(), before, limit + 1));
    for (size_t i = 0; i < rows.size() && static_cast<int>(i) < limit; ++i) {
      SV_RETURN_IF_ERROR(JudgedToProto(rows[i], out->add_windows()));
    }
    if (static_cast<int>(rows.size()) > limit) {
      out->set_next_page_token(absl::StrCat(absl::ToUnixSeconds(rows[limit - 1].hour_start)));
    }
    return absl::OkStatus();
  }

  SlaApi::Impl& api_;
};

class SlaAdminServiceImpl final : public v1::SlaAdminService::Service {
 public:
  explicit SlaAdminServiceImpl(SlaApi::Impl& api) : api_(api) {}

  grpc::Status GetSlaReport(grpc::ServerContext* context, const v1::GetSlaReportRequest* request,
                            v1::GetSlaReportResponse* response) override {
    auto who = Operator(*context);
    if (!who.ok()) return internal::Finish("GetSlaReport", nullptr, "", who.status());
    return internal::Finish("GetSlaReport", &*who, "", Report(*request, response));
  }

  grpc::Status SetSlaOverrides(grpc::ServerContext* context,
                               const v1::SetSlaOverridesRequest* request,
                               v1::SetSlaOverridesResponse* response) override {
    auto who = Operator(*context);
    if (!who.ok()) return internal::Finish("SetSlaOverrides", nullptr, "", who.status());
    return internal::Finish("SetSlaOverrides", &*who, "", Set(*request, response));
  }

  grpc::Status GetSlaDefinitions(grpc::ServerContext* context,
                                 const v1::GetSlaDefinitionsRequest* request,
                                 v1::GetSlaDefinitionsResponse* response) override {
    auto who = Operator(*context);
    if (!who.ok()) return internal::Finish("GetSlaDefinitions", nullptr, "", who.status());
    return internal::Finish("GetSlaDefinitions", &*who, "", Definitions(*request, response));
  }

 private:
  absl::StatusOr<store::Principal> Operator(const grpc::ServerContext& context) {
    SV_ASSIGN_OR_RETURN(store::Principal who, api_.auth.Authenticate(context));
    if (!who.platform_admin()) {
      return Error(absl::StatusCode::kPermissionDenied, "OPERATOR_ONLY",
                   "only an operator may do this");
    }
    return who;
  }

  absl::Status Report(const v1::GetSlaReportRequest& r, v1::GetSlaReportResponse* out) {
    const absl::Time now = api_.clock.Now();
    if ((r.has_start_time() && !ValidTimestamp(r.start_time())) ||
        (r.has_end_time() && !ValidTimestamp(r.end_time()))) {
      return Invalid("INVALID_TIME", "start_time or end_time is not a valid timestamp");
    }
    const absl::Time from = r.has_start_time() ? FromProto(r.start_time(), now)
                                               : now - absl::Hours(24 * 30);
    const absl::Time to = r.has_end_time() ? FromProto(r.end_time(), now) : now;
    SV_ASSIGN_OR_RETURN(auto report, api_.runtime.store().Report(from, to));
    out->set_windows_judged(report.windows_judged);
    out->set_windows_breached(report.windows_breached);
    out->set_refunded_micros_total(report.refunded_micros_total);
    out->set_late_samples_ignored(report.late_samples_ignored);
    auto fill = [](const std::vector<store::SlaReportRow>& rows,
                   google::protobuf::RepeatedPtrField<v1::SlaReportRow>* dest) {
      for (const auto& row : rows) {
        auto* d = dest->Add();
        d->set_key(row.key);
        d->set_breaches(row.breaches);
        d->set_refund_micros(row.refund_micros);
      }
    };
    fill(report.by_metric, out->mutable_by_metric());
    fill(report.by_node, out->mutable_by_node());
    fill(report.by_leaf_switch, out->mutable_by_leaf_switch());
    return absl::OkStatus();
  }

  absl::Status Set(const v1::SetSlaOverridesRequest& r, v1::SetSlaOverridesResponse* out) {
    if (r.tenant_id().empty() || r.tenant_id().size() > 64) {
      return Invalid("INVALID_TENANT_ID", "tenant_id is required");
    }
    if (r.definitions_size() > 3) {
      return Invalid("INVALID_SLA_DEFINITION", "at most one override per metric");
    }
    std::vector<sla::SlaDefinition> overrides;
    std::set<sla::Metric> seen;
    for (const auto& p : r.definitions()) {
      SV_ASSIGN_OR_RETURN(sla::SlaDefinition d, DefinitionFromProto(p));
      if (!seen.insert(d.metric).second) {
        return Invalid("INVALID_SLA_DEFINITION", "at most one override per metric");
      }
      overrides.push_back(d);
    }
    auto effective = sla::ApplyOverrides(api_.runtime.options().definitions, overrides);
    if (!effective.ok()) {
      return Invalid("INVALID_SLA_DEFINITION", std::string(effective.status().message()));
    }
    std::vector<store::SlaOverrideRow> rows;
    for (const auto& d : overrides) {
      rows.push_back({r.tenant_id(), sla::MetricName(d.metric), sla::AggregationName(d.aggregation),
                      sla::ComparisonName(d.comparison), d.threshold, d.refund_basis_points});
    }
    SV_RETURN_IF_ERROR(
        api_.runtime.store().SetOverrides(r.tenant_id(), rows, api_.clock.Now()));
    spdlog::info("sla: tenant {} now has {} SLA override(s)", r.tenant_id(), rows.size());
    out->set_tenant_id(r.tenant_id());
    for (const auto& d : *effective) DefinitionToProto(d, out->add_effective());
    return absl::OkStatus();
  }

  absl::Status Definitions(const v1::GetSlaDefinitionsRequest& r,
                           v1::GetSlaDefinitionsResponse* out) {
    std::vector<store::SlaOverrideRow> rows;
    if (!r.tenant_id().empty()) {
      SV_ASSIGN_OR_RETURN(rows, api_.runtime.store().Overrides(r.tenant_id()));
    }
    for (const auto& d : api_.runtime.Effective(rows)) {
      DefinitionToProto(d, out->add_effective());
    }
    for (const auto& row : rows) {
      auto* d = out->add_overrides();
      auto m = sla::ParseMetric(row.metric);
      auto a = sla::ParseAggregation(row.aggregation);
      auto c = sla::ParseComparison(row.comparison);
      if (m.ok() && a.ok() && c.ok()) {
        DefinitionToProto({*m, *a, *c, row.threshold, row.refund_basis_points}, d);
      }
    }
    return absl::OkStatus();
  }

  SlaApi::Impl& api_;
};

class DevClockServiceImpl final : public v1::DevClockService::Service {
 public:
  explicit DevClockServiceImpl(SlaApi::Impl& api) : api_(api) {}

  grpc::Status AdvanceClock(grpc::ServerContext* context, const v1::AdvanceClockRequest* request,
                            v1::ClockTime* response) override {
    auto who = api_.auth.Authenticate(*context);
    if (!who.ok()) return internal::Finish("AdvanceClock", nullptr, "", who.status());
    absl::Status status;
    const absl::Duration by = absl::Seconds(request->by().seconds()) +
                              absl::Nanoseconds(request->by().nanos());
    if (!who->platform_admin()) {
      status = Error(absl::StatusCode::kPermissionDenied, "OPERATOR_ONLY",
                     "only an operator may move the clock");
    } else if (by <= absl::ZeroDuration() || by > kAdvanceMax) {
      status = Invalid("INVALID_DURATION", "by must be positive and at most 31 days");
    } else {
      api_.fake_clock->Advance(by);
      spdlog::info("clock: advanced by {} to {}", absl::FormatDuration(by),
                   absl::FormatTime(api_.fake_clock->Now()));
      *response->mutable_now() = ToProto(api_.fake_clock->Now());
    }
    return internal::Finish("AdvanceClock", &*who, "", status);
  }

  grpc::Status GetClock(grpc::ServerContext* context, const v1::GetClockRequest*,
                        v1::ClockTime* response) override {
    auto who = api_.auth.Authenticate(*context);
    if (!who.ok()) return internal::Finish("GetClock", nullptr, "", who.status());
    absl::Status status;
    if (!who->platform_admin()) {
      status = Error(absl::StatusCode::kPermissionDenied, "OPERATOR_ONLY",
                     "only an operator may read the dev clock");
    } else {
      *response->mutable_now() = ToProto(api_.fake_clock->Now());
    }
    return internal::Finish("GetClock", &*who, "", status);
  }

 private:
  SlaApi::Impl& api_;
};

}  // namespace

SlaApi::SlaApi(store::Store& store, const Clock& clock, sla::Runtime& runtime, AgentApi& agents,
               AuthOptions auth, FakeClock* fake_clock, SlaApiOptions options)
    : impl_(std::make_unique<Impl>(store, clock, runtime, agents, auth, fake_clock, options)) {
  impl_->services.push_back(std::make_unique<TelemetryServiceImpl>(*impl_));
  impl_->services.push_back(std::make_unique<SlaServiceImpl>(*impl_));
  impl_->services.push_back(std::make_unique<SlaAdminServiceImpl>(*impl_));
  if (fake_clock != nullptr) {
    impl_->services.push_back(std::make_unique<DevClockServiceImpl>(*impl_));
  }
  metrics::Registry::Default().AddCollector([impl = impl_.get()](metrics::Registry& r) {
    r.SetGauge("sv_sla_open_windows", "Instance-hours held in memory by the SLA monitor.", {},
               static_cast<double>(impl->runtime.monitor().window_count()));
  });
}

SlaApi::~SlaApi() { Stop(); }

void SlaApi::RegisterWith(grpc::ServerBuilder& builder) {
  for (auto& s : impl_->services) builder.RegisterService(s.get());
}

void SlaApi::Stop() {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->stopping = true;
  for (grpc::ServerContext* c : impl_->live) c->TryCancel();
}

}  // namespace sv::api
