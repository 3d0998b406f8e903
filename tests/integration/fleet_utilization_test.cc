// Fleet GPU utilization flushes on a real PostgreSQL: a flush key adds its
// sums once, however often it is sent (a flush whose commit was in doubt is
// sent again as it was), and a flush that failed is sent again before
// newer samples, so every sample is counted exactly once.
#include <gtest/gtest.h>


#include "common/clock.h"
#include "sla/fleet_utilization.h"
#include "store/database.h"
#include "store/utilization_store.h"
#include "tests/integration/harness.h"

namespace sv::testing {
namespace {

const absl::Time kHour = absl::FromUnixSeconds(1'793'613'600);  // 2026-11-02T10:00Z

class FleetUtilizationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    db_ = CreateMigratedDatabase(&url_);
    ASSERT_NE(db_, nullptr);
  }

  void Sql(const std::string& sql) { ExecSql(url_, sql); }

  store::UtilizationSum Stored(const std::string& node) {
    store::UtilizationStore store(*db_);
    auto by_node = store.ByNode(kHour - absl::Hours(1), kHour + absl::Hours(2));
    EXPECT_TRUE(by_node.ok()) << by_node.status();
    if (!by_node.ok() || !by_node->contains(node)) return {};
    return by_node->at(node);
  }

  std::string url_;
  std::unique_ptr<store::Database> db_;
};

// Goal: the same flush key adds nothing the second time; another key adds.
TEST_F(FleetUtilizationTest, AFlushKeyAddsOnce) {
  store::UtilizationStore store(*db_);
  const std::vector<store::NodeUtilizationDelta> deltas = {
      {"node-a", kHour, {900, 10}}, {"node-b", kHour, {0, 10}}};
  ASSERT_TRUE(store.Add("inc:1", deltas, kHour - absl::Hours(24), kHour).ok());
  ASSERT_TRUE(store.Add("inc:1", deltas, kHour - absl::Hours(24), kHour).ok());
  EXPECT_EQ(Stored("node-a").utilization_sum, 900);
  EXPECT_EQ(Stored("node-a").sample_count, 10);
  EXPECT_EQ(Stored("node-b").sample_count, 10);
  ASSERT_TRUE(store.Add("inc:2", {{"node-a", kHour, {100, 5}}}, kHour - absl::Hours(24), kHour)
                  .ok());
  EXPECT_EQ(Stored("node-a").utilization_sum, 1000);
  EXPECT_EQ(Stored("node-a").sample_count, 15);
}

// Goal: a flush that fails keeps its samples and is sent again before the
// samples that arrived after it; nothing is lost or counted twice.
TEST_F(FleetUtilizationTest, AFailedFlushIsSentAgainOnce) {
  FakeClock clock(kHour + absl::Minutes(5));
  sla::FleetUtilization fleet(*db_, clock);
  fleet.Add("node-a", kHour, 500, 10);
  ASSERT_TRUE(fleet.Flush().ok());
  fleet.Add("node-a", kHour, 300, 5);
  Sql("ALTER TABLE node_utilization_flushes RENAME TO flushes_away");
  EXPECT_FALSE(fleet.Flush().ok());
  fleet.Add("node-a", kHour, 70, 1);
  EXPECT_FALSE(fleet.Flush().ok());
  Sql("ALTER TABLE flushes_away RENAME TO node_utilization_flushes");
  ASSERT_TRUE(fleet.Flush().ok());  // the failed flush, then the newer sample
  ASSERT_TRUE(fleet.Flush().ok());  // nothing left
  EXPECT_EQ(Stored("node-a").utilization_sum, 870);
  EXPECT_EQ(Stored("node-a").sample_count, 16);
}

}  // namespace
}  // namespace sv::testing
