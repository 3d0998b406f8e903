// The authorization table: every RPC of proto/sv/v1 and the permission it
// needs. ONE line per method; api_authz_test checks this table against the
// generated service descriptors in both directions. See docs/security.md.
#include "api/authz.h"

namespace sv::api {
namespace {
using P = Permission;
constexpr Access R = Access::kRead;
constexpr Access W = Access::kWrite;
}  // namespace

const std::vector<MethodRule>& MethodRules() {
  static const auto* const kMethodRules = new std::vector<MethodRule>{
      // account.proto
      {"/sv.v1.AccountService/GetCurrentAccount", P::kAccountRead, R},
      // instance.proto
      {"/sv.v1.InstanceService/CreateInstance", P::kInstancesWrite, W},
      {"/sv.v1.InstanceService/GetInstance", P::kInstancesRead, R},
      {"/sv.v1.InstanceService/ListInstances", P::kInstancesRead, R},
      {"/sv.v1.InstanceService/DeleteInstance", P::kInstancesWrite, W},
      {"/sv.v1.InstanceService/ResizeInstance", P::kInstancesWrite, W},
      {"/sv.v1.InstanceService/StopInstance", P::kInstancesWrite, W},
      {"/sv.v1.InstanceService/StartInstance", P::kInstancesWrite, W},
      {"/sv.v1.InstanceService/ListInstanceEvents", P::kInstancesRead, R},
      {"/sv.v1.InstanceService/SetIdlePolicy", P::kInstancesWrite, W},
      {"/sv.v1.InstanceService/SetInstanceMovable", P::kInstancesWrite, W},
      // billing.proto
      {"/sv.v1.BillingService/GetBalance", P::kBillingRead, R},
      {"/sv.v1.BillingService/ListTransfers", P::kBillingRead, R},
      {"/sv.v1.BillingService/GetUsage", P::kBillingRead, R},
      {"/sv.v1.BillingService/ListInvoices", P::kBillingRead, R},
      {"/sv.v1.BillingService/GetInvoice", P::kBillingRead, R},
      // Whoever may create instances may read what they cost.
      {"/sv.v1.BillingService/ListPrices", P::kInstancesRead, R},
      {"/sv.v1.BillingAdminService/GetRevenueSummary", P::kAdminBilling, R},
      {"/sv.v1.BillingAdminService/ListTenantBalances", P::kAdminBilling, R},
      {"/sv.v1.BillingAdminService/TopUp", P::kAdminBilling, W},
      {"/sv.v1.BillingAdminService/IssueCredit", P::kAdminBilling, W},
      {"/sv.v1.BillingAdminService/RequestCredit", P::kAdminBilling, W},
      {"/sv.v1.BillingAdminService/ApproveCredit", P::kAdminBilling, W},
      {"/sv.v1.BillingAdminService/RejectCredit", P::kAdminBilling, W},
      {"/sv.v1.BillingAdminService/ListCreditRequests", P::kAdminBilling, R},
      {"/sv.v1.BillingAdminService/RefundTopUp", P::kAdminBilling, W},
      {"/sv.v1.BillingAdminService/SetBillingMode", P::kAdminBilling, W},
      {"/sv.v1.BillingAdminService/SetGpuPrice", P::kAdminBilling, W},
      {"/sv.v1.BillingAdminService/SetStoragePrice", P::kAdminBilling, W},
      {"/sv.v1.BillingAdminService/RunAudit", P::kAdminBilling, R},
      {"/sv.v1.BillingAdminService/ListAllInvoices", P::kAdminBilling, R},
      // dashboard.proto (the /admin billing dashboard; read-only)
      {"/sv.v1.DashboardAdminService/GetRevenueSeries", P::kAdminBilling, R},
      {"/sv.v1.DashboardAdminService/GetSlaRefundsByMetric", P::kAdminBilling, R},
      {"/sv.v1.DashboardAdminService/GetFleetUtilization", P::kAdminBilling, R},
      {"/sv.v1.DashboardAdminService/ListTrialGrants", P::kAdminBilling, R},
      {"/sv.v1.DashboardAdminService/ListTopUps", P::kAdminBilling, R},
      // admin.proto
      {"/sv.v1.AdminService/CreateTenant", P::kAdminTenants, W},
      {"/sv.v1.AdminService/GetTenant", P::kAdminTenants, R},
      {"/sv.v1.AdminService/SuspendTenant", P::kAdminTenants, W},
      {"/sv.v1.AdminService/ResumeTenant", P::kAdminTenants, W},
      {"/sv.v1.AdminService/AddOperator", P::kAdminOperators, W},
      {"/sv.v1.AdminService/ListOperators", P::kAdminOperators, R},
      {"/sv.v1.AdminService/RemoveOperator", P::kAdminOperators, W},
      {"/sv.v1.SchedulerAdminService/ListNodes", P::kAdminFleet, R},
      {"/sv.v1.SchedulerAdminService/CordonNode", P::kAdminFleet, W},
      {"/sv.v1.SchedulerAdminService/UncordonNode", P::kAdminFleet, W},
      {"/sv.v1.SchedulerAdminService/DrainNode", P::kAdminFleet, W},
      {"/sv.v1.SchedulerAdminService/ForgetNodeMounts", P::kAdminFleet, W},
      {"/sv.v1.SchedulerAdminService/SetTenantQuota", P::kAdminQuotas, W},
      {"/sv.v1.SchedulerAdminService/GetTenantQuota", P::kAdminQuotas, R},
      {"/sv.v1.SchedulerAdminService/SetInstancePriority", P::kAdminQuotas, W},
      {"/sv.v1.SchedulerAdminService/ListFleetInstances", P::kAdminFleet, R},
      // volume.proto
      {"/sv.v1.VolumeService/CreateVolume", P::kInstancesWrite, W},
      {"/sv.v1.VolumeService/GetVolume", P::kInstancesRead, R},
      {"/sv.v1.VolumeService/ListVolumes", P::kInstancesRead, R},
      {"/sv.v1.VolumeService/DeleteVolume", P::kInstancesWrite, W},
      {"/sv.v1.VolumeService/AttachVolume", P::kInstancesWrite, W},
      {"/sv.v1.VolumeService/DetachVolume", P::kInstancesWrite, W},
      {"/sv.v1.VolumeService/MoveVolume", P::kInstancesWrite, W},
      // marketplace.proto
      {"/sv.v1.LibraryService/ListLibraryItems", P::kInstancesRead, R},
      {"/sv.v1.LibraryService/GetLibraryItem", P::kInstancesRead, R},
      {"/sv.v1.LibraryAdminService/CreateLibraryItem", P::kAdminFleet, W},
      {"/sv.v1.LibraryAdminService/DeleteLibraryItem", P::kAdminFleet, W},
      {"/sv.v1.MarketplaceService/RegisterImage", P::kInstancesWrite, W},
      {"/sv.v1.MarketplaceService/ListImages", P::kInstancesRead, R},
      {"/sv.v1.MarketplaceService/GetImage", P::kInstancesRead, R},
      {"/sv.v1.MarketplaceService/DelistImage", P::kInstancesWrite, W},
      {"/sv.v1.MarketplaceService/LaunchApp", P::kInstancesWrite, W},
      {"/sv.v1.MarketplaceService/GetPublisherEarnings", P::kBillingRead, R},
      {"/sv.v1.MarketplaceService/ListPayouts", P::kBillingRead, R},
      {"/sv.v1.MarketplaceAdminService/RecordPayout", P::kAdminBilling, W},
      // security.proto
      {"/sv.v1.ApiKeyService/CreateApiKey", P::kKeysWrite, W},
      {"/sv.v1.ApiKeyService/ListApiKeys", P::kKeysRead, R},
      {"/sv.v1.ApiKeyService/RevokeApiKey", P::kKeysWrite, W},
      {"/sv.v1.ApiKeyService/RotateApiKey", P::kKeysWrite, W},
      {"/sv.v1.UserService/ListUsers", P::kUsersRead, R},
      {"/sv.v1.UserService/AddUser", P::kUsersWrite, W},
      {"/sv.v1.UserService/SetUserRole", P::kUsersWrite, W},
      {"/sv.v1.UserService/RemoveUser", P::kUsersWrite, W},
      {"/sv.v1.AuditService/ListAuditEntries", P::kAuditRead, R},
      {"/sv.v1.BudgetService/GetSpendCap", P::kTenantRead, R},
      {"/sv.v1.BudgetService/SetSpendCap", P::kBudgetWrite, W},
      {"/sv.v1.SshKeyService/AddSshKey", P::kInstancesWrite, W},
      {"/sv.v1.SshKeyService/ListSshKeys", P::kInstancesRead, R},
      {"/sv.v1.SshKeyService/DeleteSshKey", P::kInstancesWrite, W},
      // webhook.proto
      {"/sv.v1.WebhookService/SetWebhook", P::kWebhooksWrite, W},
      {"/sv.v1.WebhookService/GetWebhook", P::kTenantRead, R},
      {"/sv.v1.WebhookService/DeleteWebhook", P::kWebhooksWrite, W},
      // A ping sends a signed request from svd: as much as setting it.
      {"/sv.v1.WebhookService/TestWebhook", P::kWebhooksWrite, W},
      // agent.proto
      {"/sv.v1.AgentService/Connect", P::kNodeAgent, R},
      {"/sv.v1.NodeCredentialService/CreateNodeCredential", P::kAdminFleet, W},
      {"/sv.v1.NodeCredentialService/RevokeNodeCredential", P::kAdminFleet, W},
      // sla.proto
      {"/sv.v1.SlaTelemetryService/StreamTelemetry", P::kNodeAgent, R},
      {"/sv.v1.SlaService/ListSlaWindows", P::kInstancesRead, R},
      {"/sv.v1.SlaService/GetSlaWindow", P::kInstancesRead, R},
      {"/sv.v1.SlaAdminService/GetSlaReport", P::kAdminBilling, R},
      {"/sv.v1.SlaAdminService/SetSlaOverrides", P::kAdminBilling, W},
      {"/sv.v1.SlaAdminService/GetSlaDefinitions", P::kAdminBilling, R},
      // dev_clock.proto (served only with svd --fake-clock-start)
      {"/sv.v1.DevClockService/AdvanceClock", P::kAdminFleet, W},
      {"/sv.v1.DevClockService/GetClock", P::kAdminFleet, R},
  };
  return *kMethodRules;
}

}  // namespace sv::api
