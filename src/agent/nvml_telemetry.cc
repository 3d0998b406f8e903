// NVML telemetry, loaded at run time so that svagent runs (and says why it
// has no GPU data) on machines without the NVIDIA driver.
#include <dlfcn.h>

#include <map>

#include "absl/strings/str_cat.h"
#include "agent/telemetry.h"
#include "common/status.h"
#include "spdlog/spdlog.h"

namespace sv::agent {
namespace {

// The subset of the NVML C ABI we call, declared from its documentation.
using NvmlReturn = int;
using NvmlDevice = void*;
using NvmlEventSet = void*;
constexpr NvmlReturn kNvmlSuccess = 0;
constexpr NvmlReturn kNvmlNotSupported = 3;
constexpr unsigned long long kNvmlEventXidCritical = 0x8;
constexpr int kNvmlTemperatureGpu = 0;
constexpr int kNvmlEccUncorrected = 1;
constexpr int kNvmlEccVolatile = 0;

struct NvmlUtilization {
  unsigned int gpu;
  unsigned int memory;
};
struct NvmlMemory {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};
struct NvmlEventData {
  NvmlDevice device;
  unsigned long long event_type;
  unsigned long long event_data;
  unsigned int gpu_instance_id;
  unsigned int compute_instance_id;
};

struct NvmlApi {
  NvmlReturn (*init)();
  NvmlReturn (*shutdown)();
  const char* (*error_string)(NvmlReturn);
  NvmlReturn (*device_count)(unsigned int*);
  NvmlReturn (*handle_by_index)(unsigned int, NvmlDevice*);
  NvmlReturn (*utilization)(NvmlDevice, NvmlUtilization*);
  NvmlReturn (*memory)(NvmlDevice, NvmlMemory*);
  NvmlReturn (*temperature)(NvmlDevice, int, unsigned int*);
  NvmlReturn (*power)(NvmlDevice, unsigned int*);
  NvmlReturn (*throttle)(NvmlDevice, unsigned long long*);
  NvmlReturn (*ecc)(NvmlDevice, int, int, unsigned long long*);
  NvmlReturn (*event_set_create)(NvmlEventSet*);
  NvmlReturn (*register_events)(NvmlDevice, unsigned long long, NvmlEventSet);
  NvmlReturn (*event_set_wait)(NvmlEventSet, NvmlEventData*, unsigned int);
  // Optional: without them the SW power cap bit is reported as read.
  NvmlReturn (*enforced_power_limit)(NvmlDevice, unsigned int*);
  NvmlReturn (*default_power_limit)(NvmlDevice, unsigned int*);
};

template <typename F>
bool Bind(void* library, const char* name, F* out) {
  *out = reinterpret_cast<F>(dlsym(library, name));
  return *out != nullptr;
}

class NvmlTelemetry final : public TelemetrySource {
 public:
  NvmlTelemetry(void* library, NvmlApi api) : library_(library), api_(api) {}
  ~NvmlTelemetry() override {
    api_.shutdown();
    dlclose(library_);
  }

  std::string Name() const override { return "nvml"; }

