#include "server/logging.h"

#include <memory>

#include "common/log_context.h"
#include "spdlog/pattern_formatter.h"
#include "spdlog/spdlog.h"

namespace sv::server {
namespace {

void AppendEscaped(spdlog::string_view_t text, spdlog::memory_buf_t& dest) {
  static constexpr char kHex[] = "0123456789abcdef";
  for (char raw : text) {
    const unsigned char c = static_cast<unsigned char>(raw);
    switch (c) {
      case '"': dest.append(std::string_view("\\\"")); break;
      case '\\': dest.append(std::string_view("\\\\")); break;
      case '\n': dest.append(std::string_view("\\n")); break;
      case '\r': dest.append(std::string_view("\\r")); break;
      case '\t': dest.append(std::string_view("\\t")); break;
      default:
        if (c < 0x20) {
          const char escaped[] = {'\\', 'u', '0', '0', kHex[c >> 4], kHex[c & 15]};
          dest.append(escaped, escaped + 6);
        } else {
          dest.push_back(raw);
        }
    }
  }
}

// %* : the message, escaped for a JSON string.
class JsonMessage final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    AppendEscaped(msg.payload, dest);
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<JsonMessage>();
  }
};

// %& : ,"method":...,"tenant":...,"request_id":... for what is known.
class JsonContext final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg&, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    const logging::Context& context = logging::CurrentContext();
    Field("method", context.method, dest);
    Field("tenant", context.tenant, dest);
    Field("request_id", context.request_id, dest);
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<JsonContext>();
  }

 private:
  static void Field(std::string_view name, const std::string& value,
                    spdlog::memory_buf_t& dest) {
    if (value.empty()) return;
    dest.append(std::string_view(",\""));
    dest.append(name);
    dest.append(std::string_view("\":\""));
    AppendEscaped(value, dest);
    dest.push_back('"');
  }
};

}  // namespace

void ConfigureLogging(const std::string& format, const std::string& level) {
  spdlog::set_level(spdlog::level::from_str(level));
  if (format != "json") {
    spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ %v");
    return;
  }
  auto formatter = std::make_unique<spdlog::pattern_formatter>(spdlog::pattern_time_type::utc);
  formatter->add_flag<JsonMessage>('*').add_flag<JsonContext>('&').set_pattern(
      R"({"time":"%Y-%m-%dT%H:%M:%S.%fZ","level":"%l","logger":"%n","thread":%t,"msg":"%*"%&})");
  spdlog::set_formatter(std::move(formatter));
}

}  // namespace sv::server
