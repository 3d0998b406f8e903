#include "api/webhooks.h"

#include <arpa/inet.h>
#include <httplib.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/ids.h"
#include "common/status.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

namespace sv::api {
namespace {

constexpr size_t kUrlLengthMax = 2048;
constexpr int kNoticesPerPass = 20;    // Per tenant and pass.
constexpr int kWebhooksPerPass = 200;  // Tenants per pass.
constexpr int kParallel = 8;           // Tenants delivered to at once.

absl::Status BadUrl(const std::string& why) {
  return Error(absl::StatusCode::kInvalidArgument, "INVALID_WEBHOOK_URL",
               absl::StrCat("url ", why));
}

bool PublicV4(uint32_t a) {  // Host byte order.
  auto in = [a](uint32_t net, int bits) {
    return bits == 0 || (a >> (32 - bits)) == (net >> (32 - bits));
  };
  return !(in(0x00000000, 8) || in(0x0A000000, 8) || in(0x64400000, 10) ||
           in(0x7F000000, 8) || in(0xA9FE0000, 16) || in(0xAC100000, 12) ||
           in(0xC0000000, 24) || in(0xC0A80000, 16) || in(0xC6120000, 15) ||
           in(0xE0000000, 3));  // Multicast and reserved, 224/3.
}

bool PublicV6(const in6_addr& a) {
  const uint8_t* b = a.s6_addr;
  if (IN6_IS_ADDR_V4MAPPED(&a) || IN6_IS_ADDR_V4COMPAT(&a)) {
    return PublicV4((uint32_t{b[12]} << 24) | (uint32_t{b[13]} << 16) | (uint32_t{b[14]} << 8) |
                    b[15]);
  }
  if (IN6_IS_ADDR_UNSPECIFIED(&a) || IN6_IS_ADDR_LOOPBACK(&a) || IN6_IS_ADDR_LINKLOCAL(&a) ||
      IN6_IS_ADDR_SITELOCAL(&a) || IN6_IS_ADDR_MULTICAST(&a)) {
    return false;
  }
  return (b[0] & 0xfe) != 0xfc;  // fc00::/7, unique local.
}

}  // namespace

absl::StatusOr<WebhookUrl> ParseWebhookUrl(const std::string& url) {
  if (url.empty() || url.size() > kUrlLengthMax) {
    return BadUrl(absl::StrCat("must be 1 to ", kUrlLengthMax, " characters"));
  }
  for (unsigned char c : url) {
    if (c <= 0x20 || c >= 0x7f) return BadUrl("must be printable ASCII without spaces");
  }
  WebhookUrl out;
  std::string rest;
  const std::string lower = absl::AsciiStrToLower(url);
  if (lower.rfind("https://", 0) == 0) {
    out.https = true;
    rest = url.substr(8);
  } else if (lower.rfind("http://", 0) == 0) {
    rest = url.substr(7);
  } else {
    return BadUrl("must start with http:// or https://");
  }
  if (rest.find('#') != std::string::npos) return BadUrl("must not have a fragment");
  const size_t slash = rest.find_first_of("/?");
  std::string authority = rest.substr(0, slash);
  out.path = slash == std::string::npos ? "/" : rest.substr(slash);
  if (out.path[0] == '?') out.path.insert(0, "/");
  if (authority.find('@') != std::string::npos) return BadUrl("must not carry a user or password");
  std::string port;
  bool has_port = false;
  if (!authority.empty() && authority[0] == '[') {
    const size_t close = authority.find(']');
    if (close == std::string::npos) return BadUrl("has an unclosed [IPv6] host");
    out.host = authority.substr(1, close - 1);
    if (close + 1 < authority.size()) {
      if (authority[close + 1] != ':') return BadUrl("has a malformed host");
      port = authority.substr(close + 2);
      has_port = true;
    }
  } else {
    const size_t colon = authority.rfind(':');
    out.host = authority.substr(0, colon);
    if (colon != std::string::npos) {
      port = authority.substr(colon + 1);
      has_port = true;
    }
  }
  if (out.host.empty()) return BadUrl("has no host");
  out.port = out.https ? 443 : 80;
  if (has_port) {
    int p = 0;
    if (!absl::SimpleAtoi(port, &p) || p < 1 || p > 65535) return BadUrl("has a bad port");
    out.port = p;
  }
  return out;
}

absl::Status CheckWebhookHost(const WebhookUrl& url, bool allow_private,
                              std::string* address) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = getaddrinfo(url.host.c_str(), nullptr, &hints, &found);
  if (rc != 0 || found == nullptr) {
    return Error(absl::StatusCode::kInvalidArgument, "UNRESOLVABLE_WEBHOOK_HOST",
                 absl::StrCat("the webhook host ", url.host, " does not resolve"));
  }
  bool all_public = true;
  std::string first_v4, first_any;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    char text[INET6_ADDRSTRLEN] = {};
    if (a->ai_family == AF_INET) {
      const auto* v4 = reinterpret_cast<const sockaddr_in*>(a->ai_addr);
      all_public = all_public && PublicV4(ntohl(v4->sin_addr.s_addr));
      inet_ntop(AF_INET, &v4->sin_addr, text, sizeof(text));
      if (first_v4.empty()) first_v4 = text;
    } else if (a->ai_family == AF_INET6) {
      const auto* v6 = reinterpret_cast<const sockaddr_in6*>(a->ai_addr);
      all_public = all_public && PublicV6(v6->sin6_addr);
      inet_ntop(AF_INET6, &v6->sin6_addr, text, sizeof(text));
    } else {
      all_public = false;
    }
    if (first_any.empty()) first_any = text;
  }
  freeaddrinfo(found);
  if (address != nullptr) *address = first_v4.empty() ? first_any : first_v4;
  if (!all_public && !allow_private) {
    return Error(absl::StatusCode::kInvalidArgument, "WEBHOOK_URL_NOT_PUBLIC",
                 absl::StrCat("the webhook host ", url.host,
                              " resolves to a loopback, private or reserved address; svd "
                              "sends webhooks only to public addresses"));
  }
  return absl::OkStatus();
}