  absl::Status Init() {
    if (NvmlReturn r = api_.init(); r != kNvmlSuccess) return Failed("nvmlInit_v2", r);
    unsigned int count = 0;
    if (NvmlReturn r = api_.device_count(&count); r != kNvmlSuccess) {
      return Failed("nvmlDeviceGetCount_v2", r);
    }
    for (unsigned int i = 0; i < count; ++i) {
      NvmlDevice device = nullptr;
      if (NvmlReturn r = api_.handle_by_index(i, &device); r != kNvmlSuccess) {
        return Failed("nvmlDeviceGetHandleByIndex_v2", r);
      }
      devices_.push_back(device);
    }
    ecc_totals_.assign(devices_.size(), -1);
    unreadable_.assign(devices_.size(), false);
    // XID events are optional: without them XIDs read as zero.
    if (api_.event_set_create != nullptr && api_.event_set_create(&events_) == kNvmlSuccess) {
      for (NvmlDevice d : devices_) api_.register_events(d, kNvmlEventXidCritical, events_);
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<GpuReading>> Sample() override {
    std::map<NvmlDevice, int> xids = DrainXidEvents();
    std::vector<GpuReading> readings;
    for (size_t i = 0; i < devices_.size(); ++i) {
      NvmlDevice d = devices_[i];
      GpuReading r;
      r.gpu_index = static_cast<int>(i);
      NvmlUtilization u{};
      const NvmlReturn utilization = api_.utilization(d, &u);
      if (utilization == kNvmlSuccess) r.utilization_pct = static_cast<int>(u.gpu);
      NvmlMemory m{};
      if (api_.memory(d, &m) == kNvmlSuccess) {
        r.memory_total_bytes = static_cast<int64_t>(m.total);
        r.memory_used_bytes = static_cast<int64_t>(m.used);
      }
      unsigned int value = 0;
      if (api_.temperature(d, kNvmlTemperatureGpu, &value) == kNvmlSuccess) {
        r.temperature_c = static_cast<int>(value);
      }
      if (api_.power(d, &value) == kNvmlSuccess) r.power_mw = static_cast<int>(value);
      unsigned long long bits = 0;
      const NvmlReturn throttle = api_.throttle(d, &bits);
      if (throttle == kNvmlSuccess) r.throttle_reasons = static_cast<int64_t>(bits);
      // The SW power cap bit says the GPU reached its power limit. At the
      // card's own default limit that is the tenant's load drawing all the
      // power the card is built for (a busy 4090 sits there), not the
      // platform: only a limit set below the default is the platform's
      // throttling (docs/agent.md).
      if ((r.throttle_reasons & kThrottleSwPowerCap) != 0 && AtDefaultPowerLimit(d)) {
        r.throttle_reasons &= ~kThrottleSwPowerCap;
      }
      // Consumer GPUs have no ECC; the call then fails and we report zero.
      // The volatile count is a total since the driver loaded: report what
      // it gained since the previous reading, so that one old error does
      // not spoil every later sample (and every later tenant's SLA).
      if (api_.ecc(d, kNvmlEccUncorrected, kNvmlEccVolatile, &bits) == kNvmlSuccess) {
        const int64_t total = static_cast<int64_t>(bits);
        const int64_t before = ecc_totals_[i];
        ecc_totals_[i] = total;
        if (before >= 0) r.ecc_uncorrected_errors = total >= before ? total - before : total;
      }
      r.xid_errors = xids[d];
      // A GPU NVML cannot read (fallen off the bus: GPU_IS_LOST, or any
      // error but "not supported" on its health calls) is not reported: an
      // all-zero reading passed for a healthy idle GPU, so a dead GPU never
      // breached. Left out, its slots are unreported, which the SLA judges
      // unusable (docs/sla.md). An XID it raised is still sent.
      const bool unreadable = (utilization != kNvmlSuccess && utilization != kNvmlNotSupported) ||
                              (throttle != kNvmlSuccess && throttle != kNvmlNotSupported);
      if (unreadable && r.xid_errors == 0) {
        if (!unreadable_[i]) {
          spdlog::warn("nvml: GPU {} cannot be read (utilization {}, throttle reasons {}); "
                       "its samples are left out until it can",
                       i, utilization, throttle);
        }
        unreadable_[i] = true;
        continue;
      }
      unreadable_[i] = unreadable;
      readings.push_back(r);
    }
    return readings;
  }

 private:
  bool AtDefaultPowerLimit(NvmlDevice d) {
    if (api_.enforced_power_limit == nullptr || api_.default_power_limit == nullptr) {
      return false;
    }
    unsigned int enforced = 0, stock = 0;
    return api_.enforced_power_limit(d, &enforced) == kNvmlSuccess &&
           api_.default_power_limit(d, &stock) == kNvmlSuccess && stock > 0 &&
           enforced >= stock;
  }

  std::map<NvmlDevice, int> DrainXidEvents() {
    std::map<NvmlDevice, int> xids;
    if (events_ == nullptr) return xids;
    constexpr int kEventsPerSampleMax = 1000;
    for (int i = 0; i < kEventsPerSampleMax; ++i) {
      NvmlEventData data{};
      if (api_.event_set_wait(events_, &data, 0) != kNvmlSuccess) break;
      if (IsApplicationXid(data.event_data)) continue;
      ++xids[data.device];
    }
    return xids;
  }

  absl::Status Failed(const char* call, NvmlReturn r) {
    return Error(absl::StatusCode::kUnavailable, "NVML_FAILED",
                 absl::StrCat(call, " failed: ", api_.error_string(r)));
  }

  void* library_;
  NvmlApi api_;
  std::vector<NvmlDevice> devices_;
  std::vector<int64_t> ecc_totals_;  // Per device; -1 before the first reading.
  std::vector<bool> unreadable_;     // Per device: its last sample was left out.
  NvmlEventSet events_ = nullptr;
};

}  // namespace

bool IsApplicationXid(unsigned long long xid) {
  switch (xid) {
    case 13: case 31: case 43: case 45: case 68: case 69: return true;
    default: return false;
  }
}

absl::StatusOr<std::unique_ptr<TelemetrySource>> OpenNvml(const std::string& library) {
  void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    return Error(absl::StatusCode::kFailedPrecondition, "NVML_UNAVAILABLE",
                 absl::StrCat("NVML is not available: cannot load ", library, " (",
                              why ? why : "unknown error",
                              "); install the NVIDIA driver, or run svagent with "
                              "--telemetry=simulated"));
  }
  NvmlApi api{};
  bool ok = Bind(handle, "nvmlInit_v2", &api.init) && Bind(handle, "nvmlShutdown", &api.shutdown) &&
            Bind(handle, "nvmlErrorString", &api.error_string) &&
            Bind(handle, "nvmlDeviceGetCount_v2", &api.device_count) &&
            Bind(handle, "nvmlDeviceGetHandleByIndex_v2", &api.handle_by_index) &&
            Bind(handle, "nvmlDeviceGetUtilizationRates", &api.utilization) &&
            Bind(handle, "nvmlDeviceGetMemoryInfo", &api.memory) &&
            Bind(handle, "nvmlDeviceGetTemperature", &api.temperature) &&
            Bind(handle, "nvmlDeviceGetPowerUsage", &api.power) &&
            Bind(handle, "nvmlDeviceGetCurrentClocksThrottleReasons", &api.throttle) &&
            Bind(handle, "nvmlDeviceGetTotalEccErrors", &api.ecc);
  if (!ok) {
    dlclose(handle);
    return Error(absl::StatusCode::kFailedPrecondition, "NVML_UNAVAILABLE",
                 absl::StrCat(library, " lacks a function svagent needs; the NVIDIA "
                              "driver is too old"));
  }
  bool events = Bind(handle, "nvmlEventSetCreate", &api.event_set_create) &&
                Bind(handle, "nvmlDeviceRegisterEvents", &api.register_events) &&
                Bind(handle, "nvmlEventSetWait_v2", &api.event_set_wait);
  if (!events) api.event_set_create = nullptr;
  if (!Bind(handle, "nvmlDeviceGetEnforcedPowerLimit", &api.enforced_power_limit) ||
      !Bind(handle, "nvmlDeviceGetPowerManagementDefaultLimit", &api.default_power_limit)) {
    api.enforced_power_limit = nullptr;
    api.default_power_limit = nullptr;
  }
  auto source = std::make_unique<NvmlTelemetry>(handle, api);
  if (absl::Status s = source->Init(); !s.ok()) return s;
  return source;
}

}  // namespace sv::agent
