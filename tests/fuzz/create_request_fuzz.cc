// libFuzzer target: a CreateInstanceRequest as it arrives on the wire,
// decoded by protobuf and then validated as svd does before any SQL runs.
#include <cstddef>
#include <cstdint>

#include "api/validation.h"
#include "sv/v1/instance.pb.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  sv::v1::CreateInstanceRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  const auto& in = request.instance();
  auto spec = sv::api::NormalizeInstanceSpec(
      {in.name(), in.gpu_count(), in.gpu_model(), in.image()});
  if (spec.ok()) {
    (void)sv::api::InstanceFingerprint(*spec);
  }
  if (!request.request_id().empty()) (void)sv::api::ValidateRequestId(request.request_id());
  return 0;
}
