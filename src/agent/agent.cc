#include "agent/agent.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "agent/assignment.h"
#include "agent/telemetry_collector.h"
#include "google/protobuf/util/time_util.h"
#include "spdlog/spdlog.h"
#include "sv/v1/agent.grpc.pb.h"
#include "sv/v1/sla.grpc.pb.h"

namespace sv::agent {
namespace {

using google::protobuf::util::TimeUtil;
constexpr absl::Duration kTick = absl::Milliseconds(50);
// The loop's sleep between timers, when no fault script ticks it.
constexpr absl::Duration kRestMin = absl::Milliseconds(5);
constexpr absl::Duration kRestMax = absl::Seconds(1);
constexpr char kAgentVersion[] = "0.1.0";
constexpr int kReportBatchMax = 64;  // agent.proto InstanceReports.

google::protobuf::Timestamp ToProto(absl::Time t) {
  return TimeUtil::MicrosecondsToTimestamp(absl::ToUnixMicros(t));
}

}  // namespace

// The largest message the agent reads from svd (a desired set).
constexpr int kDesiredSetBytesMax = 64 << 20;

// One connection to svd: registers, then loops sending heartbeats, reports
// and telemetry while a reader thread takes svd's desired instance sets.
class Agent::Session {
 public:
  Session(Agent& agent) : a_(agent), o_(agent.options_) {}

  // Returns true when the agent should stop for good (a scripted death).
  bool Run(v1::AgentService::Stub& stub, v1::SlaTelemetryService::Stub& telemetry_stub,
           bool* registered) {
    grpc::ClientContext context;
    context.AddMetadata("authorization", "Bearer " + o_.credential);
    auto stream = stub.Connect(&context);
    if (!stream->Write(RegisterMessage())) return Finish(context, *stream, false);
    v1::ServerMessage first;
    if (!stream->Read(&first) || !first.has_registered()) return Finish(context, *stream, false);
    *registered = true;
    ApplyIntervals(first.registered());
    spdlog::info("agent: {} registered as {} with svd at {}", o_.node_name,
                 first.registered().node_id(), o_.endpoint);
    // Telemetry has its own client stream (SlaTelemetryService).
    grpc::ClientContext telemetry_context;
    telemetry_context.AddMetadata("authorization", "Bearer " + o_.credential);
    v1::StreamTelemetryResponse telemetry_summary;
    telemetry_writer_ = telemetry_stub.StreamTelemetry(&telemetry_context, &telemetry_summary);
    std::thread reader([&] { ReadLoop(*stream); });
    bool dead = Loop(context, *stream);
    context.TryCancel();
    telemetry_context.TryCancel();
    reader.join();
    grpc::Status telemetry_status = telemetry_writer_->Finish();
    if (!telemetry_status.ok() && telemetry_status.error_code() != grpc::StatusCode::CANCELLED) {
      spdlog::warn("agent: {}: telemetry stream ended: {} {}", o_.node_name,
                   static_cast<int>(telemetry_status.error_code()),
                   telemetry_status.error_message());
    }
    Finish(context, *stream, dead);
    return dead;
  }

 private:
  using Stream = grpc::ClientReaderWriter<v1::AgentMessage, v1::ServerMessage>;

  bool Finish(grpc::ClientContext& context, Stream& stream, bool dead) {
    context.TryCancel();
    grpc::Status status = stream.Finish();
    if (!status.ok() && status.error_code() != grpc::StatusCode::CANCELLED) {
      spdlog::warn("agent: {}: stream to svd ended: {} {}", o_.node_name,
                   static_cast<int>(status.error_code()), status.error_message());
    }
    return dead;
  }

  void ApplyIntervals(const v1::Registered& r) {
    if (r.heartbeat_interval_ms() > 0) heartbeat_ = absl::Milliseconds(r.heartbeat_interval_ms());
    if (r.telemetry_interval_ms() > 0) telemetry_ = absl::Milliseconds(r.telemetry_interval_ms());
    batch_reports_ = r.accepts_report_batches();
  }