std::string WebhookSignature(const std::string& secret, int64_t timestamp,
                             const std::string& body) {
  return "v1=" + HmacSha256Hex(secret, absl::StrCat(timestamp, ".", body));
}

std::string NewWebhookSecret() { return "whsec_" + RandomToken(40); }

std::string WebhookNoticeBody(const std::string& tenant_id, const store::WebhookNotice& notice) {
  nlohmann::json body = {{"id", absl::StrCat("ntc-", notice.id)},
                         {"tenantId", tenant_id},
                         {"kind", notice.kind},
                         {"message", notice.message},
                         {"createTime", absl::FormatTime("%Y-%m-%dT%H:%M:%E*SZ", notice.at,
                                                         absl::UTCTimeZone())}};
  if (!notice.instance_id.empty()) body["instanceId"] = notice.instance_id;
  return body.dump();
}

WebhookAttempt PostWebhook(const std::string& url, const std::string& secret,
                           const std::string& event_id, const std::string& body,
                           absl::Time now, const WebhookOptions& options) {
  WebhookAttempt attempt;
  auto parsed = ParseWebhookUrl(url);
  if (!parsed.ok()) {
    attempt.error = std::string(parsed.status().message());
    return attempt;
  }
  // Checked again at each send: the name may resolve elsewhere today. The
  // request goes to the address checked: resolved again by the client, a
  // name could answer public to the check and private to the connection.
  std::string address;
  absl::Status host = CheckWebhookHost(*parsed, options.allow_private_addresses, &address);
  if (!host.ok()) {
    attempt.error = std::string(host.message());
    return attempt;
  }
  const std::string origin = absl::StrCat(parsed->https ? "https://" : "http://",
                                          parsed->host.find(':') != std::string::npos
                                              ? absl::StrCat("[", parsed->host, "]")
                                              : parsed->host,
                                          ":", parsed->port);
  httplib::Client client(origin);
  // The Host header and TLS's server name stay the URL's.
  client.set_hostname_addr_map({{parsed->host, address}});
  const int64_t timeout_us = absl::ToInt64Microseconds(options.timeout);
  client.set_connection_timeout(timeout_us / 1000000, timeout_us % 1000000);
  client.set_read_timeout(timeout_us / 1000000, timeout_us % 1000000);
  client.set_write_timeout(timeout_us / 1000000, timeout_us % 1000000);
  client.set_follow_location(false);
  if (parsed->https) client.enable_server_certificate_verification(true);
  const int64_t timestamp = absl::ToUnixSeconds(now);
  httplib::Headers headers = {{"User-Agent", "sv-webhooks/1"},
                              {"X-Sv-Event-Id", event_id},
                              {"X-Sv-Timestamp", absl::StrCat(timestamp)},
                              {"X-Sv-Signature", WebhookSignature(secret, timestamp, body)}};
  auto result = client.Post(parsed->path, headers, body, "application/json");
  if (!result) {
    attempt.error = absl::StrCat("no answer: ", httplib::to_string(result.error()));
    return attempt;
  }
  attempt.http_status = result->status;
  if (result->status < 200 || result->status > 299) {
    attempt.error = absl::StrCat("answered HTTP ", result->status);
  }
  return attempt;
}

