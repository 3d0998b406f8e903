// A stand-in for libnvidia-ml.so.1 with the C ABI svagent binds
// (src/agent/nvml_telemetry.cc), so that the real NVML path is tested on
// machines without a GPU: two devices, and test-set XID events and
// uncorrected ECC counts (fake_nvml_* below; the test reaches them by
// dlopen of the same file, which shares this library's state).
#include <cstring>
#include <deque>

namespace {

struct Event {
  void* device;
  unsigned long long event_type;
  unsigned long long event_data;
  unsigned int gpu_instance_id;
  unsigned int compute_instance_id;
};

constexpr int kDevices = 2;
int device_tags[kDevices];  // Their addresses are the device handles.
unsigned long long ecc[kDevices];
unsigned long long throttle[kDevices];
int health_status[kDevices];  // What the health calls return (0: success).
unsigned int enforced_limit_mw[kDevices] = {450000, 450000};
std::deque<Event> events;
int event_set_tag;

}  // namespace

extern "C" {

int nvmlInit_v2() { return 0; }
int nvmlShutdown() { return 0; }
const char* nvmlErrorString(int) { return "fake NVML error"; }
int nvmlDeviceGetCount_v2(unsigned int* count) {
  *count = kDevices;
  return 0;
}
int nvmlDeviceGetHandleByIndex_v2(unsigned int index, void** device) {
  if (index >= kDevices) return 2;  // NVML_ERROR_INVALID_ARGUMENT
  *device = &device_tags[index];
  return 0;
}
static int Index(void* device);
int nvmlDeviceGetUtilizationRates(void* device, unsigned int* rates) {
  if (health_status[Index(device)] != 0) return health_status[Index(device)];
  rates[0] = 97;  // gpu
  rates[1] = 40;  // memory
  return 0;
}
int nvmlDeviceGetMemoryInfo(void*, unsigned long long* memory) {
  memory[0] = 24ull << 30;  // total
  memory[1] = 20ull << 30;  // free
  memory[2] = 4ull << 30;   // used
  return 0;
}
int nvmlDeviceGetTemperature(void*, int, unsigned int* celsius) {
  *celsius = 61;
  return 0;
}
int nvmlDeviceGetPowerUsage(void*, unsigned int* milliwatts) {
  *milliwatts = 402000;
  return 0;
}
static int Index(void* device) {
  for (int i = 0; i < kDevices; ++i) {
    if (device == &device_tags[i]) return i;
  }
  return 0;
}
int nvmlDeviceGetCurrentClocksThrottleReasons(void* device, unsigned long long* reasons) {
  if (health_status[Index(device)] != 0) return health_status[Index(device)];
  *reasons = throttle[Index(device)];
  return 0;
}
int nvmlDeviceGetEnforcedPowerLimit(void* device, unsigned int* milliwatts) {
  *milliwatts = enforced_limit_mw[Index(device)];
  return 0;
}
int nvmlDeviceGetPowerManagementDefaultLimit(void*, unsigned int* milliwatts) {
  *milliwatts = 450000;  // An RTX 4090's.
  return 0;
}
int nvmlDeviceGetTotalEccErrors(void* device, int, int, unsigned long long* count) {
  for (int i = 0; i < kDevices; ++i) {
    if (device == &device_tags[i]) {
      *count = ecc[i];
      return 0;
    }
  }
  return 2;
}
int nvmlEventSetCreate(void** set) {
  *set = &event_set_tag;
  return 0;
}
int nvmlDeviceRegisterEvents(void*, unsigned long long, void*) { return 0; }
int nvmlEventSetWait_v2(void*, Event* data, unsigned int) {
  if (events.empty()) return 10;  // NVML_ERROR_TIMEOUT
  *data = events.front();
  events.pop_front();
  return 0;
}

// Test controls.
void fake_nvml_xid(int device, unsigned long long xid) {
  events.push_back({&device_tags[device], 0x8, xid, 0, 0});
}
void fake_nvml_set_ecc(int device, unsigned long long total) { ecc[device] = total; }
void fake_nvml_set_throttle(int device, unsigned long long bits) { throttle[device] = bits; }
// What the device's utilization and throttle-reason calls return, e.g. 15
// (NVML_ERROR_GPU_IS_LOST) or 3 (NVML_ERROR_NOT_SUPPORTED); 0: success.
void fake_nvml_set_health_status(int device, int status) { health_status[device] = status; }
void fake_nvml_set_power_limit(int device, unsigned int milliwatts) {
  enforced_limit_mw[device] = milliwatts;
}

}  // extern "C"