  std::vector<std::string> RunningIds(bool* complete = nullptr) {
    std::vector<std::string> ids;
    auto list = a_.driver_->List();
    if (complete != nullptr) *complete = list.ok();
    if (!list.ok()) return ids;
    for (const auto& s : *list) {
      if (s.running) ids.push_back(s.instance_id);
    }
    return ids;
  }

  // What runs here, and (when the runtime could be listed) every instance
  // of the desired set this agent holds: svd ends the fences of the
  // volumes of instances in neither list (docs/storage.md, "Fences"). This
  // thread is the only one that starts processes, so an instance in
  // neither cannot get one before a later set names it.
  v1::AgentMessage HeartbeatMessage() {
    v1::AgentMessage m;
    auto* heartbeat = m.mutable_heartbeat();
    bool complete = false;
    for (auto& id : RunningIds(&complete)) heartbeat->add_running_instance_ids(id);
    if (complete) {
      heartbeat->set_lists_complete(true);
      std::lock_guard<std::mutex> lock(mutex_);
      for (const auto& [id, instance] : desired_) heartbeat->add_desired_instance_ids(id);
      heartbeat->set_applied_set_number(applied_set_number_);
    }
    return m;
  }

  v1::AgentMessage RegisterMessage() {
    v1::AgentMessage m;
    auto* r = m.mutable_register_();
    r->set_node_name(o_.node_name);
    r->set_gpu_model(o_.gpu_model);
    r->set_gpu_count(o_.gpu_count);
    r->set_zone(o_.zone);
    r->set_pod(o_.pod);
    r->set_leaf_switch(o_.leaf_switch);
    r->set_agent_version(kAgentVersion);
    r->set_driver(a_.driver_->Name());
    r->set_reports_mounts_on_connect(true);
    r->set_reports_complete_lists(true);
    for (auto& id : RunningIds()) r->add_running_instance_ids(id);
    return m;
  }

  void ReadLoop(Stream& stream) {
    v1::ServerMessage m;
    while (stream.Read(&m)) {
      if (m.has_desired()) {
        std::unique_lock<std::mutex> lock(mutex_);
        std::map<std::string, RuntimeInstance> previous;
        std::swap(previous, desired_);
        for (const auto& a : m.desired().instances()) {
          RuntimeInstance& instance = desired_[a.instance_id()] = InstanceFromAssignment(a);
          auto before = previous.find(a.instance_id());
          // The connection's first set: every instance gets a report of
          // what it has mounted. svd may have changed its mounts while no
          // connection was up (a detach waits for the agent's word), and
          // nothing this connection said would tell it otherwise.
          const bool mounts_changed = !have_desired_ ||
                                      (before == previous.end()
                                           ? !instance.volumes.empty()
                                           : before->second.volumes != instance.volumes);
          if (mounts_changed) mounts_told_[a.instance_id()] = ++mounts_told_count_;
        }
        received_set_number_ = m.desired().set_number();
        desired_changed_ = true;
        have_desired_ = true;
        lock.unlock();
        a_.Nudge();
      } else if (m.has_error()) {
        spdlog::warn("agent: {}: svd refused a message: {} {}", o_.node_name,
                     m.error().reason(), m.error().message());
      }
    }
    // svd ended the stream (or it broke): the loop connects again now, not
    // at its next write, which may be a heartbeat interval away.
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stream_ended_ = true;
    }
    a_.Nudge();
  }

