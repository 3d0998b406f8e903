// svd's side of the node-agent protocol; see docs/agent.md.
#include "api/agent_service.h"

#include <chrono>
#include <condition_variable>
#include <map>
#include <random>
#include <mutex>
#include <set>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "api/auth.h"
#include "api/errors.h"
#include "api/internal/agent_messages.h"
#include "api/internal/agent_resources.h"
#include "common/ids.h"
#include "common/status.h"
#include "google/protobuf/util/time_util.h"
#include "metrics/metrics.h"
#include "spdlog/spdlog.h"
#include "store/agent_store.h"
#include "store/notification_listener.h"
#include "sv/v1/agent.grpc.pb.h"

namespace sv::api {
namespace {

using AgentStream = grpc::ServerReaderWriter<v1::ServerMessage, v1::AgentMessage>;

// Limits on what one agent message may carry (api/internal/agent_messages.h).
constexpr size_t kLabelLengthMax = internal::kAgentLabelLengthMax;
constexpr int kCredentialIdLength = internal::kNodeCredentialIdLength;
constexpr int kCredentialSecretLength = internal::kNodeCredentialSecretLength;
using internal::ParseNodeCredential;
using internal::ValidateRegistration;

bool SameDesired(const std::vector<store::AgentAssignment>& a,
                 const std::vector<store::AgentAssignment>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    // A change of `starting` is sent too: a stop and start between two
    // polls must reach the agent, whose answer then confirms the start.
    if (a[i].instance_id != b[i].instance_id || a[i].gpu_indices != b[i].gpu_indices ||
        a[i].starting != b[i].starting || a[i].run != b[i].run ||
        !internal::SameAssignmentResources(a[i], b[i])) {
      return false;
    }
  }
  return true;
}

}  // namespace

struct AgentApi::Impl {
  Impl(store::Store& s, const Clock& c, control::ControlLoops* l, AgentApiOptions o)
      : store(s), agents(s.database()), clock(c), loops(l), options(o), auth(s, c, o.auth),
        revocations(*this) {
    agents.SetConfirmBatchLanes(o.confirm_batch_lanes);
    agents.SetDesiredBatchLanes(o.desired_batch_lanes);
  }

  // The revocation signal (migration 0070): a revoked node credential ends
  // its agent streams on this replica too.
  class RevocationSink final : public store::NotificationSink {
   public:
    explicit RevocationSink(Impl& impl) : impl_(impl) {}
    void OnNotification(const std::string& payload) override {
      if (absl::StartsWith(payload, "node:")) impl_.EndStreamsOf(payload.substr(5));
    }
    // Signals sent while nobody listened are lost: the monitor re-reads the
    // credentials of the open streams (svd's start counts as well).
    void OnListening() override { impl_.recheck_streams = true; }

   private:
    Impl& impl_;
  };

  // The desired-set signal (migration 0094): rings the bells of the agent
  // streams of the nodes it names. While the LISTEN connection is down the
  // streams poll (AgentApiOptions::desired_poll_interval); when it is lost
  // or comes back, every stream reads its set again, since signals sent in
  // between are lost.
  class DesiredSignal final : public store::NotificationSink {
   public:
    // One agent stream's: rung when its node's set may have changed.
    struct Bell {
      std::mutex mutex;
      std::condition_variable cv;
      bool rung = false;
      bool done = false;  // The stream ended.
    };

    void Add(const std::string& node_id, Bell* bell) {
      std::lock_guard<std::mutex> lock(mutex_);
      bells_.emplace(node_id, bell);
    }
    void Remove(const std::string& node_id, Bell* bell) {
      std::lock_guard<std::mutex> lock(mutex_);
      auto [first, last] = bells_.equal_range(node_id);
      for (auto it = first; it != last; ++it) {
        if (it->second == bell) {
          bells_.erase(it);
          return;
        }
      }
    }
    bool listening() const { return listening_.load(); }

    void OnNotification(const std::string& payload) override {
      std::lock_guard<std::mutex> lock(mutex_);
      auto [first, last] = bells_.equal_range(payload);
      for (auto it = first; it != last; ++it) Ring(*it->second);
    }
    void OnListening() override {
      listening_ = true;
      RingAll();
    }
    void OnLost() override {
      // Called again on every failed reconnect: ring once.
      if (listening_.exchange(false)) RingAll();
    }