// ---- The loop ---------------------------------------------------------------

WebhookDispatcher::WebhookDispatcher(store::Database& db, const Clock& clock,
                                     WebhookOptions options)
    : store_(db), clock_(clock), options_(options), loop_("webhooks", options.interval, [this] {
        auto result = RunOnce(clock_.Now());
        if (!result.ok()) spdlog::warn("webhooks: pass failed: {}", result.status().ToString());
      }) {}

absl::StatusOr<int> WebhookDispatcher::RunOnce(absl::Time now) {
  SV_ASSIGN_OR_RETURN(auto due, store_.Due(now, kWebhooksPerPass));
  std::mutex mutex;
  int delivered = 0;
  absl::Status failed;
  // One tenant's notices go one after another, in order; tenants go
  // kParallel at a time, so one slow receiver does not hold the others.
  auto deliver = [&](const store::WebhookRow& hook) {
    auto notices = store_.Pending(hook.tenant_id, hook.starts_after, kNoticesPerPass);
    absl::Status status = notices.status();
    for (const auto& notice : notices.ok() ? *notices : std::vector<store::WebhookNotice>{}) {
      const std::string event_id = absl::StrCat("ntc-", notice.id);
      const absl::Time at = clock_.Now();
      WebhookAttempt attempt = PostWebhook(hook.url, hook.secret, event_id,
                                           WebhookNoticeBody(hook.tenant_id, notice), at,
                                           options_);
      if (!attempt.ok()) {
        const int attempts = std::min(hook.attempts, 20);
        const absl::Duration wait =
            std::min(absl::Seconds(int64_t{1} << std::min(attempts, 12)), options_.max_backoff);
        spdlog::warn("webhooks: tenant={} notice={} failed ({} tries): {}", hook.tenant_id,
                     notice.id, hook.attempts + 1, attempt.error);
        auto disabled =
            store_.RecordFailure(hook.tenant_id, attempt.error, wait, options_.give_up_after, at);
        status = disabled.status();
        if (disabled.ok() && *disabled) {
          spdlog::warn("webhooks: tenant={} webhook {} turned off: failing for more than {}",
                       hook.tenant_id, hook.url, absl::FormatDuration(options_.give_up_after));
        }
        break;
      }
      status = store_.RecordDelivered(hook.tenant_id, hook.url, notice.id, attempt.http_status,
                                      at);
      if (!status.ok()) break;
      std::lock_guard<std::mutex> lock(mutex);
      ++delivered;
    }
    if (!status.ok()) {
      std::lock_guard<std::mutex> lock(mutex);
      failed.Update(status);
    }
  };
  for (size_t i = 0; i < due.size(); i += kParallel) {
    std::vector<std::thread> batch;
    for (size_t j = i; j < std::min(due.size(), i + kParallel); ++j) {
      batch.emplace_back(deliver, std::cref(due[j]));
    }
    for (auto& t : batch) t.join();
  }
  if (!failed.ok()) return failed;
  return delivered;
}

}  // namespace sv::api