  bool Loop(grpc::ClientContext& context, Stream& stream) {
    // The first heartbeat and telemetry batch come at a random point of their
    // interval: agents that (re)connected together (svd restarted, a
    // simulated fleet) would otherwise report in lockstep, every interval.
    std::mt19937 random(std::random_device{}());
    std::uniform_real_distribution<double> phase(0.0, 1.0);
    absl::Time next_heartbeat = absl::Now() + heartbeat_ * phase(random);
    absl::Time next_telemetry = absl::Now() + telemetry_ * phase(random);
    absl::Time next_poll = absl::Now();
    absl::Duration rest = kTick;
    uint64_t nudges = a_.Nudges();
    while (a_.SleepUnlessNudged(rest, nudges)) {
      nudges = a_.Nudges();
      rest = kTick;
      FaultState faults = CurrentFaults();
      if (faults.dead) {
        spdlog::warn("agent: {}: scripted death", o_.node_name);
        return true;
      }
      if (faults.heartbeats_lost) continue;  // Silent: svd hears nothing.
      bool changed = false;
      bool have_desired = false;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        std::swap(changed, desired_changed_);
        have_desired = have_desired_;
        if (stream_ended_) return false;
      }
      const absl::Time now = absl::Now();
      // Not before this connection's first desired set: until it comes
      // the agent knows nothing of what svd wants, and every instance
      // running here would count as unwanted and be removed (an svd slow
      // to send it, restarted or under load, cost every container on the
      // node at each reconnect).
      if (have_desired && (changed || now >= next_poll)) {
        if (!Reconcile(stream, changed)) return false;
        next_poll = now + o_.runtime_poll_interval;
      }
      if (now >= next_heartbeat || stopped_unwanted_) {
        // At once after a pass stopped an instance svd no longer wants, so
        // the volumes it had mounted are free for elsewhere without
        // waiting out the interval.
        stopped_unwanted_ = false;
        if (!stream.Write(HeartbeatMessage())) return false;
        next_heartbeat = now + heartbeat_;
      }
      collector_.Sample(a_.clock_.Now(), RunningInstances());
      if (now >= next_telemetry || collector_.full()) {
        if (!SendTelemetry()) return false;
        next_telemetry = now + telemetry_;
      }
      rest = RestUntilDue(now, std::min({next_poll, next_heartbeat, next_telemetry}));
    }
    return false;
  }

  // How long the loop may sleep: until `due` (wall time) or the next GPU
  // sample, whichever is sooner; a new desired set nudges it earlier. A
  // fault script's faults are timed to the tick, so with one it ticks.
  // Ticking always cost a simulated fleet of N nodes 20 N wake-ups a second
  // in svd's process, whatever the nodes had to do.
  absl::Duration RestUntilDue(absl::Time now, absl::Time due) {
    if (!o_.faults.empty()) return kTick;
    const absl::Duration to_sample = collector_.next_sample() - a_.clock_.Now();
    return std::clamp(std::min(due - now, to_sample), kRestMin, kRestMax);
  }

  FaultState CurrentFaults() {
    const absl::Duration since = a_.clock_.Now() - o_.fault_epoch;
    FaultState s = FaultsAt(o_.faults, o_.node_name, o_.gpu_count, fault_checked_, since);
    fault_checked_ = since;
    return s;
  }

  // The run an instance was started (or last confirmed) under; 0: unknown.
  int64_t RunOf(const std::string& id) const {
    auto it = a_.runs_.find(id);
    return it == a_.runs_.end() ? 0 : it->second;
  }

  // Whether svd, which still wants an ended instance under the run it
  // ended in, is to be told of the exit (again), and if so notes it told.
  // Once per connection, and again every heartbeat interval while svd goes
  // on wanting it: svd's write of the exit can fail (a database outage, a
  // lock timeout) and svd only logs that. Told once per connection, the
  // instance stayed RUNNING, billed and holding its GPUs for as long as the
  // stream lived. A repeat svd has already recorded is STALE_REPORT to it.
  bool EndedTellingDue(const std::string& id) {
    const absl::Time now = a_.clock_.Now();
    auto told = ended_told_.find(id);
    if (told != ended_told_.end() && now - told->second < heartbeat_) return false;
    ended_told_[id] = now;
    return true;
  }

  // Records the run an instance runs under (0: none), and saves the
  // record when that changes it.
  void SetRun(const std::string& id, int64_t run) {
    const bool changed = run == 0 ? a_.runs_.erase(id) > 0 : RunOf(id) != run;
    if (run != 0) a_.runs_[id] = run;
    if (changed) a_.SaveRecord();
  }

  // Tells svd of a change of an instance. To an svd that takes batches the
  // report waits in `pending_` for the end of the pass (FlushReports), so a
  // pass that starts eight instances costs svd one transaction, not eight.
  // `observed`: when the change was seen (default: now).
  bool Report(Stream& stream, const std::string& id, v1::AgentInstanceState state,
              int exit_code, const std::string& reason, int64_t run,
              absl::Time observed = absl::InfinitePast()) {
    v1::InstanceReport r;
    r.set_instance_id(id);
    r.set_state(state);
    r.set_run(run);
    r.set_exit_code(exit_code);
    r.set_reason(reason);
    *r.mutable_observe_time() =
        ToProto(observed == absl::InfinitePast() ? a_.clock_.Now() : observed);
    spdlog::info("agent: {}: instance {} {} {}", o_.node_name, id,
                 v1::AgentInstanceState_Name(state), reason);
    if (!batch_reports_) {
      v1::AgentMessage m;
      *m.mutable_report() = std::move(r);
      return stream.Write(m);
    }
    *pending_.add_reports() = std::move(r);
    return pending_.reports_size() < kReportBatchMax || FlushReports(stream);
  }

  bool FlushReports(Stream& stream) {
    if (pending_.reports_size() == 0) return true;
    v1::AgentMessage m;
    m.mutable_reports()->Swap(&pending_);
    return stream.Write(m);
  }

  // Tells svd what the instance has mounted here (agent.proto MountReport).
  bool ReportMounts(Stream& stream, const std::string& id, const std::string& error) {
    v1::AgentMessage m;
    auto* r = m.mutable_mounts();
    r->set_instance_id(id);
    r->set_error(error);
    for (const VolumeMap& v : a_.mounted_[id]) {
      auto* out = r->add_mounts();
      out->set_source(v.source);
      out->set_target(v.target);
      out->set_read_only(v.read_only);
      out->set_volume_id(v.volume_id);
    }
    return stream.Write(m);
  }

  // Hot attach and detach: brings the mounts of running instances to what
  // svd wants and confirms them. What is mounted is the agent's, not the
  // connection's (Agent::mounted_): a volume svd detached while the
  // connection was down is unmounted on the next. An instance found
  // running after an agent restart is taken to have the mounts svd wants.
  bool ReconcileMounts(Stream& stream, const std::map<std::string, RuntimeInstance>& desired,
                       const std::set<std::string>& running) {
    std::map<std::string, uint64_t> told;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      told = mounts_told_;
    }
    auto& mounted = a_.mounted_;
    for (const std::string& id : running) {
      auto want = desired.find(id);
      if (want == desired.end()) continue;
      std::string error;
      auto have = mounted.find(id);
      if (have == mounted.end()) {
        mounted[id] = want->second.volumes;
      } else if (have->second != want->second.volumes) {
        absl::Status changed = a_.driver_->SetVolumes(id, want->second.volumes);
        if (changed.ok()) {
          have->second = want->second.volumes;
          spdlog::info("agent: {}: instance {} now has {} mounts", o_.node_name, id,
                       have->second.size());
        } else {
          error = std::string(changed.message());
        }
      }
      // Report what changed since the last report (and every failure); an
      // instance that never had a mount needs no report. So does one whose
      // mounts svd changed in a desired set, even if nothing changed here:
      // a volume attached and detached again within one pass was never
      // mounted, and svd waits for a report that says so to end the detach.
      auto last = reported_.find(id);
      const bool changed = last == reported_.end() ? !mounted[id].empty()
                                                   : last->second != mounted[id];
      if (!changed && error.empty() && !told.count(id)) continue;
      if (!ReportMounts(stream, id, error)) return false;
      reported_[id] = mounted[id];
      // Unless a newer set marked it again meanwhile.
      std::lock_guard<std::mutex> lock(mutex_);
      auto mark = mounts_told_.find(id);
      auto seen = told.find(id);
      if (mark != mounts_told_.end() && seen != told.end() && mark->second == seen->second) {
        mounts_told_.erase(mark);
      }
    }
    {
      // Marks of instances svd no longer wants here go with them.
      std::lock_guard<std::mutex> lock(mutex_);
      for (auto it = mounts_told_.begin(); it != mounts_told_.end();) {
        it = desired_.count(it->first) ? std::next(it) : mounts_told_.erase(it);
      }
    }
    for (auto it = mounted.begin(); it != mounted.end();) {
      it = running.count(it->first) ? std::next(it) : mounted.erase(it);
    }
    for (auto it = reported_.begin(); it != reported_.end();) {
      it = running.count(it->first) ? std::next(it) : reported_.erase(it);
    }
    return true;
  }

  // Brings the authorized_keys of running instances to the tenant's keys
  // svd sent. One found running after an agent restart is written once (it
  // may have missed a change). A failure is logged once per key set: the
  // keys then apply at the instance's next start.
  void ReconcileKeys(const std::map<std::string, RuntimeInstance>& desired,
                     const std::set<std::string>& running) {
    for (const std::string& id : running) {
      auto want = desired.find(id);
      if (want == desired.end()) continue;
      auto have = keys_.find(id);
      if (have != keys_.end() && have->second == want->second.authorized_keys) continue;
      absl::Status set = a_.driver_->SetAuthorizedKeys(id, want->second.authorized_keys);
      if (set.ok()) {
        spdlog::info("agent: {}: instance {} now has {} SSH keys", o_.node_name, id,
                     want->second.authorized_keys.size());
      } else if (have != keys_.end()) {
        spdlog::warn("agent: {}: SSH keys of instance {} not changed: {}", o_.node_name, id,
                     std::string(set.message()));
      }
      keys_[id] = want->second.authorized_keys;
    }
    for (auto it = keys_.begin(); it != keys_.end();) {
      it = running.count(it->first) ? std::next(it) : keys_.erase(it);
    }
  }

  // Starts what svd wants and does not run, stops what runs unwanted, and
  // reports what ended by itself.
  bool StartedUnderOtherRun(const std::string& id,
                            const std::map<std::string, RuntimeInstance>& desired) const {
    auto want = desired.find(id);
    auto have = a_.runs_.find(id);
    return want != desired.end() && have != a_.runs_.end() && want->second.run != 0 &&
           have->second != want->second.run;
  }

  bool Reconcile(Stream& stream, bool desired_changed) {
    std::map<std::string, RuntimeInstance> desired;
    uint64_t set_number = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      desired = desired_;
      set_number = received_set_number_;
    }
    auto list = a_.driver_->List();
    if (!list.ok()) {
      spdlog::warn("agent: {}: runtime list failed: {}", o_.node_name, list.status().ToString());
      return true;
    }
    std::set<std::string> known;
    for (const RuntimeStatus& s : *list) {
      known.insert(s.instance_id);
      const bool wanted = desired.count(s.instance_id) > 0;
      if (s.running && !wanted) {
        (void)a_.driver_->Stop(s.instance_id);
        stopped_unwanted_ = true;
        if (!Report(stream, s.instance_id, v1::AGENT_STOPPED, 0, "svd no longer wants it",
                    RunOf(s.instance_id))) {
          return false;
        }
      } else if (!s.running) {
        if (!wanted) {
          // Ended while svd no longer wants it (the node was away while it
          // was stopped): forget it. Kept, with its run forgotten below, it
          // was taken for the end of the next run svd started here, and
          // that run was ended at once.
          (void)a_.driver_->Stop(s.instance_id);
          known.erase(s.instance_id);
        } else if (StartedUnderOtherRun(s.instance_id, desired)) {
          // An earlier run's process ended; svd has started the instance
          // again since: not news, and the loop below starts the new run.
          (void)a_.driver_->Stop(s.instance_id);  // Forget it.
          known.erase(s.instance_id);
        } else {
          // Kept past this connection (and, saved before the runtime
          // forgets it, past this process): a later one must neither start
          // it again nor leave svd unaware that it ended.
          const Agent::Ended ended{RunOf(s.instance_id), s.exit_code, s.detail,
                                   a_.clock_.Now()};
          a_.ended_[s.instance_id] = ended;
          a_.SaveRecord();
          (void)a_.driver_->Stop(s.instance_id);  // Forget it.
          ended_told_[s.instance_id] = a_.clock_.Now();
          if (!Report(stream, s.instance_id, v1::AGENT_EXITED, ended.exit_code, ended.detail,
                      ended.run, ended.observed)) {
            return false;
          }
        }
      } else if (StartedUnderOtherRun(s.instance_id, desired)) {
        // Stopped and started again by svd between two desired sets: the
        // old process must go, and the loop below starts a fresh one.
        (void)a_.driver_->Stop(s.instance_id);
        known.erase(s.instance_id);
      } else if (desired_changed) {
        // svd may have stopped and started it again since it last heard
        // from us; confirming what runs is idempotent. Not when svd says it
        // has the confirmations it waits for: every change of a node's set
        // would otherwise confirm every instance on it again (36 for a node
        // filled one instance at a time with 8).
        const RuntimeInstance& want = desired.at(s.instance_id);
        SetRun(s.instance_id, want.run);
        if (!want.confirmed &&
            !Report(stream, s.instance_id, v1::AGENT_STARTED, 0, "running", want.run)) {
          return false;
        }
      }
      if (!wanted) SetRun(s.instance_id, 0);
    }
    // An instance that ended is started again only under a new run. One
    // that ended during an earlier connection is told of again: that
    // connection may have broken before svd read the report (svd still
    // wants it under the run it ended in, so it does not know).
    for (auto it = a_.ended_.begin(); it != a_.ended_.end();) {
      auto want = desired.find(it->first);
      const Agent::Ended& ended = it->second;
      if (want != desired.end() && want->second.run != 0 && ended.run != 0 &&
          want->second.run != ended.run) {
        it = a_.ended_.erase(it);
        a_.SaveRecord();
        continue;
      }
      if (want != desired.end() && EndedTellingDue(it->first) &&
          !Report(stream, it->first, v1::AGENT_EXITED, ended.exit_code, ended.detail, ended.run,
                  ended.observed)) {
        return false;
      }
      ++it;
    }
    std::set<std::string> running;  // Wanted and running after this pass.
    for (const RuntimeStatus& st : *list) {
      if (st.running && known.count(st.instance_id) && desired.count(st.instance_id)) {
        running.insert(st.instance_id);
      }
    }
    bool started_any = false;
    for (const auto& [id, instance] : desired) {
      if (known.count(id) || a_.ended_.count(id)) continue;
      // Recorded first: an agent that dies between the two finds the
      // process under the run it was started for.
      const int64_t had_run = RunOf(id);
      SetRun(id, instance.run);
      absl::Status started = a_.driver_->Start(instance);
      if (!started.ok()) SetRun(id, had_run);
      if (started.ok()) {
        a_.mounted_[id] = instance.volumes;
        keys_[id] = instance.authorized_keys;
        running.insert(id);
        started_any = true;
      }
      if (!Report(stream, id, started.ok() ? v1::AGENT_STARTED : v1::AGENT_START_FAILED,
                  0, started.ok() ? "started" : std::string(started.message()), instance.run)) {
        return false;
      }
    }
    // An instance svd stopped wanting may be wanted again later (restart).
    // Nor is the run of one that ended or was forgotten kept past that.
    const size_t record_before = a_.ended_.size() + a_.runs_.size();
    for (auto it = a_.ended_.begin(); it != a_.ended_.end();) {
      it = desired.count(it->first) ? std::next(it) : a_.ended_.erase(it);
    }
    for (auto it = a_.runs_.begin(); it != a_.runs_.end();) {
      const bool keep = desired.count(it->first) || known.count(it->first);
      it = keep ? std::next(it) : a_.runs_.erase(it);
    }
    if (a_.ended_.size() + a_.runs_.size() != record_before) a_.SaveRecord();
    if (desired_changed) ReconcileKeys(desired, running);
    // Mount reports name instances the reports above started: those first.
    if (!FlushReports(stream)) return false;
    if ((desired_changed || started_any) && !ReconcileMounts(stream, desired, running)) {
      return false;
    }
    std::set<int> busy;
    for (const auto& [id, instance] : desired) {
      if (!a_.ended_.count(id)) busy.insert(instance.gpu_indices.begin(), instance.gpu_indices.end());
    }
    if (auto* sim = dynamic_cast<SimulatedTelemetry*>(a_.telemetry_.get())) sim->SetBusyGpus(busy);
    // Heartbeats echo this set from now on: its stops and starts are done.
    // Echoed as soon as it arrived, a heartbeat listing the runtime before
    // this pass applied it said a process of an old run was of the set's,
    // and svd confirmed (and billed) a new run before it was started.
    std::lock_guard<std::mutex> lock(mutex_);
    applied_set_number_ = set_number;
    return true;
  }

  // Instances svd wants here that have not ended.
  std::vector<std::string> RunningInstances() {
    std::vector<std::string> running;
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [id, instance] : desired_) {
      if (!a_.ended_.count(id)) running.push_back(id);
    }
    return running;
  }

  bool SendTelemetry() {
    collector_.Probe(a_.clock_.Now(), RunningInstances());
    if (collector_.empty()) return true;
    return telemetry_writer_->Write(collector_.Take());
  }

  Agent& a_;
  const AgentOptions& o_;
  absl::Duration heartbeat_ = o_.heartbeat_interval;
  absl::Duration telemetry_ = o_.telemetry_interval;
  bool batch_reports_ = false;   // svd said accepts_report_batches.
  v1::InstanceReports pending_;  // Reports of this pass, not yet sent.
  std::mutex mutex_;
  std::map<std::string, RuntimeInstance> desired_;
  bool desired_changed_ = false;
  bool have_desired_ = false;  // This connection's first desired set came.
  uint64_t received_set_number_ = 0;  // Of desired_ (DesiredInstances.set_number).
  uint64_t applied_set_number_ = 0;   // Of the last set a Reconcile pass applied.
  bool stream_ended_ = false;  // The reader saw the stream end.
  // A pass stopped an instance svd no longer wants; the next heartbeat
  // goes at once (the loop's thread only).
  bool stopped_unwanted_ = false;
  // Instances whose mounts a desired set changed since their last mount
  // report: each gets one, whatever it has mounted.
  std::map<std::string, uint64_t> mounts_told_;  // Id -> the mark's number.
  uint64_t mounts_told_count_ = 0;
  // Of the agent's ended instances (Agent::ended_), those this connection
  // has told svd of, and when.
  std::map<std::string, absl::Time> ended_told_;
  // The SSH keys each running instance has (agent/authorized_keys.h).
  std::map<std::string, std::vector<std::string>> keys_;
  std::map<std::string, std::vector<VolumeMap>> reported_;  // As last told to svd.
  absl::Duration fault_checked_ = absl::ZeroDuration();
  std::unique_ptr<grpc::ClientWriter<v1::SlaTelemetryBatch>> telemetry_writer_;
  // The agent's options are the collector's, and more (agent.h).
  TelemetryCollector collector_{CollectorOptions(o_), a_.telemetry_.get(), a_.clock_.Now()};
};

