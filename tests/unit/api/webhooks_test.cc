// The webhook URL rules, the public-address check and the signature
// (docs/notifications.md).
#include "api/webhooks.h"

#include "common/ids.h"
#include "common/status.h"
#include "gtest/gtest.h"

#include <string>
#include <vector>

namespace sv::api {
namespace {

TEST(WebhookUrlTest, ParsesSchemeHostPortAndPath) {
  auto url = ParseWebhookUrl("https://hooks.example.com/sv?team=7");
  ASSERT_TRUE(url.ok()) << url.status();
  EXPECT_TRUE(url->https);
  EXPECT_EQ(url->host, "hooks.example.com");
  EXPECT_EQ(url->port, 443);
  EXPECT_EQ(url->path, "/sv?team=7");
  url = ParseWebhookUrl("HTTP://[2001:db8::1]:8080");
  ASSERT_TRUE(url.ok()) << url.status();
  EXPECT_FALSE(url->https);
  EXPECT_EQ(url->host, "2001:db8::1");
  EXPECT_EQ(url->port, 8080);
  EXPECT_EQ(url->path, "/");
  EXPECT_EQ(ParseWebhookUrl("http://example.com?x=1")->path, "/?x=1");
}

TEST(WebhookUrlTest, RefusesWhatIsNotAPlainHttpUrl) {
  for (const std::string& bad : std::vector<std::string>{
           "", "ftp://example.com/", "example.com/hook", "http://", "http://:80/",
        "http://user:pw@example.com/", "http://example.com:0/", "http://example.com:99999/",
        "http://example.com:x/", "http://exa mple.com/", "http://example.com/#frag",
        "http://[::1/", std::string("http://example.com/") + std::string(2100, 'a')}) {
    auto url = ParseWebhookUrl(bad);
    EXPECT_FALSE(url.ok()) << bad;
    EXPECT_EQ(ReasonOf(url.status()), "INVALID_WEBHOOK_URL") << bad;
  }
}

TEST(WebhookUrlTest, OnlyPublicAddressesUnlessAllowed) {
  for (const std::string& host : std::vector<std::string>{"127.0.0.1", "10.1.2.3", "172.16.0.1", "192.168.1.1",
                                 "169.254.169.254", "100.64.0.1", "0.0.0.0", "224.0.0.1",
                                 "::1", "fe80::1", "fd00::1", "::ffff:10.0.0.1", "localhost"}) {
    WebhookUrl url{false, host, 80, "/"};
    absl::Status status = CheckWebhookHost(url, false);
    EXPECT_EQ(ReasonOf(status), "WEBHOOK_URL_NOT_PUBLIC") << host;
    EXPECT_TRUE(CheckWebhookHost(url, true).ok()) << host;
  }
  for (const std::string& host : std::vector<std::string>{"8.8.8.8", "2001:4860:4860::8888", "203.0.114.5"}) {
    EXPECT_TRUE(CheckWebhookHost({true, host, 443, "/"}, false).ok()) << host;
  }
  EXPECT_EQ(ReasonOf(CheckWebhookHost({false, "no-such-host.invalid", 80, "/"}, true)),
            "UNRESOLVABLE_WEBHOOK_HOST");
}

// The check hands back the address it vetted, and the request is pinned
// to it (PostWebhook), so a name cannot answer public to the check and
// private to the connection (DNS rebinding). IPv4 first.
TEST(WebhookUrlTest, TheCheckedAddressIsTheOneToConnectTo) {
  std::string address;
  ASSERT_TRUE(CheckWebhookHost({true, "8.8.8.8", 443, "/"}, false, &address).ok());
  EXPECT_EQ(address, "8.8.8.8");
  ASSERT_TRUE(CheckWebhookHost({true, "2001:4860:4860::8888", 443, "/"}, false, &address).ok());
  EXPECT_EQ(address, "2001:4860:4860::8888");
  ASSERT_TRUE(CheckWebhookHost({false, "localhost", 80, "/"}, true, &address).ok());
  EXPECT_TRUE(address == "127.0.0.1" || address == "::1") << address;
}

TEST(WebhookSignatureTest, IsHmacSha256OfTimestampAndBody) {
  // RFC 4231, test case 2: key "Jefe", data "what do ya want for nothing?".
  EXPECT_EQ(HmacSha256Hex("Jefe", "what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  EXPECT_EQ(WebhookSignature("Jefe", 1700000000, "{}"),
            "v1=" + HmacSha256Hex("Jefe", "1700000000.{}"));
  const std::string secret = NewWebhookSecret();
  EXPECT_EQ(secret.rfind("whsec_", 0), 0u);
  EXPECT_NE(secret, NewWebhookSecret());
}

TEST(WebhookBodyTest, CarriesTheNotice) {
  store::WebhookNotice notice{42, "low_credit", "ins-abc", "Credit runs out in 9 minutes",
                              absl::FromUnixSeconds(1700000000)};
  EXPECT_EQ(WebhookNoticeBody("ten-x", notice),
            R"({"createTime":"2023-11-14T22:13:20Z","id":"ntc-42","instanceId":"ins-abc",)"
            R"("kind":"low_credit","message":"Credit runs out in 9 minutes","tenantId":"ten-x"})");
}

}  // namespace
}  // namespace sv::api
