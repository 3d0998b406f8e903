#include "common/ids.h"

#include <gtest/gtest.h>

#include <set>

namespace sv {
namespace {

TEST(IdsTest, IdsHavePrefixLengthAndDoNotRepeat) {
  std::set<std::string> seen;
  for (int i = 0; i < 1000; ++i) {
    std::string id = NewId("ins");
    ASSERT_EQ(id.size(), 4u + 14u);
    ASSERT_EQ(id.rfind("ins-", 0), 0u);
    ASSERT_TRUE(seen.insert(id).second);
  }
}

TEST(IdsTest, UuidIsVersionFour) {
  std::string u = NewUuid();
  ASSERT_EQ(u.size(), 36u);
  EXPECT_EQ(u[14], '4');
  EXPECT_NE(std::string("89ab").find(u[19]), std::string::npos);
}

TEST(IdsTest, Sha256MatchesKnownVector) {
  EXPECT_EQ(Sha256Hex("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_TRUE(ConstantTimeEquals("same", "same"));
  EXPECT_FALSE(ConstantTimeEquals("same", "sane"));
  EXPECT_FALSE(ConstantTimeEquals("same", "same!"));
}

}  // namespace
}  // namespace sv