Agent::Agent(AgentOptions options, std::unique_ptr<RuntimeDriver> driver,
             std::unique_ptr<TelemetrySource> telemetry, const Clock& clock)
    : options_(std::move(options)),
      driver_(std::move(driver)),
      telemetry_(std::move(telemetry)),
      clock_(clock) {
  if (options_.record_file.empty()) return;
  auto loaded = LoadInstanceRecord(options_.record_file);
  if (!loaded.ok()) {
    // Starting with nothing remembered is what an agent without the file
    // did: it adopts what runs, and svd is told of exits from here on.
    spdlog::error("agent: {}: instance record not restored: {}", options_.node_name,
                  loaded.status().ToString());
    return;
  }
  record_ = *std::move(loaded);
  spdlog::info("agent: {}: instance record restored from {}: {} run(s), {} ended",
               options_.node_name, options_.record_file, runs_.size(), ended_.size());
}

void Agent::SaveRecord() {
  if (options_.record_file.empty()) return;
  if (absl::Status s = SaveInstanceRecord(options_.record_file, record_); !s.ok()) {
    spdlog::error("agent: {}: instance record not saved: {}", options_.node_name, s.ToString());
  }
}

Agent::~Agent() { Stop(); }

void Agent::Stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
}

bool Agent::Sleep(absl::Duration d) {
  std::unique_lock<std::mutex> lock(mutex_);
  wake_.wait_for(lock, absl::ToChronoNanoseconds(d), [this] { return stopping_; });
  return !stopping_;
}