   private:
    static void Ring(Bell& bell) {
      {
        std::lock_guard<std::mutex> lock(bell.mutex);
        bell.rung = true;
      }
      bell.cv.notify_all();
    }
    void RingAll() {
      std::lock_guard<std::mutex> lock(mutex_);
      for (auto& entry : bells_) Ring(*entry.second);
    }

    std::mutex mutex_;
    std::multimap<std::string, Bell*> bells_;  // Node id -> its streams' bells.
    std::atomic<bool> listening_{false};
  };

  // Numbers of the desired sets sent (DesiredInstances.set_number): the
  // last one per node, from a start random per process so that a number
  // of another svd process (a replica, or before a restart) never matches.
  uint64_t NumberSet(const std::string& node_id) {
    std::lock_guard<std::mutex> lock(set_numbers_mutex);
    const uint64_t number = ++next_set_number;
    last_set_sent[node_id] = number;
    return number;
  }
  bool IsLastSetSent(const std::string& node_id, uint64_t number) {
    std::lock_guard<std::mutex> lock(set_numbers_mutex);
    auto it = last_set_sent.find(node_id);
    return number != 0 && it != last_set_sent.end() && it->second == number;
  }

  store::Store& store;
  store::AgentStore agents;
  const Clock& clock;
  control::ControlLoops* loops;
  AgentApiOptions options;
  Authenticator auth;
  std::unique_ptr<grpc::Service> agent_service;
  std::unique_ptr<grpc::Service> admin_service;

  std::mutex mutex;
  std::condition_variable wake;
  bool stopping = false;
  std::map<grpc::ServerContext*, std::string> live;  // Stream -> its credential id.
  RevocationSink revocations;
  DesiredSignal desired_signal;
  std::atomic<bool> recheck_streams{false};
  std::mutex set_numbers_mutex;
  uint64_t next_set_number = uint64_t{std::random_device{}()} << 32;
  std::map<std::string, uint64_t> last_set_sent;  // Node id -> last set number.
  std::thread monitor;

  void Kick() {
    if (loops != nullptr) loops->Kick();
  }

  bool Sleep(absl::Duration d) {
    std::unique_lock<std::mutex> lock(mutex);
    wake.wait_for(lock, absl::ToChronoNanoseconds(d), [this] { return stopping; });
    return !stopping;
  }

  // Cancels the open agent streams of a credential; returns how many.
  int EndStreamsOf(const std::string& credential_id) {
    std::lock_guard<std::mutex> lock(mutex);
    int ended = 0;
    for (const auto& [context, id] : live) {
      if (id != credential_id) continue;
      context->TryCancel();
      ++ended;
    }
    if (ended > 0) {
      spdlog::warn("agent: ended {} stream(s) of revoked node credential {}", ended,
                   credential_id);
    }
    return ended;
  }

  // Ends the open streams whose credential is revoked; false on a
  // database error (try again later).
  bool EndRevokedStreams() {
    std::vector<std::string> ids;
    {
      std::lock_guard<std::mutex> lock(mutex);
      for (const auto& entry : live) ids.push_back(entry.second);
    }
    if (ids.empty()) return true;
    auto revoked = agents.RevokedNodeCredentials(ids);
    if (!revoked.ok()) return false;
    for (const auto& id : *revoked) EndStreamsOf(id);
    return true;
  }

  void MonitorLoop();
  // Reads and checks the stream's node credential. The stream is entered in
  // `live` under the credential's id before the credential is read, and
  // taken out if it is refused: a revocation committed after the read finds
  // it (EndStreamsOf). Entered only after the read, a stream that had
  // passed it and then waited (to register, or for the entry) outlived a
  // revocation in that gap and then ran on, heartbeating and reporting for
  // the node, until its client closed it.
  absl::StatusOr<store::NodeCredentialRecord> AuthenticateNode(grpc::ServerContext& context);
  absl::StatusOr<store::NodeCredentialRecord> CheckNodeCredential(const std::string& id,
                                                                  const std::string& secret);
};

