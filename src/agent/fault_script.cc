#include "agent/fault_script.h"

#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "agent/telemetry.h"
#include "common/status.h"

namespace sv::agent {
namespace {

const std::map<std::string, FaultKind>& Kinds() {
  static const auto* kinds = new std::map<std::string, FaultKind>{
      {"die", FaultKind::kDie},
      {"heartbeat-loss", FaultKind::kHeartbeatLoss},
      {"xid", FaultKind::kXid},
      {"thermal-throttle", FaultKind::kThermalThrottle},
      {"power-throttle", FaultKind::kPowerThrottle},
      {"slow-storage", FaultKind::kSlowStorage},
      {"latency-spike", FaultKind::kLatencySpike},
      {"telemetry-loss", FaultKind::kTelemetryLoss},
      {"gpu-idle", FaultKind::kGpuIdle}};
  return *kinds;
}

absl::Status Bad(int line, const std::string& why) {
  return Error(absl::StatusCode::kInvalidArgument, "FAULT_SCRIPT_INVALID",
               absl::StrCat("fault script line ", line, ": ", why));
}

absl::Status ApplyOption(int line, const std::string& key, const std::string& value,
                         Fault& f) {
  if (key == "for") {
    if (!absl::ParseDuration(value, &f.duration) || f.duration <= absl::ZeroDuration()) {
      return Bad(line, "for= needs a positive duration such as 30s");
    }
    return absl::OkStatus();
  }
  int64_t number = 0;
  if (!absl::SimpleAtoi(value, &number) || number < 0) {
    return Bad(line, absl::StrCat(key, "= needs a non-negative integer"));
  }
  if (key == "gpu") {
    if (number > 7) return Bad(line, "gpu= must be 0..7");
    f.gpu = static_cast<int>(number);
  } else if (key == "count" || key == "bytes_per_s" || key == "us") {
    f.value = number;
  } else {
    return Bad(line, absl::StrCat("unknown option '", key, "'"));
  }
  return absl::OkStatus();
}

bool Active(const Fault& f, absl::Duration now) {
  return now >= f.at && (f.duration == absl::InfiniteDuration() || now < f.at + f.duration);
}

}  // namespace

absl::StatusOr<std::vector<Fault>> ParseFaultScript(const std::string& text) {
  std::vector<Fault> faults;
  int line_number = 0;
  for (absl::string_view raw : absl::StrSplit(text, '\n')) {
    ++line_number;
    if (line_number > kFaultLinesMax) return Bad(line_number, "too many lines");
    raw = raw.substr(0, raw.find('#'));
    std::vector<std::string> words = absl::StrSplit(raw, absl::ByAnyChar(" \t\r"),
                                                    absl::SkipEmpty());
    if (words.empty()) continue;
    if (words.size() < 3) return Bad(line_number, "expected '<at> <node|*> <kind> [k=v...]'");
    Fault f;
    if (!absl::ParseDuration(words[0], &f.at) || f.at < absl::ZeroDuration()) {
      return Bad(line_number, absl::StrCat("bad time '", words[0], "' (use e.g. 30s)"));
    }
    f.node = words[1];
    auto kind = Kinds().find(words[2]);
    if (kind == Kinds().end()) {
      return Bad(line_number, absl::StrCat("unknown fault '", words[2], "'"));
    }
    f.kind = kind->second;
    if (f.kind == FaultKind::kXid) f.value = 1;
    for (size_t i = 3; i < words.size(); ++i) {
      std::pair<std::string, std::string> kv = absl::StrSplit(words[i], absl::MaxSplits('=', 1));
      SV_RETURN_IF_ERROR(ApplyOption(line_number, kv.first, kv.second, f));
    }
    if (f.kind == FaultKind::kSlowStorage && f.value <= 0) {
      return Bad(line_number, "slow-storage needs bytes_per_s=N");
    }
    if (f.kind == FaultKind::kLatencySpike && f.value <= 0) {
      return Bad(line_number, "latency-spike needs us=N");
    }
    faults.push_back(f);
  }
  return faults;
}

absl::StatusOr<std::vector<Fault>> ReadFaultScript(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return Error(absl::StatusCode::kNotFound, "FAULT_SCRIPT_MISSING",
                 absl::StrCat("cannot read fault script ", path));
  }
  std::stringstream text;
  text << in.rdbuf();
  return ParseFaultScript(text.str());
}

FaultState FaultsAt(const std::vector<Fault>& faults, const std::string& node, int gpu_count,
                    absl::Duration previous, absl::Duration now) {
  FaultState state;
  state.throttle_reasons.assign(gpu_count, 0);
  state.xid_errors.assign(gpu_count, 0);
  state.gpu_idle.assign(gpu_count, false);
  for (const Fault& f : faults) {
    if (f.node != "*" && f.node != node) continue;
    auto for_gpus = [&](auto apply) {
      for (int g = 0; g < gpu_count; ++g) {
        if (f.gpu < 0 || f.gpu == g) apply(g);
      }
    };
    switch (f.kind) {
      case FaultKind::kDie:
        state.dead = state.dead || now >= f.at;
        break;
      case FaultKind::kHeartbeatLoss:
        state.heartbeats_lost = state.heartbeats_lost || Active(f, now);
        break;
      case FaultKind::kXid:
        if (f.at > previous && f.at <= now) {
          for_gpus([&](int g) { state.xid_errors[g] += static_cast<int>(f.value); });
        }
        break;
      case FaultKind::kThermalThrottle:
        if (Active(f, now)) for_gpus([&](int g) { state.throttle_reasons[g] |= kThrottleHwThermal; });
        break;
      case FaultKind::kPowerThrottle:
        if (Active(f, now)) for_gpus([&](int g) { state.throttle_reasons[g] |= kThrottleSwPowerCap; });
        break;
      case FaultKind::kSlowStorage:
        if (Active(f, now)) state.storage_bytes_per_s = f.value;
        break;
      case FaultKind::kLatencySpike:
        if (Active(f, now)) state.latency_spike_us = std::max(state.latency_spike_us, f.value);
        break;
      case FaultKind::kTelemetryLoss:
        state.telemetry_lost = state.telemetry_lost || Active(f, now);
        break;
      case FaultKind::kGpuIdle:
        if (Active(f, now)) for_gpus([&](int g) { state.gpu_idle[g] = true; });
        break;
    }
  }
  return state;
}

}  // namespace sv::agent
