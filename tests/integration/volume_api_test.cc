// Cloud disks against a real svd with a simulated fleet: the simulated
// agents receive mounts in their assignments and confirm them, so an
// attachment becomes ATTACHED (or a detach completes) only on an agent's
// word. Each test states its goal; see docs/storage.md.

#include <gtest/gtest.h>

#include <functional>
#include <pqxx/pqxx>
#include <thread>

#include "api/errors.h"
#include "sv/v1/instance.grpc.pb.h"
#include "sv/v1/marketplace.grpc.pb.h"
#include "sv/v1/security.grpc.pb.h"
#include "sv/v1/volume.grpc.pb.h"
#include "tests/integration/harness.h"

namespace sv::testing {
namespace {

class VolumeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    options_ = SvdOptions{CreateTestDatabase(), 3, 1, {"--agent-heartbeat-interval-ms", "200"}};
    svd_ = std::make_unique<SvdProcess>(options_);
    ASSERT_TRUE(svd_->Start());
    token_ = CreateTenant(*svd_, "alpha");
    instances_ = v1::InstanceService::NewStub(svd_->channel());
    volumes_ = v1::VolumeService::NewStub(svd_->channel());
  }

  // An 8-GPU instance, RUNNING; returns it.
  v1::Instance RunInstance(const std::string& token) {
    v1::CreateInstanceRequest request;
    request.mutable_instance()->set_gpu_count(8);
    v1::Instance out;
    grpc::Status status = instances_->CreateInstance(Context(token).get(), request, &out);
    EXPECT_TRUE(status.ok()) << status.error_message();
    EXPECT_TRUE(WaitFor([&] { return Get(token, out.id()).state() == v1::RUNNING; }));
    return Get(token, out.id());
  }

  v1::Instance Get(const std::string& token, const std::string& id) {
    v1::GetInstanceRequest request;
    request.set_id(id);
    v1::Instance out;
    instances_->GetInstance(Context(token).get(), request, &out);
    return out;
  }

  v1::Volume CreateVolume(const std::string& name, bool read_many,
                          v1::VolumeKind kind = v1::NETWORK) {
    v1::CreateVolumeRequest request;
    request.mutable_volume()->set_name(name);
    request.mutable_volume()->set_size_gib(100);
    request.mutable_volume()->set_kind(kind);
    request.mutable_volume()->set_read_many(read_many);
    request.set_request_id("create-" + name);
    v1::Volume out;
    grpc::Status status = volumes_->CreateVolume(Context(token_).get(), request, &out);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return out;
  }

  v1::Volume GetVolume(const std::string& id) {
    v1::GetVolumeRequest request;
    request.set_id(id);
    v1::Volume out;
    volumes_->GetVolume(Context(token_).get(), request, &out);
    return out;
  }

  grpc::Status Attach(const std::string& volume, const std::string& instance, bool read_only,
                      v1::Volume* out, const std::string& token = "") {
    v1::AttachVolumeRequest request;
    request.set_volume_id(volume);
    request.set_instance_id(instance);
    request.set_read_only(read_only);
    return volumes_->AttachVolume(Context(token.empty() ? token_ : token).get(), request, out);
  }

  grpc::Status Detach(const std::string& volume, const std::string& instance, v1::Volume* out) {
    v1::DetachVolumeRequest request;
    request.set_volume_id(volume);
    request.set_instance_id(instance);
    return volumes_->DetachVolume(Context(token_).get(), request, out);
  }

  // The mounts the agent of the instance's node confirmed for it.
  int ConfirmedLibraryMounts(const std::string& instance) {
    pqxx::connection db(options_.database_url);
    pqxx::work txn(db);
    return txn.exec_params1("SELECT count(*) FROM instance_library_mounts WHERE "
                            "instance_id = $1 AND cardinality(mounted_nodes) > 0",
                            instance)[0].as<int>();
  }

  SvdOptions options_;
  std::unique_ptr<SvdProcess> svd_;
  std::string token_;
  std::unique_ptr<v1::InstanceService::Stub> instances_;
  std::unique_ptr<v1::VolumeService::Stub> volumes_;
};