namespace {

// One agent's stream. The handler thread reads; a poller thread sends the
// desired instance set whenever it changes.
class AgentSession {
 public:
  AgentSession(AgentApi::Impl& api, grpc::ServerContext& context, AgentStream& stream,
               std::string node_name)
      : api_(api), context_(context), stream_(stream), node_name_(std::move(node_name)) {}

  grpc::Status Run(const v1::RegisterNode& registration) {
    store::NodeRecord node;
    node.name = registration.node_name();
    node.zone = registration.zone();
    node.pod = registration.pod();
    node.leaf_switch = registration.leaf_switch();
    node.gpu_model = registration.gpu_model();
    node.gpu_count = registration.gpu_count();
    node.simulated = registration.driver() == "simulated";
    node.fences_mounts = registration.reports_complete_lists();
    node.connection_id = connection_id_;
    numbers_sets_ = registration.reports_complete_lists();
    auto node_id = api_.agents.RegisterNode(node, api_.clock.Now());
    if (!node_id.ok()) return ToGrpcStatus(node_id.status());
    node_id_ = *node_id;
    absl::Status network =
        internal::RecordNodeNetwork(api_.store.database(), node_id_, registration, context_.peer());
    if (!network.ok()) return ToGrpcStatus(network);
    // An agent that reports its mounts on each connection is asked, not
    // assumed: a volume an earlier connection sent may still be mounted.
    if (registration.reports_mounts_on_connect()) {
      absl::Status earlier = internal::RememberEarlierMounts(api_.store.database(), node_id_,
                                                             ever_sent_mounts_);
      if (!earlier.ok()) return ToGrpcStatus(earlier);
    }
    spdlog::info("agent: node {} ({}) registered, driver={} running={}", node_name_, node_id_,
                 registration.driver(), registration.running_instance_ids_size());
    v1::ServerMessage registered;
    registered.mutable_registered()->set_node_id(node_id_);
    registered.mutable_registered()->set_heartbeat_interval_ms(
        static_cast<int>(absl::ToInt64Milliseconds(api_.options.heartbeat_interval)));
    registered.mutable_registered()->set_telemetry_interval_ms(
        static_cast<int>(absl::ToInt64Milliseconds(api_.options.telemetry_interval)));
    registered.mutable_registered()->set_accepts_report_batches(true);
    if (!Write(registered)) return grpc::Status::OK;
    // What runs, as the agent found it before any set of this connection:
    // an agent that numbers its sets confirms through them instead (its
    // first set's pass reports STARTED for what runs unconfirmed), since
    // this list may hold an old run's process of an instance started again.
    if (!numbers_sets_) ConfirmRunning(registration.running_instance_ids());
    api_.desired_signal.Add(node_id_, &bell_);
    std::thread poller([this] { PollDesired(); });
    v1::AgentMessage message;
    while (stream_.Read(&message)) Handle(message);
    {
      std::lock_guard<std::mutex> lock(bell_.mutex);
      bell_.done = true;
    }
    bell_.cv.notify_all();
    poller.join();
    api_.desired_signal.Remove(node_id_, &bell_);
    spdlog::info("agent: node {} disconnected", node_name_);
    if (node_down_) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          "the node was declared down; register again");
    }
    return grpc::Status::OK;
  }

 private:
  bool Write(const v1::ServerMessage& m) {
    std::lock_guard<std::mutex> lock(write_mutex_);
    return stream_.Write(m);
  }

  void SendError(const absl::Status& status) {
    spdlog::warn("agent: node {} sent a bad message: {}", node_name_, status.ToString());
    v1::ServerMessage m;
    m.mutable_error()->set_reason(sv::ReasonOf(status));
    m.mutable_error()->set_message(std::string(status.message()));
    Write(m);
  }

  // Instances the agent says run: confirmations of starts svd asked for, in
  // one transaction. One that svd no longer wants is left to the desired set
  // to stop.
  void ConfirmRunning(const google::protobuf::RepeatedPtrField<std::string>& ids) {
    if (ids.empty()) return;
    std::vector<std::string> list(ids.begin(), ids.end());
    auto results = api_.agents.ConfirmStartedMany(node_id_, list, api_.clock.Now());
    if (!results.ok()) {
      spdlog::warn("agent: node {}: confirming {} running instances: {}", node_name_,
                   list.size(), results.status().ToString());
      return;
    }
    for (size_t i = 0; i < list.size(); ++i) {
      const absl::Status& status = (*results)[i].status();
      const std::string reason = sv::ReasonOf(status);
      if (!status.ok() && reason != "UNKNOWN_INSTANCE" && reason != "STALE_REPORT") {
        spdlog::warn("agent: node {}: confirming {}: {}", node_name_, list[i],
                     status.ToString());
      }
    }
  }

  // Reads the node's desired set and sends it when it changed: when the
  // signal rings (at once, or desired_poll_interval after the last read if
  // that was sooner), and otherwise every desired_poll_interval while the
  // signal is down, or every desired_backstop_interval while it is up (a
  // change some path did not signal is late, not lost).
  void PollDesired() {
    std::optional<std::vector<store::AgentAssignment>> sent;
    const char* cause = "start";
    std::chrono::steady_clock::time_point last_read;
    while (true) {
      {
        // Cleared before the read: a change committed after the read's
        // snapshot rings again.
        std::lock_guard<std::mutex> lock(bell_.mutex);
        bell_.rung = false;
      }
      last_read = std::chrono::steady_clock::now();
      metrics::Registry::Default().IncrementCounter(
          "sv_agent_desired_reads_total",
          "Reads of a node's desired instance set, by what prompted them.", {{"cause", cause}});
      auto desired = api_.agents.DesiredForNode(node_id_, api_.clock.Now());
      if (!desired.ok() && sv::ReasonOf(desired.status()) == "NODE_DOWN") {
        node_down_ = true;
        context_.TryCancel();  // The agent reconnects and registers again.
        return;
      }
      if (desired.ok() && (!sent || !SameDesired(*sent, *desired))) {
        v1::ServerMessage m;
        auto* set = m.mutable_desired();  // An empty set is a message too.
        for (const auto& a : *desired) {
          auto* out = set->add_instances();
          out->set_instance_id(a.instance_id);
          out->set_image(a.image);
          out->set_run(a.run);
          out->set_confirmed(!a.starting);
          for (int g : a.gpu_indices) out->add_gpu_indices(g);
          internal::AddAssignmentResources(a, out);
        }
        set->set_set_number(api_.NumberSet(node_id_));
        if (!Write(m)) return;
        sent = *std::move(desired);
        internal::RememberSentMounts(*sent, ever_sent_mounts_);
      }
      // Detaches of volumes this agent was never sent complete here: it
      // cannot have mounted them, and no report of it will come.
      if (sent) {
        absl::Status settled = internal::SettleUnsentDetaches(
            api_.store.database(), node_id_, ever_sent_mounts_, api_.clock.Now());
        if (!settled.ok()) {
          spdlog::warn("agent: node {}: settling detaches: {}", node_name_, settled.ToString());
        }
      }
      std::unique_lock<std::mutex> lock(bell_.mutex);
      const bool signalled = api_.desired_signal.listening();
      const absl::Duration wait = signalled ? api_.options.desired_backstop_interval
                                            : api_.options.desired_poll_interval;
      const bool woken = bell_.cv.wait_for(lock, absl::ToChronoNanoseconds(wait),
                                           [this] { return bell_.done || bell_.rung; });
      if (bell_.done) return;
      cause = woken ? "signal" : signalled ? "backstop" : "poll";
      if (woken) {
        // No stream reads more often than it used to poll: a node whose
        // set churns (placements and deletes many times a second) is read
        // once per interval with every change so far, not once per change.
        bell_.cv.wait_until(lock, last_read + absl::ToChronoNanoseconds(
                                                  api_.options.desired_poll_interval),
                            [this] { return bell_.done; });
        if (bell_.done) return;
      }
    }
  }

  void Handle(const v1::AgentMessage& m) {
    const absl::Time now = api_.clock.Now();
    // Bounds, a report's state, and bodies that do not belong here.
    absl::Status checked = internal::CheckStreamMessage(m);
    if (!checked.ok()) return SendError(checked);
    switch (m.body_case()) {
      case v1::AgentMessage::kHeartbeat: {
        // Complete lists end the fences of this node on the volumes of
        // the instances in neither (docs/storage.md, "Fences").
        // Only lists that reflect the last set sent: one in flight may name
        // an instance they do not, which the agent is about to start.
        std::optional<std::vector<std::string>> listed;
        const bool of_last_set =
            api_.IsLastSetSent(node_id_, m.heartbeat().applied_set_number());
        if (m.heartbeat().lists_complete() && of_last_set) {
          listed.emplace(m.heartbeat().running_instance_ids().begin(),
                         m.heartbeat().running_instance_ids().end());
          listed->insert(listed->end(), m.heartbeat().desired_instance_ids().begin(),
                         m.heartbeat().desired_instance_ids().end());
        }
        auto alive = api_.agents.Heartbeat(
            node_id_, now, listed, connection_id_,
            numbers_sets_ ? std::optional<bool>(m.heartbeat().lists_complete()) : std::nullopt);
        if (alive.ok() && !*alive) {
          node_down_ = true;
          context_.TryCancel();
          return;
        }
        // The same for what it confirms: a heartbeat composed before the
        // agent took in a set that started an instance again (a stop and a
        // start on this node) lists the old run's process, which confirmed
        // the new run before it was started. Agents that number their sets
        // are believed only of the last set; others as before.
        if (of_last_set || !numbers_sets_) ConfirmRunning(m.heartbeat().running_instance_ids());
        return;
      }
      case v1::AgentMessage::kReport:
        return HandleReport(m.report(), now);
      case v1::AgentMessage::kReports:
        return HandleReports(m.reports(), now);
      case v1::AgentMessage::kMounts: {
        absl::Status confirmed =
            internal::HandleMountReport(api_.store.database(), node_id_, m.mounts(), now);
        if (!confirmed.ok() && sv::ReasonOf(confirmed) != "UNKNOWN_INSTANCE") {
          SendError(confirmed);
        }
        return;
      }
      default:
        return;  // CheckStreamMessage answered every other body.
    }
  }

  // The reports of one pass of the agent, in order. A run of starts is
  // confirmed in one transaction; the others go one by one, as alone.
  void HandleReports(const v1::InstanceReports& batch, absl::Time now) {
    std::vector<std::string> started;
    auto confirm = [&] {
      if (started.empty()) return;
      auto results = api_.agents.ConfirmStartedMany(node_id_, started, now);
      if (!results.ok()) {
        AnswerReport(results.status());
      } else {
        for (const auto& result : *results) AnswerReport(result.status());
      }
      started.clear();
    };
    for (const v1::InstanceReport& r : batch.reports()) {
      if (r.state() == v1::AGENT_STARTED) {
        started.push_back(r.instance_id());
        continue;
      }
      confirm();
      HandleReport(r, now);
    }
    confirm();
  }

  void HandleReport(const v1::InstanceReport& r, absl::Time now) {
    absl::Status status;
    switch (r.state()) {
      case v1::AGENT_STARTED:
        status = api_.agents.ConfirmStarted(node_id_, r.instance_id(), now).status();
        break;
      case v1::AGENT_EXITED:
        status = api_.agents.ReportEnded(
            node_id_, r.instance_id(), r.exit_code() != 0,
            absl::StrCat("exited on node ", node_name_, " with code ", r.exit_code(), ": ",
                         r.reason().substr(0, 200)),
            now, r.run());
        api_.Kick();
        break;
      case v1::AGENT_START_FAILED:
        status = api_.agents.ReportEnded(
            node_id_, r.instance_id(), true,
            absl::StrCat("failed to start on node ", node_name_, ": ",
                         r.reason().substr(0, 200)),
            now, r.run());
        api_.Kick();
        break;
      case v1::AGENT_STOPPED:
        return;  // svd asked for it; the state already moved on.
      default:
        status = Error(absl::StatusCode::kInvalidArgument, "INVALID_REPORT",
                       "a report needs a state");
    }
    AnswerReport(status);
  }

  void AnswerReport(const absl::Status& status) {
    if (sv::ReasonOf(status) == "STALE_REPORT") {
      // The instance changed after the agent reported (deleted while it
      // started, say): not the agent's fault, and the next desired set
      // tells it what to run.
      spdlog::debug("agent: node {}: {}", node_name_, status.ToString());
      return;
    }
    if (!status.ok()) SendError(status);
  }

  AgentApi::Impl& api_;
  grpc::ServerContext& context_;
  AgentStream& stream_;
  const std::string node_name_;
  std::string node_id_;
  // Written by the registration: only the node's latest connection ends
  // fences (a heartbeat left queued on one the agent has moved on from
  // may predate a set another replica sent since).
  const std::string connection_id_ = NewId("conn", 22);
  // The agent echoes set numbers in its heartbeats (it says it reports
  // complete lists, which came with them).
  bool numbers_sets_ = false;
  std::set<std::pair<std::string, std::string>> ever_sent_mounts_;  // (instance, volume)
  std::mutex write_mutex_;
  AgentApi::Impl::DesiredSignal::Bell bell_;
  std::atomic<bool> node_down_{false};
};

