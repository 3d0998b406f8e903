// libFuzzer target: JSON request bodies as the REST gateway and JSON
// clients send them. The first byte picks the request type of one RPC of
// proto/sv/v1 (every input type of every method, from the generated pool);
// the rest is parsed with JsonStringToMessage, and what parses is printed
// back to JSON, serialized and re-parsed, which must succeed.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "google/protobuf/util/json_util.h"

namespace {

using google::protobuf::Descriptor;

const std::vector<const Descriptor*>& RequestTypes() {
  static const auto* types = [] {
    auto* out = new std::vector<const Descriptor*>();
    const auto* pool = google::protobuf::DescriptorPool::generated_pool();
    for (const char* name : {SV_FUZZ_PROTO_FILES}) {
      const auto* file = pool->FindFileByName(name);
      if (file == nullptr) __builtin_trap();  // The build linked every proto.
      for (int s = 0; s < file->service_count(); ++s) {
        for (int m = 0; m < file->service(s)->method_count(); ++m) {
          out->push_back(file->service(s)->method(m)->input_type());
        }
      }
    }
    return out;
  }();
  return *types;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto& types = RequestTypes();
  if (size < 1 || types.empty()) return 0;
  const Descriptor* type = types[data[0] % types.size()];
  const google::protobuf::Message* prototype =
      google::protobuf::MessageFactory::generated_factory()->GetPrototype(type);
  std::unique_ptr<google::protobuf::Message> message(prototype->New());
  const std::string json(reinterpret_cast<const char*>(data + 1), size - 1);
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  if (!google::protobuf::util::JsonStringToMessage(json, message.get(), options).ok()) return 0;
  std::string printed;
  if (!google::protobuf::util::MessageToJsonString(*message, &printed).ok()) __builtin_trap();
  std::unique_ptr<google::protobuf::Message> again(prototype->New());
  if (!google::protobuf::util::JsonStringToMessage(printed, again.get()).ok()) __builtin_trap();
  std::string wire;
  if (!message->SerializeToString(&wire)) __builtin_trap();
  std::unique_ptr<google::protobuf::Message> decoded(prototype->New());
  if (!decoded->ParseFromString(wire)) __builtin_trap();
  return 0;
}