// Goal: a volume attaches to and detaches from a RUNNING instance; it is
// ATTACHING until the node agent confirms the mount, then ATTACHED, and
// DETACHING until the agent confirms the unmount; the instance keeps
// running throughout.
TEST_F(VolumeTest, HotAttachAndDetachWhileRunning) {
  v1::Instance instance = RunInstance(token_);
  v1::Volume volume = CreateVolume("data", false);
  EXPECT_EQ(volume.state(), v1::AVAILABLE);
  v1::Volume out;
  ASSERT_TRUE(Attach(volume.id(), instance.id(), false, &out).ok());
  ASSERT_EQ(out.attachments_size(), 1);
  EXPECT_EQ(out.attachments(0).mount_path(), "/mnt/data");
  // Right after the call the agent cannot have confirmed yet in most runs;
  // either way, the volume becomes ATTACHED only with a confirm time.
  ASSERT_TRUE(WaitFor([&] { return GetVolume(volume.id()).state() == v1::ATTACHED; }));
  out = GetVolume(volume.id());
  EXPECT_TRUE(out.attachments(0).has_confirm_time());
  EXPECT_EQ(out.attachments(0).state(), v1::ATTACHMENT_ATTACHED);
  EXPECT_EQ(Get(token_, instance.id()).state(), v1::RUNNING);
  ASSERT_EQ(Get(token_, instance.id()).volume_ids_size(), 1);

  ASSERT_TRUE(Detach(volume.id(), instance.id(), &out).ok());
  EXPECT_EQ(out.state(), v1::DETACHING);
  ASSERT_TRUE(WaitFor([&] { return GetVolume(volume.id()).state() == v1::AVAILABLE; }));
  EXPECT_EQ(GetVolume(volume.id()).attachments_size(), 0);
  EXPECT_EQ(Get(token_, instance.id()).state(), v1::RUNNING);

  // Attaching again works, and a retry of the same attach is a no-op.
  ASSERT_TRUE(Attach(volume.id(), instance.id(), false, &out).ok());
  ASSERT_TRUE(Attach(volume.id(), instance.id(), false, &out).ok());
  EXPECT_EQ(out.attachments_size(), 1);
  ASSERT_TRUE(WaitFor([&] { return GetVolume(volume.id()).state() == v1::ATTACHED; }));
}