class AgentServiceImpl final : public v1::AgentService::Service {
 public:
  explicit AgentServiceImpl(AgentApi::Impl& api) : api_(api) {}

  grpc::Status Connect(grpc::ServerContext* context, AgentStream* stream) override {
    auto credential = api_.AuthenticateNode(*context);
    if (!credential.ok()) {
      spdlog::warn("agent: rejected a connection from {}: {}", context->peer(),
                   credential.status().ToString());
      return ToGrpcStatus(credential.status());
    }
    // In `live` from here on (AuthenticateNode), so a revocation ends it.
    absl::Cleanup untrack = [&] { Untrack(context); };
    v1::AgentMessage first;
    if (!stream->Read(&first)) return grpc::Status::OK;
    absl::Status status;
    if (!first.has_register_()) {
      status = Error(absl::StatusCode::kFailedPrecondition, "REGISTER_FIRST",
                     "the first message of a stream must be register");
    } else if (first.register_().node_name() != credential->node_name) {
      status = Error(absl::StatusCode::kPermissionDenied, "NODE_NAME_MISMATCH",
                     absl::StrCat("this credential is for node ", credential->node_name,
                                  ", not ", first.register_().node_name().substr(0, 64)));
    } else {
      status = ValidateRegistration(first.register_());
    }
    if (!status.ok()) {
      spdlog::warn("agent: rejected registration from {}: {}", context->peer(),
                   status.ToString());
      return ToGrpcStatus(status);
    }
    AgentSession session(api_, *context, *stream, credential->node_name);
    return session.Run(first.register_());
  }

