// svctl stop, start, events and idle-policy.
#include <iostream>
#include <memory>

#include "CLI/CLI.hpp"
#include "absl/time/time.h"
#include "cli/commands.h"
#include "google/protobuf/util/time_util.h"
#include "sv/v1/instance.grpc.pb.h"

namespace sv::cli {
namespace {

constexpr int kEventsPagesMax = 100;  // 100 pages of 1,000 events.

int RunStop(Session& s, const std::string& id_or_name) {
  std::string error;
  if (!s.Connect(&error)) return Fail(error);
  std::string id;
  if (int rc = ResolveInstance(s, id_or_name, &id); rc != kExitOk) return rc;
  v1::InstanceService::Stub stub(s.channel);
  v1::StopInstanceRequest request;
  request.set_id(id);
  v1::Instance instance;
  grpc::Status status = stub.StopInstance(s.Context().get(), request, &instance);
  if (!status.ok()) return FailRpc(status, s);
  ShowInstance(instance, s.format());
  return kExitOk;
}

int RunStart(Session& s, const std::string& id_or_name) {
  std::string error;
  if (!s.Connect(&error)) return Fail(error);
  std::string id;
  if (int rc = ResolveInstance(s, id_or_name, &id); rc != kExitOk) return rc;
  v1::InstanceService::Stub stub(s.channel);
  v1::StartInstanceRequest request;
  request.set_id(id);
  v1::Instance instance;
  grpc::Status status = stub.StartInstance(s.Context().get(), request, &instance);
  if (!status.ok()) return FailRpc(status, s);
  ShowInstance(instance, s.format());
  return kExitOk;
}

int RunEvents(Session& s, const std::string& id_or_name) {
  std::string error;
  if (!s.Connect(&error)) return Fail(error);
  std::string id;
  if (int rc = ResolveInstance(s, id_or_name, &id); rc != kExitOk) return rc;
  v1::InstanceService::Stub stub(s.channel);
  v1::ListInstanceEventsResponse all;
  v1::ListInstanceEventsRequest request;
  request.set_id(id);
  request.set_page_size(1000);
  for (int page = 0; page < kEventsPagesMax; ++page) {
    v1::ListInstanceEventsResponse response;
    grpc::Status status = stub.ListInstanceEvents(s.Context().get(), request, &response);
    if (!status.ok()) return FailRpc(status, s);
    for (const auto& e : response.events()) *all.add_events() = e;
    if (response.next_page_token().empty()) break;
    request.set_page_token(response.next_page_token());
  }
  if (s.format() == Format::kJson) {
    PrintJson(all, std::cout);
    return kExitOk;
  }
  std::vector<std::vector<std::string>> rows = {{"TIME", "FROM", "TO", "REASON"}};
  for (const auto& e : all.events()) {
    // Milliseconds matter here: billing charges the exact RUNNING intervals.
    rows.push_back({FormatTime(e.event_time(), TimePrecision::kMilliseconds),
                    e.from_state() == v1::INSTANCE_STATE_UNSPECIFIED ? "-"
                                                                     : StateName(e.from_state()),
                    StateName(e.to_state()), e.reason()});
  }
  PrintTable(rows, std::cout);
  return kExitOk;
}

struct IdleArgs {
  std::string id;
  int minutes = -1;
  int seconds = -1;
  int below_pct = 5;
};

int RunIdlePolicy(Session& s, const IdleArgs& a) {
  if (a.minutes < 0 && a.seconds < 0) return Fail("give --after-minutes or --after-seconds");
  std::string error;
  if (!s.Connect(&error)) return Fail(error);
  std::string id;
  if (int rc = ResolveInstance(s, a.id, &id); rc != kExitOk) return rc;
  v1::InstanceService::Stub stub(s.channel);
  v1::SetIdlePolicyRequest request;
  request.set_id(id);
  request.set_idle_seconds(a.seconds >= 0 ? a.seconds : a.minutes * 60);
  request.set_utilization_pct(a.below_pct);
  v1::Instance instance;
  grpc::Status status = stub.SetIdlePolicy(s.Context().get(), request, &instance);
  if (!status.ok()) return FailRpc(status, s);
  ShowInstance(instance, s.format());
  return kExitOk;
}

}  // namespace

void AddLifecycleCommands(CLI::App& app, Action* action) {
  auto stop_id = std::make_shared<std::string>();
  auto* stop = app.add_subcommand("stop", "Stop an instance: release its GPUs, keep it");
  stop->add_option("id", *stop_id, "Instance id or name")->required();
  stop->callback([=] { *action = [=](Session& s) { return RunStop(s, *stop_id); }; });

  auto start_id = std::make_shared<std::string>();
  auto* start = app.add_subcommand("start", "Queue a stopped instance again");
  start->add_option("id", *start_id, "Instance id or name")->required();
  start->callback([=] { *action = [=](Session& s) { return RunStart(s, *start_id); }; });

  auto events_id = std::make_shared<std::string>();
  auto* events = app.add_subcommand("events", "State history of an instance, with reasons");
  events->add_option("id", *events_id, "Instance id or name")->required();
  events->callback([=] { *action = [=](Session& s) { return RunEvents(s, *events_id); }; });

  auto idle = std::make_shared<IdleArgs>();
  auto* policy = app.add_subcommand(
      "idle-policy", "Auto-stop an instance after a while with low GPU utilization");
  policy->add_option("id", idle->id, "Instance id or name")->required();
  auto* minutes = policy->add_option("--after-minutes", idle->minutes,
                                     "Stop after this many minutes idle (0 removes the policy)")
                     ->check(CLI::Range(0, 10080));
  policy->add_option("--below-pct", idle->below_pct,
                     "Idle means average GPU utilization below this percentage")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  policy->add_option("--after-seconds", idle->seconds, "Like --after-minutes, in seconds")
      ->check(CLI::Range(0, 604800))
      ->excludes(minutes);
  policy->callback([=] {
    *action = [=](Session& s) { return RunIdlePolicy(s, *idle); };
  });
}

}  // namespace sv::cli