// Goal: one writer at a time: a second attach of a volume that is not
// read-many is refused with VOLUME_IN_USE; a read-many volume takes many
// readers but still only one writer.
TEST_F(VolumeTest, SecondAttachIsRefused) {
  v1::Instance a = RunInstance(token_);
  v1::Instance b = RunInstance(token_);
  v1::Volume single = CreateVolume("single", false);
  v1::Volume out;
  ASSERT_TRUE(Attach(single.id(), a.id(), false, &out).ok());
  grpc::Status second = Attach(single.id(), b.id(), false, &out);
  EXPECT_EQ(second.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(api::ReasonOf(second), "VOLUME_IN_USE");
  second = Attach(single.id(), b.id(), true, &out);
  EXPECT_EQ(api::ReasonOf(second), "VOLUME_IN_USE") << "a single-attach volume takes no reader";

  v1::Volume shared = CreateVolume("shared", true);
  ASSERT_TRUE(Attach(shared.id(), a.id(), false, &out).ok());  // The writer.
  ASSERT_TRUE(Attach(shared.id(), b.id(), true, &out).ok());   // A reader.
  v1::Instance c = RunInstance(token_);
  grpc::Status writer = Attach(shared.id(), c.id(), false, &out);
  EXPECT_EQ(api::ReasonOf(writer), "VOLUME_IN_USE");
  ASSERT_TRUE(Attach(shared.id(), c.id(), true, &out).ok());
  ASSERT_TRUE(WaitFor([&] {
    v1::Volume v = GetVolume(shared.id());
    for (const auto& at : v.attachments()) {
      if (at.state() != v1::ATTACHMENT_ATTACHED) return false;
    }
    return v.attachments_size() == 3;
  }));
  // The database refuses a second writer whatever the code does.
  pqxx::connection db(options_.database_url);
  pqxx::work txn(db);
  EXPECT_THROW(txn.exec_params("INSERT INTO volume_attachments (volume_id, instance_id, "
                               "tenant_id, read_only, mount_path, state, requested_at) "
                               "SELECT $1, $2, tenant_id, false, '/x', 'attached', now() "
                               "FROM volumes WHERE id = $1",
                               shared.id(), c.id()),
               pqxx::sql_error);
}

// Goal: a volume cannot be deleted while attached (FAILED_PRECONDITION /
// VOLUME_ATTACHED naming the instance); after the detach it can, and its
// billing stops there.
TEST_F(VolumeTest, DeleteWhileAttachedIsRefused) {
  v1::Instance a = RunInstance(token_);
  v1::Volume volume = CreateVolume("keep", false);
  v1::Volume out;
  ASSERT_TRUE(Attach(volume.id(), a.id(), false, &out).ok());
  v1::DeleteVolumeRequest del;
  del.set_id(volume.id());
  grpc::Status refused = volumes_->DeleteVolume(Context(token_).get(), del, &out);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(api::ReasonOf(refused), "VOLUME_ATTACHED");
  EXPECT_NE(refused.error_message().find(a.id()), std::string::npos) << refused.error_message();
  EXPECT_EQ(GetVolume(volume.id()).state() == v1::VOLUME_DELETED, false);

  ASSERT_TRUE(Detach(volume.id(), a.id(), &out).ok());
  // Still detaching: the agent has not confirmed yet, or just has.
  ASSERT_TRUE(WaitFor([&] { return GetVolume(volume.id()).state() == v1::AVAILABLE; }));
  ASSERT_TRUE(volumes_->DeleteVolume(Context(token_).get(), del, &out).ok());
  EXPECT_EQ(out.state(), v1::VOLUME_DELETED);
  // A deleted volume attaches nowhere.
  EXPECT_EQ(Attach(volume.id(), a.id(), false, &out).error_code(), grpc::StatusCode::NOT_FOUND);
}

// Goal: a volume moves from one running instance to another: it detaches
// from the first (confirmed by that agent) and only then attaches to the
// second, so two instances never mount it for writing.
TEST_F(VolumeTest, MoveBetweenRunningInstances) {
  v1::Instance a = RunInstance(token_);
  v1::Instance b = RunInstance(token_);
  v1::Volume volume = CreateVolume("work", false);
  v1::Volume out;
  ASSERT_TRUE(Attach(volume.id(), a.id(), false, &out).ok());
  ASSERT_TRUE(WaitFor([&] { return GetVolume(volume.id()).state() == v1::ATTACHED; }));

  v1::MoveVolumeRequest move;
  move.set_volume_id(volume.id());
  move.set_to_instance_id(b.id());
  ASSERT_TRUE(volumes_->MoveVolume(Context(token_).get(), move, &out).ok());
  // Never both at once.
  for (const auto& at : out.attachments()) {
    if (at.instance_id() == b.id()) {
      EXPECT_EQ(out.attachments_size(), 1);
    }
  }
  ASSERT_TRUE(WaitFor([&] {
    v1::Volume v = GetVolume(volume.id());
    return v.state() == v1::ATTACHED && v.attachments_size() == 1 &&
           v.attachments(0).instance_id() == b.id();
  }));
  EXPECT_TRUE(GetVolume(volume.id()).move_to_instance_id().empty());
  EXPECT_EQ(Get(token_, a.id()).volume_ids_size(), 0);
  ASSERT_EQ(Get(token_, b.id()).volume_ids_size(), 1);

  // Moving to a stopped instance is immediate (nothing to mount until it
  // starts), and the move back works the same.
  v1::StopInstanceRequest stop;
  stop.set_id(a.id());
  v1::Instance stopped;
  ASSERT_TRUE(instances_->StopInstance(Context(token_).get(), stop, &stopped).ok());
  move.set_to_instance_id(a.id());
  ASSERT_TRUE(volumes_->MoveVolume(Context(token_).get(), move, &out).ok());
  ASSERT_TRUE(WaitFor([&] {
    v1::Volume v = GetVolume(volume.id());
    return v.attachments_size() == 1 && v.attachments(0).instance_id() == a.id() &&
           v.attachments(0).state() == v1::ATTACHMENT_ATTACHED;
  }));
}

// Goal: node-local volumes stay on their node (attaching to an instance on
// another node is refused with VOLUME_NODE_MISMATCH); volumes are tenant
// scoped (another tenant gets NOT_FOUND); creates are idempotent by
// request_id.
TEST_F(VolumeTest, NodeLocalTenancyAndIdempotency) {
  v1::Instance a = RunInstance(token_);
  v1::Instance b = RunInstance(token_);
  ASSERT_NE(a.placement(0).node_id(), b.placement(0).node_id());
  v1::Volume local = CreateVolume("scratch", false, v1::NODE_LOCAL);
  v1::Volume out;
  ASSERT_TRUE(Attach(local.id(), a.id(), false, &out).ok());
  EXPECT_EQ(out.node_id(), a.placement(0).node_id());
  ASSERT_TRUE(WaitFor([&] { return GetVolume(local.id()).state() == v1::ATTACHED; }));
  // A node-local volume keeps its instance on one node: growing it into a
  // gang is refused, though a third node is free, and it keeps running.
  v1::ResizeInstanceRequest grow;
  grow.set_id(a.id());
  grow.set_gpu_count(16);
  v1::ResizeInstanceResponse grown;
  grpc::Status refused = instances_->ResizeInstance(Context(token_).get(), grow, &grown);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(api::ReasonOf(refused), "VOLUME_NODE_MISMATCH");
  EXPECT_NE(refused.error_message().find(local.id()), std::string::npos)
      << refused.error_message();
  EXPECT_EQ(Get(token_, a.id()).gpu_count(), 8);
  EXPECT_EQ(Get(token_, a.id()).state(), v1::RUNNING);
  ASSERT_TRUE(Detach(local.id(), a.id(), &out).ok());
  ASSERT_TRUE(WaitFor([&] { return GetVolume(local.id()).state() == v1::AVAILABLE; }));
  grpc::Status elsewhere = Attach(local.id(), b.id(), false, &out);
  EXPECT_EQ(elsewhere.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(api::ReasonOf(elsewhere), "VOLUME_NODE_MISMATCH");
  EXPECT_NE(elsewhere.error_message().find(a.placement(0).node_id()), std::string::npos);

  // Network volumes attach anywhere.
  v1::Volume net = CreateVolume("net", false);
  ASSERT_TRUE(Attach(net.id(), b.id(), false, &out).ok());

  // Idempotent create; the same id with other content is refused.
  v1::Volume again = CreateVolume("net", false);
  EXPECT_EQ(again.id(), net.id());
  v1::CreateVolumeRequest clash;
  clash.mutable_volume()->set_name("net");
  clash.mutable_volume()->set_size_gib(5);
  clash.set_request_id("create-net");
  EXPECT_EQ(volumes_->CreateVolume(Context(token_).get(), clash, &out).error_code(),
            grpc::StatusCode::ALREADY_EXISTS);
  v1::CreateVolumeRequest bad;
  bad.mutable_volume()->set_size_gib(0);
  EXPECT_EQ(volumes_->CreateVolume(Context(token_).get(), bad, &out).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);

  // Another tenant sees nothing and cannot attach to or from it.
  const std::string other = CreateTenant(*svd_, "beta");
  v1::GetVolumeRequest get;
  get.set_id(net.id());
  EXPECT_EQ(volumes_->GetVolume(Context(other).get(), get, &out).error_code(),
            grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(Attach(net.id(), a.id(), false, &out, other).error_code(),
            grpc::StatusCode::NOT_FOUND);
  v1::ListVolumesRequest list;
  v1::ListVolumesResponse listed;
  ASSERT_TRUE(volumes_->ListVolumes(Context(other).get(), list, &listed).ok());
  EXPECT_EQ(listed.volumes_size(), 0);
  ASSERT_TRUE(volumes_->ListVolumes(Context(token_).get(), list, &listed).ok());
  EXPECT_EQ(listed.volumes_size(), 2);
}

// Goal: an instance with a node-local volume starts only on that volume's
// node. Stopped, it waits while that node is full (even with another node
// free), with a reason naming the volume's node; it runs there once that
// node frees, and the agent confirms the mount. A second node-local volume
// on another node cannot join it.
TEST_F(VolumeTest, NodeLocalVolumeSteersTheStartToItsNode) {
  v1::Instance a = RunInstance(token_);
  const std::string home = a.placement(0).node_id();
  v1::Volume local = CreateVolume("data", false, v1::NODE_LOCAL);
  v1::Volume out;
  ASSERT_TRUE(Attach(local.id(), a.id(), false, &out).ok());
  ASSERT_TRUE(WaitFor([&] { return GetVolume(local.id()).state() == v1::ATTACHED; }));
  v1::StopInstanceRequest stop;
  stop.set_id(a.id());
  v1::Instance ignored;
  ASSERT_TRUE(instances_->StopInstance(Context(token_).get(), stop, &ignored).ok());

  // Fill the three nodes; note which instance sits on the volume's node.
  std::string on_home, elsewhere;
  for (int i = 0; i < 3; ++i) {
    v1::Instance x = RunInstance(token_);
    (x.placement(0).node_id() == home ? on_home : elsewhere) = x.id();
  }
  ASSERT_FALSE(on_home.empty());
  ASSERT_FALSE(elsewhere.empty());

  v1::StartInstanceRequest start;
  start.set_id(a.id());
  ASSERT_TRUE(instances_->StartInstance(Context(token_).get(), start, &ignored).ok());
  v1::DeleteInstanceRequest del;
  del.set_id(elsewhere);
  ASSERT_TRUE(instances_->DeleteInstance(Context(token_).get(), del, &ignored).ok());
  // Another node is free now; the instance still waits for its own.
  ASSERT_TRUE(WaitFor([&] {
    return Get(token_, a.id()).state_reason().find("node-local") != std::string::npos;
  })) << Get(token_, a.id()).state_reason();
  std::this_thread::sleep_for(std::chrono::seconds(1));
  v1::Instance waiting = Get(token_, a.id());
  EXPECT_EQ(waiting.state(), v1::PENDING) << waiting.state_reason();
  EXPECT_NE(waiting.state_reason().find("node-local"), std::string::npos)
      << waiting.state_reason();

  del.set_id(on_home);
  ASSERT_TRUE(instances_->DeleteInstance(Context(token_).get(), del, &ignored).ok());
  ASSERT_TRUE(WaitFor([&] { return Get(token_, a.id()).state() == v1::RUNNING; }));
  ASSERT_EQ(Get(token_, a.id()).placement_size(), 1);
  EXPECT_EQ(Get(token_, a.id()).placement(0).node_id(), home);
  ASSERT_TRUE(WaitFor([&] {
    v1::Volume v = GetVolume(local.id());
    return v.state() == v1::ATTACHED && v.attachments_size() == 1 &&
           v.attachments(0).state() == v1::ATTACHMENT_ATTACHED;
  }));

  // A node-local volume bound to another node cannot join the stopped
  // instance: it would have two homes.
  v1::Instance other = RunInstance(token_);
  ASSERT_NE(other.placement(0).node_id(), home);
  v1::Volume second = CreateVolume("data2", false, v1::NODE_LOCAL);
  ASSERT_TRUE(Attach(second.id(), other.id(), false, &out).ok());
  ASSERT_TRUE(Detach(second.id(), other.id(), &out).ok());
  ASSERT_TRUE(WaitFor([&] { return GetVolume(second.id()).state() == v1::AVAILABLE; }));
  ASSERT_TRUE(instances_->StopInstance(Context(token_).get(), stop, &ignored).ok());
  grpc::Status two_homes = Attach(second.id(), a.id(), false, &out);
  EXPECT_EQ(two_homes.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(api::ReasonOf(two_homes), "VOLUME_NODE_MISMATCH");
  EXPECT_NE(two_homes.error_message().find(local.id()), std::string::npos)
      << two_homes.error_message();
}

// Goal: `create --mount llama-2-70b` mounts a public library item
// read-only at /public/llama-2-70b: the agent receives it and confirms it;
// an unknown name is INVALID_ARGUMENT with a reason and creates nothing.
TEST_F(VolumeTest, PublicLibraryMount) {
  auto admin = v1::LibraryAdminService::NewStub(svd_->channel());
  v1::CreateLibraryItemRequest add;
  add.mutable_item()->set_name("llama-2-70b");
  add.mutable_item()->set_kind(v1::MODEL);
  add.mutable_item()->set_size_bytes(int64_t{140} << 30);
  add.mutable_item()->set_source("hf://meta-llama/Llama-2-70b-hf");
  v1::LibraryItem item;
  ASSERT_TRUE(admin->CreateLibraryItem(Context(svd_->admin_key()).get(), add, &item).ok());
  // Tenants may not manage the library.
  EXPECT_EQ(admin->CreateLibraryItem(Context(token_).get(), add, &item).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  auto library = v1::LibraryService::NewStub(svd_->channel());
  v1::ListLibraryItemsResponse items;
  ASSERT_TRUE(library->ListLibraryItems(Context(token_).get(), {}, &items).ok());
  ASSERT_EQ(items.items_size(), 1);

  v1::CreateInstanceRequest request;
  request.mutable_instance()->set_gpu_count(8);
  request.mutable_instance()->add_library_mounts("llama-2-70b");
  v1::Instance created;
  ASSERT_TRUE(instances_->CreateInstance(Context(token_).get(), request, &created).ok());
  ASSERT_EQ(created.library_mounts_size(), 1);
  ASSERT_TRUE(WaitFor([&] { return ConfirmedLibraryMounts(created.id()) == 1; }));

  v1::CreateInstanceRequest unknown;
  unknown.mutable_instance()->set_gpu_count(1);
  unknown.mutable_instance()->add_library_mounts("no-such-model");
  grpc::Status status = instances_->CreateInstance(Context(token_).get(), unknown, &created);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(api::ReasonOf(status), "UNKNOWN_LIBRARY_ITEM");
  v1::ListInstancesResponse all;
  ASSERT_TRUE(instances_->ListInstances(Context(token_).get(), {}, &all).ok());
  EXPECT_EQ(all.instances_size(), 1) << "a refused create leaves nothing behind";
}

// Goal: a volume is charged for as long as it lives, paid or not, so it is
// created only if the tenant's credit covers its first minutes, as an
// instance is (svd's default gate, 10 minutes); a retry of a create that
// was made is answered with its volume whatever the wallet holds now. A
// spend cap that is reached refuses it too.
// (Until 2026-12-04 a tenant without any credit could keep up to 1,000
// volumes of 64 TiB, stored unpaid.)
TEST(VolumeCreditTest, CreateNeedsCreditForItsFirstMinutes) {
  SvdOptions options{CreateTestDatabase(), 1, 1, {}};
  options.billing_create_credit_minutes = 10;
  SvdProcess svd(options);
  ASSERT_TRUE(svd.Start());
  const std::string token = CreateTenant(svd, "thrifty");
  auto volumes = v1::VolumeService::NewStub(svd.channel());
  pqxx::connection sql(options.database_url);
  auto set_price = [&](int64_t per_gib_hour) {
    pqxx::work txn(sql);
    txn.exec_params("INSERT INTO price_book (item_kind, item, unit_price_micros, "
                    "effective_from, created_at) VALUES ('storage_gib_hour', 'network', $1, "
                    "clock_timestamp(), clock_timestamp())",
                    per_gib_hour);
    txn.commit();
  };
  auto create = [&](const std::string& request_id, int size_gib, v1::Volume* out) {
    v1::CreateVolumeRequest request;
    request.mutable_volume()->set_size_gib(size_gib);
    request.set_request_id(request_id);
    return volumes->CreateVolume(Context(token).get(), request, out);
  };
  // At 60,000 micro-yuan per GiB-hour, 10 minutes of 100 GiB cost 1 CNY
  // and of 900 GiB 9 CNY. The gate counts the tenant's live volumes too
  // (else volume after volume passed on the same credit): the trial's
  // 10 CNY covers both, exactly, and not one GiB more.
  set_price(60'000);
  v1::Volume small, big, out;
  ASSERT_TRUE(create("small", 100, &small).ok());
  grpc::Status status = create("big", 900, &big);
  ASSERT_TRUE(status.ok()) << status.error_message();
  status = create("bigger", 1, &out);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(api::ReasonOf(status), "INSUFFICIENT_CREDIT");
  EXPECT_NE(status.error_message().find("cost 10.01 CNY but only 10.00 CNY"), std::string::npos)
      << status.error_message();
  // The instance create's gate counts the storage as well (migration
  // 0120): the volumes take the whole trial, so not even one GPU passes.
  {
    auto instances = v1::InstanceService::NewStub(svd.channel());
    v1::CreateInstanceRequest request;
    request.mutable_instance()->set_gpu_count(1);
    request.set_request_id("one-gpu");
    v1::Instance instance;
    status = instances->CreateInstance(Context(token).get(), request, &instance);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_EQ(api::ReasonOf(status), "INSUFFICIENT_CREDIT") << status.error_message();
  }
  // Just over ten times the price (10 minutes of 100 GiB now cost more
  // than the trial's 10 CNY): the retry still gets its volume.
  set_price(600'001);
  status = create("small", 100, &out);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(out.id(), small.id());
  EXPECT_EQ(api::ReasonOf(create("small-2", 100, &out)), "INSUFFICIENT_CREDIT");
  // A spend cap reached this month refuses volumes as it refuses
  // instances (a cap of 0 is reached at once).
  set_price(400);
  auto budgets = v1::BudgetService::NewStub(svd.channel());
  v1::SetSpendCapRequest cap;
  cap.mutable_cap()->set_enabled(true);
  cap.mutable_cap()->set_monthly_cap_micros(0);
  v1::SpendCap set;
  ASSERT_TRUE(budgets->SetSpendCap(Context(token).get(), cap, &set).ok());
  status = create("capped", 100, &out);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(api::ReasonOf(status), "SPEND_CAP_REACHED") << status.error_message();
  v1::ListVolumesResponse listed;
  ASSERT_TRUE(volumes->ListVolumes(Context(token).get(), {}, &listed).ok());
  EXPECT_EQ(listed.volumes_size(), 2) << "a refused create writes nothing";

  // A volume whose storage goes unpaid shows since when, and when svd
  // deletes it unless storage is paid (the default grace: 7 days).
  const int64_t since_minute = 29'000'000;
  {
    pqxx::work txn(sql);
    txn.exec_params("UPDATE volumes SET unpaid_since_minute = $1 WHERE id = $2", since_minute,
                    small.id());
    txn.commit();
  }
  v1::GetVolumeRequest get;
  get.set_id(small.id());
  ASSERT_TRUE(volumes->GetVolume(Context(token).get(), get, &out).ok());
  EXPECT_EQ(out.unpaid_since_time().seconds(), since_minute * 60);
  EXPECT_EQ(out.unpaid_delete_time().seconds(), since_minute * 60 + 7 * 86400);
  get.set_id(big.id());
  ASSERT_TRUE(volumes->GetVolume(Context(token).get(), get, &out).ok());
  EXPECT_FALSE(out.has_unpaid_since_time());
  EXPECT_FALSE(out.has_unpaid_delete_time());
}

}  // namespace
}  // namespace sv::testing