 private:
  void Untrack(grpc::ServerContext* context) {
    std::lock_guard<std::mutex> lock(api_.mutex);
    api_.live.erase(context);
  }

  AgentApi::Impl& api_;
};

class NodeCredentialServiceImpl final : public v1::NodeCredentialService::Service {
 public:
  explicit NodeCredentialServiceImpl(AgentApi& api, AgentApi::Impl& impl) : api_(api), impl_(impl) {}

  grpc::Status CreateNodeCredential(grpc::ServerContext* context,
                                    const v1::CreateNodeCredentialRequest* request,
                                    v1::CreateNodeCredentialResponse* response) override {
    auto who = impl_.auth.Authenticate(*context);
    if (!who.ok()) return ToGrpcStatus(who.status());
    if (who->role != store::Role::kOperator) {
      return ToGrpcStatus(Error(absl::StatusCode::kPermissionDenied, "OPERATOR_ONLY",
                                "only an operator may create node credentials"));
    }
    if (request->node_name().empty() || request->node_name().size() > kLabelLengthMax) {
      return ToGrpcStatus(Error(absl::StatusCode::kInvalidArgument, "INVALID_NODE_NAME",
                                "node_name must have 1 to 63 characters"));
    }
    auto credential = api_.CreateNodeCredential(request->node_name());
    if (!credential.ok()) return ToGrpcStatus(credential.status());
    response->set_node_name(request->node_name());
    response->set_credential_id("ncr-" + credential->substr(4, kCredentialIdLength));
    response->set_credential(*credential);
    spdlog::info("api: operator {} created a credential for node {}", who->user_email,
                 request->node_name());
    return grpc::Status::OK;
  }