uint64_t Agent::Nudges() {
  std::lock_guard<std::mutex> lock(mutex_);
  return nudges_;
}

void Agent::Nudge() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++nudges_;
  }
  wake_.notify_all();
}

bool Agent::SleepUnlessNudged(absl::Duration d, uint64_t seen) {
  std::unique_lock<std::mutex> lock(mutex_);
  wake_.wait_for(lock, absl::ToChronoNanoseconds(d),
                 [this, seen] { return stopping_ || nudges_ != seen; });
  return !stopping_;
}

void Agent::Run() {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  // A node's desired set carries each instance's SSH keys (up to 64 of up
  // to 4 KiB per tenant), mounts and ports: with eight tenants on a node it
  // can pass gRPC's default 4 MiB, and a set the agent cannot read ends the
  // stream at every reconnect.
  args.SetMaxReceiveMessageSize(kDesiredSetBytesMax);
  // The channel's own reconnect backoff must not outlast ours.
  const int backoff_min_ms =
      static_cast<int>(absl::ToInt64Milliseconds(options_.reconnect_backoff_min));
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, backoff_min_ms);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, backoff_min_ms);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS,
              static_cast<int>(absl::ToInt64Milliseconds(options_.reconnect_backoff_max)));
  grpc::SslCredentialsOptions tls;
  tls.pem_root_certs = options_.ca_pem;
  tls.pem_cert_chain = options_.client_cert_pem;
  tls.pem_private_key = options_.client_key_pem;
  auto channel = grpc::CreateCustomChannel(
      options_.endpoint,
      options_.ca_pem.empty() ? grpc::InsecureChannelCredentials() : grpc::SslCredentials(tls),
      args);
  auto stub = v1::AgentService::NewStub(channel);
  auto telemetry_stub = v1::SlaTelemetryService::NewStub(channel);
  std::mt19937 random(std::random_device{}());
  absl::Duration backoff = options_.reconnect_backoff_min;
  while (Sleep(absl::ZeroDuration())) {
    bool registered = false;
    const bool connected = channel->WaitForConnected(
        std::chrono::system_clock::now() +
        absl::ToChronoNanoseconds(options_.rpc_connect_timeout));
    Session session(*this);
    if (connected && session.Run(*stub, *telemetry_stub, &registered)) return;  // Scripted death.
    if (registered) {
      ++sessions_;
      backoff = options_.reconnect_backoff_min;
    }
    // Full jitter, so a fleet that lost svd does not reconnect in lockstep.
    std::uniform_real_distribution<double> jitter(0.5, 1.0);
    if (!Sleep(backoff * jitter(random))) return;
    backoff = std::min(backoff * 2, options_.reconnect_backoff_max);
  }
}

}  // namespace sv::agent
