// Validation of API input: each rule, at and beyond its limit.

#include "api/validation.h"

#include <gtest/gtest.h>

#include "api/api_keys.h"
#include "common/status.h"

namespace sv::api {
namespace {

TEST(ValidateGpuCountTest, AcceptsOneToEightAndWholeNodesUpTo128) {
  struct Case {
    int gpus;
    bool ok;
  };
  const Case cases[] = {{0, false}, {-1, false}, {1, true},   {2, true},   {7, true},
                        {8, true},  {9, false},  {12, false}, {15, false}, {16, true},
                        {24, true}, {120, true}, {128, true}, {129, false}, {136, false}};
  for (const Case& c : cases) {
    absl::Status s = ValidateGpuCount(c.gpus);
    EXPECT_EQ(s.ok(), c.ok) << c.gpus;
    if (!c.ok) {
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
      EXPECT_EQ(ReasonOf(s), "INVALID_GPU_COUNT");
    }
  }
}

TEST(NormalizeInstanceSpecTest, FillsDefaultsAndRejectsBadFields) {
  auto spec = NormalizeInstanceSpec({"", 4, "", ""});
  ASSERT_TRUE(spec.ok());
  EXPECT_EQ(spec->gpu_model, "RTX 4090");
  EXPECT_EQ(spec->image, kDefaultImage);

  EXPECT_EQ(ReasonOf(NormalizeInstanceSpec({"", 4, "A100", ""}).status()), "UNKNOWN_GPU_MODEL");
  EXPECT_EQ(ReasonOf(NormalizeInstanceSpec({"", 4, "", "bad image"}).status()), "INVALID_IMAGE");
  EXPECT_EQ(ReasonOf(NormalizeInstanceSpec({"", 4, "", std::string(257, 'a')}).status()),
            "INVALID_IMAGE");
  EXPECT_TRUE(NormalizeInstanceSpec({"", 4, "", std::string(256, 'a')}).ok());
  EXPECT_TRUE(NormalizeInstanceSpec({"", 4, "", "nvcr.io/nvidia/pytorch:24.01-py3"}).ok());
  // A leading '-' would reach `docker run` as an option, not an image.
  EXPECT_EQ(ReasonOf(NormalizeInstanceSpec({"", 4, "", "--privileged"}).status()),
            "INVALID_IMAGE");
  EXPECT_EQ(ReasonOf(NormalizeInstanceSpec({"", 4, "", "-v/:/host"}).status()), "INVALID_IMAGE");
  // No empty or dot-led path part: one path has one spelling.
  for (const char* bad : {"a//b", "a/./b", "a/../b", "a/.b", "registry.sv.internal/x/"}) {
    EXPECT_EQ(ReasonOf(NormalizeInstanceSpec({"", 4, "", bad}).status()), "INVALID_IMAGE") << bad;
  }
  EXPECT_TRUE(NormalizeInstanceSpec({"", 4, "", "ubuntu@sha256:0a1b"}).ok());
  EXPECT_TRUE(NormalizeInstanceSpec({"", 64, "", "", 2}).ok());
  EXPECT_TRUE(NormalizeInstanceSpec({"", 64, "", "", 16}).ok());
  EXPECT_EQ(ReasonOf(NormalizeInstanceSpec({"", 64, "", "", 17}).status()), "INVALID_MAX_LEAVES");
  EXPECT_EQ(ReasonOf(NormalizeInstanceSpec({"", 64, "", "", -1}).status()), "INVALID_MAX_LEAVES");
  EXPECT_EQ(ReasonOf(NormalizeInstanceSpec({"", 8, "", "", 1}).status()), "INVALID_MAX_LEAVES");
}

// Tenants' private namespaces in the app registry (docs/marketplace.md):
// every spelling a runtime resolves to the registry counts, nothing else.
TEST(ImageNamespaceTest, FindsTheOwningTenantAsARuntimeReadsTheReference) {
  const std::string reg = "registry.sv.internal";
  struct Case {
    const char* image;
    const char* owner;
  };
  const Case cases[] = {
      {"registry.sv.internal/ten-abc/sd:1.0", "ten-abc"},
      {"registry.sv.internal/ten-abc/sd", "ten-abc"},
      {"registry.sv.internal/ten-abc/team/sd@sha256:00ff", "ten-abc"},
      {"registry.sv.internal/ten-abc", "ten-abc"},
      {"registry.sv.internal/ten-abc:1", "ten-abc"},
      {"REGISTRY.SV.Internal/TEN-ABC/sd:1", "ten-abc"},
      {"registry.sv.internal:443/ten-abc/sd", "ten-abc"},
      {"registry.sv.internal./ten-abc/sd", "ten-abc"},
      // The platform's own repositories and other registries: nobody's.
      {"registry.sv.internal/base/cuda:12.4", ""},
      {"registry.sv.internal/tenant/sd", ""},
      {"other.registry.io/ten-abc/sd", ""},
      {"registry.sv.internal.evil.io/ten-abc/sd", ""},
      {"ten-abc/sd", ""},  // Docker Hub.
      {"ubuntu:22.04", ""},
      {"registry.sv.internal", ""},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(ImageNamespaceTenant(c.image, reg), c.owner) << c.image;
  }
  EXPECT_EQ(ImageNamespaceTenant("localhost:5000/ten-x/a", "localhost"), "ten-x");
  EXPECT_EQ(ImageNamespaceTenant("localhost/ten-x/a", "registry.sv.internal"), "");

  EXPECT_TRUE(CheckImageIsUsable("registry.sv.internal/ten-abc/sd", reg, "ten-abc").ok());
  EXPECT_TRUE(CheckImageIsUsable("pytorch/pytorch:2.3", reg, "ten-abc").ok());
  const absl::Status other = CheckImageIsUsable("Registry.sv.internal:5000/ten-abc/sd", reg,
                                                "ten-xyz");
  EXPECT_EQ(other.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(ReasonOf(other), "IMAGE_NOT_YOURS");

  EXPECT_TRUE(IsRegistryHost("registry.sv.internal"));
  EXPECT_TRUE(IsRegistryHost("localhost"));
  EXPECT_TRUE(IsRegistryHost("10.0.0.5:5000"));
  EXPECT_FALSE(IsRegistryHost("registry"));
  EXPECT_FALSE(IsRegistryHost("Registry.io"));
  EXPECT_FALSE(IsRegistryHost(""));
  EXPECT_FALSE(IsRegistryHost("reg.io/x"));
}

TEST(ValidateNameTest, LowerCaseDnsLabelsOfAtMost63) {
  EXPECT_TRUE(ValidateName("name", "a").ok());
  EXPECT_TRUE(ValidateName("name", "train-run-7").ok());
  EXPECT_TRUE(ValidateName("name", std::string(63, 'a')).ok());
  EXPECT_FALSE(ValidateName("name", std::string(64, 'a')).ok());
  for (const char* bad : {"", "-a", "a-", "1abc", "A", "a_b", "a b", "ä"}) {
    EXPECT_EQ(ReasonOf(ValidateName("name", bad)), "INVALID_NAME") << bad;
  }
}

TEST(ValidateRequestIdTest, LimitsLengthAndAlphabet) {
  EXPECT_TRUE(ValidateRequestId("0b9e2c1e-5d6c-4d52-9f5c-1c6c0b3f8f11").ok());
  EXPECT_TRUE(ValidateRequestId(std::string(128, 'x')).ok());
  EXPECT_FALSE(ValidateRequestId(std::string(129, 'x')).ok());
  EXPECT_FALSE(ValidateRequestId("").ok());
  EXPECT_FALSE(ValidateRequestId("a b").ok());
  EXPECT_FALSE(ValidateRequestId("a/b").ok());
}

TEST(FingerprintTest, DiffersWhenAnyFieldDiffers) {
  store::InstanceSpec base{"n", 8, "RTX 4090", "img"};
  const std::string fp = InstanceFingerprint(base);
  EXPECT_EQ(fp, InstanceFingerprint(base));
  for (auto change : {+[](store::InstanceSpec& s) { s.name = "m"; },
                      +[](store::InstanceSpec& s) { s.gpu_count = 16; },
                      +[](store::InstanceSpec& s) { s.image = "other"; }}) {
    store::InstanceSpec other = base;
    change(other);
    EXPECT_NE(InstanceFingerprint(other), fp);
  }
}

TEST(PageTokenTest, RoundTripsAndRejectsForgeriesAndOtherFilters) {
  store::ListCursor cursor{1732900000123456, "ins-abcdefghijklmn"};
  std::string token = EncodePageToken(cursor, false);
  auto decoded = DecodePageToken(token, false);
  ASSERT_TRUE(decoded.ok());
  ASSERT_TRUE(decoded->has_value());
  EXPECT_EQ((*decoded)->created_at_micros, cursor.created_at_micros);
  EXPECT_EQ((*decoded)->id, cursor.id);
  EXPECT_FALSE(DecodePageToken(token, true).ok());  // Made for another filter.
  EXPECT_FALSE(DecodePageToken("!!!", false).ok());
  EXPECT_FALSE(DecodePageToken(std::string(300, 'a'), false).ok());
  auto empty = DecodePageToken("", false);
  ASSERT_TRUE(empty.ok());
  EXPECT_FALSE(empty->has_value());
}

TEST(PageSizeTest, DefaultsCapsAndRejectsNegative) {
  EXPECT_EQ(*NormalizePageSize(0), kPageSizeDefault);
  EXPECT_EQ(*NormalizePageSize(1), 1);
  EXPECT_EQ(*NormalizePageSize(kPageSizeMax), kPageSizeMax);
  EXPECT_EQ(*NormalizePageSize(kPageSizeMax + 1), kPageSizeMax);
  EXPECT_FALSE(NormalizePageSize(-1).ok());
}

TEST(TextTest, Utf8AndControlCharacters) {
  EXPECT_TRUE(IsValidUtf8(""));
  EXPECT_TRUE(IsValidUtf8("plain"));
  EXPECT_TRUE(IsValidUtf8("caf\xc3\xa9 \xe4\xb8\xad \xf0\x9f\x98\x80"));
  for (const std::string bad :
       {"\xff", "\xc3", "a\xc3", "\xe4\xb8", "\xc0\xaf" /* overlong */,
        "\xed\xa0\x80" /* surrogate */, "\xf4\x90\x80\x80" /* past U+10FFFF */,
        "\x80"}) {
    EXPECT_FALSE(IsValidUtf8(bad)) << bad.size();
  }
  EXPECT_TRUE(CheckFreeText("note", "two\nlines\tand a tab", "INVALID_NOTE", true).ok());
  EXPECT_FALSE(CheckFreeText("name", "two\nlines", "INVALID_KEY_NAME", false).ok());
  const absl::Status nul =
      CheckFreeText("note", std::string("cut\0here", 8), "INVALID_NOTE", true);
  EXPECT_EQ(nul.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReasonOf(nul), "INVALID_NOTE");
  EXPECT_FALSE(CheckFreeText("note", "bell\x07", "INVALID_NOTE", true).ok());
  EXPECT_FALSE(CheckFreeText("note", "del\x7f", "INVALID_NOTE", true).ok());
}

TEST(ApiKeyTest, GeneratedKeysParseBackAndOthersDoNot) {
  GeneratedKey key = NewApiKey();
  auto parsed = ParseApiKey(key.plaintext);
  ASSERT_TRUE(parsed.has_value());
  EXPECT_EQ(parsed->key_id, key.key_id);
  EXPECT_NE(NewApiKey().plaintext, key.plaintext);
  EXPECT_FALSE(ParseApiKey("").has_value());
  EXPECT_FALSE(ParseApiKey("sv_short_key").has_value());
  std::string upper = key.plaintext;
  upper[5] = 'A';
  EXPECT_FALSE(ParseApiKey(upper).has_value());
}

}  // namespace
}  // namespace sv::api