  grpc::Status RevokeNodeCredential(grpc::ServerContext* context,
                                    const v1::RevokeNodeCredentialRequest* request,
                                    v1::RevokeNodeCredentialResponse* response) override {
    auto who = impl_.auth.Authenticate(*context);
    if (!who.ok()) return ToGrpcStatus(who.status());
    const std::string& id = request->credential_id();
    if (!absl::StartsWith(id, "ncr-") || id.size() > 4 + kCredentialIdLength) {
      return ToGrpcStatus(Error(absl::StatusCode::kInvalidArgument, "INVALID_CREDENTIAL_ID",
                                "credential_id must be the ncr-... id of a node credential"));
    }
    auto revoked = impl_.agents.RevokeNodeCredential(id, impl_.clock.Now());
    if (!revoked.ok()) return ToGrpcStatus(revoked.status());
    // Streams on this replica end now; other replicas end theirs when the
    // revocation signal reaches them.
    const int ended = impl_.EndStreamsOf(id);
    response->set_credential_id(id);
    response->set_node_name(revoked->node_name);
    *response->mutable_revoke_time() = google::protobuf::util::TimeUtil::MicrosecondsToTimestamp(
        absl::ToUnixMicros(*revoked->revoked_at));
    spdlog::info("api: operator {} revoked node credential {} of node {} ({} stream(s) ended)",
                 who->user_email, id, revoked->node_name, ended);
    return grpc::Status::OK;
  }

