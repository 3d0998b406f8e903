// SSH public keys as tenants paste them: the accepted ones get the
// fingerprint ssh-keygen -l prints (the keys below were made with
// ssh-keygen and their fingerprints read with ssh-keygen -lf), and the rest
// are refused with a reason the tenant can act on.

#include "api/ssh_public_key.h"

#include <gtest/gtest.h>

#include "absl/strings/escaping.h"
#include "common/status.h"

namespace sv::api {
namespace {

constexpr char kEd25519[] =
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHfEEtt9IWoMZRzane5L5oxN9EqjMENrsNsXY3GBvRUL "
    "alice@laptop";
constexpr char kRsa2048[] =
    "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQCRH6Wkmuhusx2BnfF4S1PKACDRUaVyi8/fM8c+QpCKjy76EkqWcqj"
    "18oqgqX6vFzV5fuKt8FnReLOoutKUkXfTcFeOR/IhSjS75tebnwpw4G14LJM5X9RkrFmqarhV8208JaG2YJ1UDPxhdX"
    "4/G6NoEpMQERxaLdRxoTkRXtYlTHrjja/YYB9MQljwrilA/a8nFA19ErETRi1dECDJQo9RD0KVN2ykJQALH2IxTm7BT"
    "FVuszWeDobNAybMZLR5QPKc/CCx540z+A1fW1UhuG4oPQeRtoEHOgPD5iaIJgxAyGCOa9Z+lvhrHVTDK/hjn6ROGaHsm"
    "auKWs9jddXhzB3B ops key";
constexpr char kEcdsa384[] =
    "ecdsa-sha2-nistp384 AAAAE2VjZHNhLXNoYTItbmlzdHAzODQAAAAIbmlzdHAzODQAAABhBMiIUmhn6KVjhdGk+/6"
    "ySjf7UMV/W6pQYMEQbD64Vwst8jBHeNH8wNN3Gshqq9Zd5sGxWeL/PXpcNW0XepbOiPLtEXpbSr3z2225evSnXC1vKvs"
    "8tTmVcFKgRQQxpSs1cw== c";
constexpr char kRsa1024[] =
    "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAAAgQDiNQ1Zk06QKAi6t8LMQbj+VBQ15EjvE1BwH1adUGqE+Esm1j6GrP4"
    "UsRK7Kj14oRdRbQZpUs8d60pdQDeRY35Q7GDSEjMOS0zNjqHXGIRkk1shzq0YYwr9Sqoh+n/kUY9tzcOWvC8rnWf/+Yk7"
    "qCCujz51bkbL+81AdxXiuFpW2Q== root@vm";

TEST(SshPublicKeyTest, AcceptedKeysHaveSshKeygensFingerprint) {
  auto ed = ParseSshPublicKey(std::string("\n  ") + kEd25519 + "\n");
  ASSERT_TRUE(ed.ok()) << ed.status();
  EXPECT_EQ(ed->type, "ssh-ed25519");
  EXPECT_EQ(ed->fingerprint, "SHA256:HQJS/VSNaUNCurZZ3vwMdPobpYq9sbxMVFt7KaqgxPA");
  EXPECT_EQ(ed->line, kEd25519);
  EXPECT_EQ(ed->comment, "alice@laptop");

  auto rsa = ParseSshPublicKey(kRsa2048);
  ASSERT_TRUE(rsa.ok()) << rsa.status();
  EXPECT_EQ(rsa->fingerprint, "SHA256:hOG6yXy5/TSVuXwa5Xl2QRJheGdpfnc1clvGjzsMT/k");
  EXPECT_EQ(rsa->comment, "ops key");

  auto ec = ParseSshPublicKey(kEcdsa384);
  ASSERT_TRUE(ec.ok()) << ec.status();
  EXPECT_EQ(ec->fingerprint, "SHA256:bYlhM4V8MyiyN/EWBNLdSPlDwxM67vwNOwLyZnxe8Do");

  // Tabs between the fields, and no comment.
  const std::string ed_text = kEd25519;
  const std::string bare = ed_text.substr(0, ed_text.rfind(' '));
  auto tabbed = ParseSshPublicKey("ssh-ed25519\t" + bare.substr(12));
  ASSERT_TRUE(tabbed.ok()) << tabbed.status();
  EXPECT_EQ(tabbed->line, bare);
  EXPECT_EQ(tabbed->fingerprint, ed->fingerprint);
}

void ExpectRefused(const std::string& text, const std::string& says) {
  auto key = ParseSshPublicKey(text);
  ASSERT_FALSE(key.ok()) << text;
  EXPECT_EQ(key.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReasonOf(key.status()), "INVALID_SSH_KEY");
  EXPECT_NE(key.status().message().find(says), std::string::npos) << key.status();
}

TEST(SshPublicKeyTest, RefusedKeysSayWhy) {
  const std::string ed = kEd25519;
  const std::string ed_b64 = ed.substr(12, ed.rfind(' ') - 12);
  ExpectRefused("", "required");
  ExpectRefused(kRsa1024, "at least 2048 bits; this one has 1024");
  ExpectRefused("-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n"
                "-----END OPENSSH PRIVATE KEY-----\n",
                "private key");
  ExpectRefused(ed + "\n" + kRsa2048, "one line");
  // authorized_keys options would run on every instance of the tenant.
  ExpectRefused("command=\"/bin/true\" " + ed, "unsupported key type");
  ExpectRefused("ssh-dss AAAAB3NzaC1kc3MAAACBAP", "DSA");
  ExpectRefused("ssh-ed25519", "<type> <base64 key>");
  ExpectRefused("ssh-ed25519 not*base64 x", "not base64");
  // The blob of an ed25519 key under another type, and a cut-off one.
  ExpectRefused("ssh-rsa " + ed_b64, "not a ssh-rsa key");
  ExpectRefused("ssh-ed25519 " + ed_b64.substr(0, 40), "not a complete ed25519 key");
  ExpectRefused(ed_b64, "<type> <base64 key>");
  ExpectRefused(ed + " bell\a", "control characters");
  ExpectRefused(ed + " " + std::string(300, 'c'), "comment is longer");
  ExpectRefused("ssh-ed25519 " + std::string(5000, 'A'), "longer than 4096");
  // Bytes after the key's own fields: they would ride along to every node.
  {
    std::string blob;
    ASSERT_TRUE(absl::Base64Unescape(ed_b64, &blob));
    ExpectRefused("ssh-ed25519 " + absl::Base64Escape(blob + std::string(64, 'x')),
                  "64 bytes after the key");
  }
}

TEST(SshPublicKeyTest, DefaultNamesComeFromTheComment) {
  auto ed = ParseSshPublicKey(kEd25519);
  ASSERT_TRUE(ed.ok());
  EXPECT_EQ(DefaultSshKeyName(*ed), "alice-laptop");
  auto rsa = ParseSshPublicKey(kRsa2048);
  ASSERT_TRUE(rsa.ok());
  EXPECT_EQ(DefaultSshKeyName(*rsa), "ops-key");
  SshPublicKey none = *ed;
  none.comment = "  @@ ";
  EXPECT_EQ(DefaultSshKeyName(none), "key-hqjsvsna");
  none.comment = "Ünïcode Name";
  EXPECT_EQ(DefaultSshKeyName(none), "n-code-name");  // Non-ASCII letters are left out.
  for (const auto& n : {DefaultSshKeyName(*ed), DefaultSshKeyName(*rsa)}) {
    EXPECT_TRUE(ValidSshKeyName(n)) << n;
  }
  EXPECT_FALSE(ValidSshKeyName(""));
  EXPECT_FALSE(ValidSshKeyName("-a"));
  EXPECT_FALSE(ValidSshKeyName("Alice"));
  EXPECT_FALSE(ValidSshKeyName(std::string(64, 'a')));
  EXPECT_TRUE(ValidSshKeyName(std::string(63, 'a')));
}

}  // namespace
}  // namespace sv::api