 private:
  AgentApi& api_;
  AgentApi::Impl& impl_;
};

}  // namespace

absl::StatusOr<store::NodeCredentialRecord> AgentApi::Impl::AuthenticateNode(
    grpc::ServerContext& context) {
  auto header = context.client_metadata().find("authorization");
  if (header == context.client_metadata().end()) {
    return Error(absl::StatusCode::kUnauthenticated, "MISSING_CREDENTIALS",
                 "a node credential is required (authorization: Bearer svn_...)");
  }
  std::string value(header->second.data(), header->second.size());
  if (!absl::StartsWith(value, "Bearer ")) {
    return Error(absl::StatusCode::kUnauthenticated, "MALFORMED_CREDENTIALS",
                 "authorization must be 'Bearer <node credential>'");
  }
  auto parsed = ParseNodeCredential(value.substr(7));
  if (!parsed) {
    return Error(absl::StatusCode::kUnauthenticated, "MALFORMED_CREDENTIALS",
                 "not a node credential");
  }
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (stopping) return Error(absl::StatusCode::kUnavailable, "STOPPING", "svd is stopping");
    live[&context] = parsed->id;
  }
  auto checked = CheckNodeCredential(parsed->id, parsed->secret);
  if (!checked.ok()) {
    std::lock_guard<std::mutex> lock(mutex);
    live.erase(&context);
  }
  return checked;
}

absl::StatusOr<store::NodeCredentialRecord> AgentApi::Impl::CheckNodeCredential(
    const std::string& id, const std::string& secret) {
  SV_ASSIGN_OR_RETURN(auto record, agents.LookupNodeCredential(id));
  if (!ConstantTimeEquals(Sha256Hex(secret), record.secret_sha256)) {
    return Error(absl::StatusCode::kUnauthenticated, "NODE_CREDENTIAL_WRONG",
                 "the node credential is wrong");
  }
  if (record.revoked) {
    return Error(absl::StatusCode::kUnauthenticated, "NODE_CREDENTIAL_REVOKED",
                 "the node credential was revoked");
  }
  return record;
}

void AgentApi::Impl::MonitorLoop() {
  // Agents cannot heartbeat while no svd runs; after a start (or a restart
  // of the only svd) they get one timeout to reconnect before silence means
  // death, so an svd outage never takes the fleet down with it. Nor can
  // their heartbeats be written while the database is away, so they get one
  // timeout again whenever this replica's leadership begins (a term ends
  // when the database is away for a few seconds) and after a health check
  // that failed. Judged at once, a database outage longer than the timeout
  // (a Patroni failover takes 30 s and more) ended with every node whose
  // agent had not heartbeated in the second since marked down and its
  // instances stopped: the whole fleet.
  absl::Time judge_from = clock.Now() + options.heartbeat_timeout;
  bool leading = false;
  while (Sleep(options.monitor_interval)) {
    // Every replica, leader or not: its own streams.
    if (recheck_streams.exchange(false) && !EndRevokedStreams()) recheck_streams = true;
    // Node health is leader-only work, fenced with the leader's epoch.
    store::LeaderTurn turn(loops != nullptr ? loops->leader_gate() : nullptr);
    const bool began = turn.ok() && !leading;
    leading = turn.ok();
    if (!turn.ok()) continue;
    const absl::Time now = clock.Now();
    if (began) judge_from = std::max(judge_from, now + options.heartbeat_timeout);
    auto downed = now < judge_from
                      ? absl::StatusOr<std::vector<store::DownedNode>>(
                            std::vector<store::DownedNode>())
                      : agents.MarkSilentNodesDown(options.heartbeat_timeout, now);
    if (!downed.ok()) {
      spdlog::warn("agent: node health check failed: {}", downed.status().ToString());
      judge_from = std::max(judge_from, clock.Now() + options.heartbeat_timeout);
    } else {
      for (const auto& d : *downed) {
        spdlog::warn("agent: node {} is down (no heartbeat since {}); stopped {} instance(s)",
                     d.node_name, absl::FormatTime(d.last_heartbeat_at),
                     d.stopped_instance_ids.size());
      }
      if (!downed->empty()) Kick();
    }
    auto idle = agents.StopIdleInstances(now);
    if (!idle.ok()) {
      spdlog::warn("agent: idle check failed: {}", idle.status().ToString());
    } else {
      for (const auto& id : *idle) spdlog::info("agent: auto-stopped idle instance {}", id);
      if (!idle->empty()) Kick();
    }
  }
}

AgentApi::AgentApi(store::Store& store, const Clock& clock, control::ControlLoops* loops,
                   AgentApiOptions options)
    : impl_(std::make_unique<Impl>(store, clock, loops, options)) {
  impl_->agent_service = std::make_unique<AgentServiceImpl>(*impl_);
  impl_->admin_service = std::make_unique<NodeCredentialServiceImpl>(*this, *impl_);
}

AgentApi::~AgentApi() { Stop(); }

void AgentApi::RegisterWith(grpc::ServerBuilder& builder) {
  builder.RegisterService(impl_->agent_service.get());
  builder.RegisterService(impl_->admin_service.get());
}

void AgentApi::StartMonitor() {
  impl_->monitor = std::thread([this] { impl_->MonitorLoop(); });
}

void AgentApi::Stop() {
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->stopping = true;
    for (const auto& entry : impl_->live) entry.first->TryCancel();
  }
  impl_->wake.notify_all();
  if (impl_->monitor.joinable()) impl_->monitor.join();
}

store::NotificationSink* AgentApi::revocation_sink() { return &impl_->revocations; }

store::NotificationSink* AgentApi::desired_sink() { return &impl_->desired_signal; }

absl::StatusOr<std::string> AgentApi::AuthenticateNodeStream(grpc::ServerContext* context) {
  SV_ASSIGN_OR_RETURN(auto record, impl_->AuthenticateNode(*context));
  return record.node_name;  // Entered in `live`; EndNodeStream takes it out.
}

void AgentApi::EndNodeStream(grpc::ServerContext* context) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->live.erase(context);
}

absl::StatusOr<std::string> AgentApi::CreateNodeCredential(const std::string& node_name) {
  const std::string id_part = RandomToken(kCredentialIdLength);
  const std::string secret = RandomToken(kCredentialSecretLength);
  SV_RETURN_IF_ERROR(impl_->agents.CreateNodeCredential("ncr-" + id_part, node_name,
                                                        Sha256Hex(secret),
                                                        impl_->clock.Now()));
  return absl::StrCat("svn_", id_part, "_", secret);
}

}  // namespace sv::api
