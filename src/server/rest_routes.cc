// The REST routes of svd's public API, one line each (docs/rest.md).
// A new public RPC needs a line here; tests/unit/server/rest_routes_test.cc
// fails for any method of proto/sv/v1 that has none.
#include "server/rest_gateway.h"

namespace sv::server {

const std::vector<RestRoute>& RestRoutes() {
  static const std::vector<RestRoute> kRoutes = {
      // Instances.
      {"POST", "/v1/instances", "sv.v1.InstanceService.CreateInstance", "*"},
      {"GET", "/v1/instances", "sv.v1.InstanceService.ListInstances", ""},
      {"GET", "/v1/instances/{id}", "sv.v1.InstanceService.GetInstance", ""},
      {"DELETE", "/v1/instances/{id}", "sv.v1.InstanceService.DeleteInstance", ""},
      {"POST", "/v1/instances/{id}:resize", "sv.v1.InstanceService.ResizeInstance", "*"},
      {"POST", "/v1/instances/{id}:stop", "sv.v1.InstanceService.StopInstance", "*"},
      {"POST", "/v1/instances/{id}:start", "sv.v1.InstanceService.StartInstance", "*"},
      {"GET", "/v1/instances/{id}/events", "sv.v1.InstanceService.ListInstanceEvents", ""},
      {"POST", "/v1/instances/{id}:setIdlePolicy", "sv.v1.InstanceService.SetIdlePolicy", "*"},
      {"POST", "/v1/instances/{id}:setMovable", "sv.v1.InstanceService.SetInstanceMovable",
       "*"},
      // The caller.
      {"GET", "/v1/account", "sv.v1.AccountService.GetCurrentAccount", ""},
      // Keys, users, audit and the spend cap (docs/security.md).
      {"POST", "/v1/apiKeys", "sv.v1.ApiKeyService.CreateApiKey", "*"},
      {"GET", "/v1/apiKeys", "sv.v1.ApiKeyService.ListApiKeys", ""},
      {"POST", "/v1/apiKeys/{id}:revoke", "sv.v1.ApiKeyService.RevokeApiKey", "*"},
      {"POST", "/v1/apiKeys/{id}:rotate", "sv.v1.ApiKeyService.RotateApiKey", "*"},
      {"GET", "/v1/users", "sv.v1.UserService.ListUsers", ""},
      {"POST", "/v1/users", "sv.v1.UserService.AddUser", "*"},
      {"POST", "/v1/users/{user_id}:setRole", "sv.v1.UserService.SetUserRole", "*"},
      {"DELETE", "/v1/users/{user_id}", "sv.v1.UserService.RemoveUser", ""},
      {"GET", "/v1/auditEntries", "sv.v1.AuditService.ListAuditEntries", ""},
      {"GET", "/v1/spendCap", "sv.v1.BudgetService.GetSpendCap", ""},
      {"PUT", "/v1/spendCap", "sv.v1.BudgetService.SetSpendCap", "*"},
      {"POST", "/v1/sshKeys", "sv.v1.SshKeyService.AddSshKey", "*"},
      {"GET", "/v1/sshKeys", "sv.v1.SshKeyService.ListSshKeys", ""},
      {"DELETE", "/v1/sshKeys/{id}", "sv.v1.SshKeyService.DeleteSshKey", ""},
      {"PUT", "/v1/webhook", "sv.v1.WebhookService.SetWebhook", "*"},
      {"GET", "/v1/webhook", "sv.v1.WebhookService.GetWebhook", ""},
      {"DELETE", "/v1/webhook", "sv.v1.WebhookService.DeleteWebhook", ""},
      {"POST", "/v1/webhook:test", "sv.v1.WebhookService.TestWebhook", "*"},
      // Money.
      {"GET", "/v1/balance", "sv.v1.BillingService.GetBalance", ""},
      {"GET", "/v1/transfers", "sv.v1.BillingService.ListTransfers", ""},
      {"GET", "/v1/usage", "sv.v1.BillingService.GetUsage", ""},
      {"GET", "/v1/prices", "sv.v1.BillingService.ListPrices", ""},
      {"GET", "/v1/invoices", "sv.v1.BillingService.ListInvoices", ""},
      {"GET", "/v1/invoices/{id}", "sv.v1.BillingService.GetInvoice", ""},
      // Operators: tenants and scheduling.
      {"POST", "/v1/admin/tenants", "sv.v1.AdminService.CreateTenant", "*"},
      {"GET", "/v1/admin/tenants/{tenant_id}", "sv.v1.AdminService.GetTenant", ""},
      {"POST", "/v1/admin/tenants/{tenant_id}:suspend", "sv.v1.AdminService.SuspendTenant", "*"},
      {"POST", "/v1/admin/tenants/{tenant_id}:resume", "sv.v1.AdminService.ResumeTenant", "*"},
      {"GET", "/v1/admin/operators", "sv.v1.AdminService.ListOperators", ""},
      {"POST", "/v1/admin/operators", "sv.v1.AdminService.AddOperator", "*"},
      {"POST", "/v1/admin/operators/{user_id}:remove", "sv.v1.AdminService.RemoveOperator", "*"},
      {"GET", "/v1/admin/nodes", "sv.v1.SchedulerAdminService.ListNodes", ""},
      {"GET", "/v1/admin/instances", "sv.v1.SchedulerAdminService.ListFleetInstances", ""},
      {"POST", "/v1/admin/nodes/{name}:cordon", "sv.v1.SchedulerAdminService.CordonNode", "*"},
      {"POST", "/v1/admin/nodes/{name}:uncordon", "sv.v1.SchedulerAdminService.UncordonNode", "*"},
      {"POST", "/v1/admin/nodes/{name}:drain", "sv.v1.SchedulerAdminService.DrainNode", "*"},
      {"POST", "/v1/admin/nodes/{name}:forgetMounts", "sv.v1.SchedulerAdminService.ForgetNodeMounts",
       "*"},
      {"PUT", "/v1/admin/tenants/{quota.tenant_id}/quota",
       "sv.v1.SchedulerAdminService.SetTenantQuota", "quota"},
      {"GET", "/v1/admin/tenants/{tenant_id}/quota", "sv.v1.SchedulerAdminService.GetTenantQuota",
       ""},
      {"POST", "/v1/admin/instances/{instance_id}:setPriority",
       "sv.v1.SchedulerAdminService.SetInstancePriority", "*"},
      // Operators: money.
      {"GET", "/v1/admin/revenue", "sv.v1.BillingAdminService.GetRevenueSummary", ""},
      {"GET", "/v1/admin/balances", "sv.v1.BillingAdminService.ListTenantBalances", ""},
      {"POST", "/v1/admin/tenants/{tenant_id}/topups", "sv.v1.BillingAdminService.TopUp", "*"},
      {"POST", "/v1/admin/tenants/{tenant_id}/topups/{payment_id}/refund",
       "sv.v1.BillingAdminService.RefundTopUp", "*"},
      {"POST", "/v1/admin/tenants/{tenant_id}/credits", "sv.v1.BillingAdminService.IssueCredit",
       "*"},
      {"POST", "/v1/admin/tenants/{tenant_id}/creditRequests",
       "sv.v1.BillingAdminService.RequestCredit", "*"},
      {"GET", "/v1/admin/creditRequests", "sv.v1.BillingAdminService.ListCreditRequests", ""},
      {"POST", "/v1/admin/creditRequests/{credit_id}:approve",
       "sv.v1.BillingAdminService.ApproveCredit", "*"},
      {"POST", "/v1/admin/creditRequests/{credit_id}:reject",
       "sv.v1.BillingAdminService.RejectCredit", "*"},
      {"PUT", "/v1/admin/tenants/{tenant_id}/billingMode",
       "sv.v1.BillingAdminService.SetBillingMode", "*"},
      {"POST", "/v1/admin/prices", "sv.v1.BillingAdminService.SetGpuPrice", "*"},
      {"POST", "/v1/admin/storagePrices", "sv.v1.BillingAdminService.SetStoragePrice", "*"},
      {"POST", "/v1/admin/audit", "sv.v1.BillingAdminService.RunAudit", "*"},
      {"GET", "/v1/admin/invoices", "sv.v1.BillingAdminService.ListAllInvoices", ""},
      // SLA windows and their evidence.
      {"GET", "/v1/sla/windows", "sv.v1.SlaService.ListSlaWindows", ""},
      {"GET", "/v1/sla/window", "sv.v1.SlaService.GetSlaWindow", ""},
      {"GET", "/v1/admin/sla/report", "sv.v1.SlaAdminService.GetSlaReport", ""},
      {"PUT", "/v1/admin/tenants/{tenant_id}/slaOverrides", "sv.v1.SlaAdminService.SetSlaOverrides",
       "*"},
      {"GET", "/v1/admin/sla/definitions", "sv.v1.SlaAdminService.GetSlaDefinitions", ""},
      // Volumes.
      {"POST", "/v1/volumes", "sv.v1.VolumeService.CreateVolume", "*"},
      {"GET", "/v1/volumes", "sv.v1.VolumeService.ListVolumes", ""},
      {"GET", "/v1/volumes/{id}", "sv.v1.VolumeService.GetVolume", ""},
      {"DELETE", "/v1/volumes/{id}", "sv.v1.VolumeService.DeleteVolume", ""},
      {"POST", "/v1/volumes/{volume_id}:attach", "sv.v1.VolumeService.AttachVolume", "*"},
      {"POST", "/v1/volumes/{volume_id}:detach", "sv.v1.VolumeService.DetachVolume", "*"},
      {"POST", "/v1/volumes/{volume_id}:move", "sv.v1.VolumeService.MoveVolume", "*"},
      // Shared library and marketplace.
      {"GET", "/v1/library", "sv.v1.LibraryService.ListLibraryItems", ""},
      {"GET", "/v1/library/{name}", "sv.v1.LibraryService.GetLibraryItem", ""},
      {"POST", "/v1/admin/library", "sv.v1.LibraryAdminService.CreateLibraryItem", "*"},
      {"DELETE", "/v1/admin/library/{name}", "sv.v1.LibraryAdminService.DeleteLibraryItem", ""},
      {"POST", "/v1/images", "sv.v1.MarketplaceService.RegisterImage", "*"},
      {"GET", "/v1/images", "sv.v1.MarketplaceService.ListImages", ""},
      {"GET", "/v1/images/{id}", "sv.v1.MarketplaceService.GetImage", ""},
      {"POST", "/v1/images/{id}:delist", "sv.v1.MarketplaceService.DelistImage", "*"},
      {"POST", "/v1/apps:launch", "sv.v1.MarketplaceService.LaunchApp", "*"},
      {"GET", "/v1/marketplace/earnings", "sv.v1.MarketplaceService.GetPublisherEarnings", ""},
      {"GET", "/v1/marketplace/payouts", "sv.v1.MarketplaceService.ListPayouts", ""},
      {"POST", "/v1/admin/payouts", "sv.v1.MarketplaceAdminService.RecordPayout", "*"},
      // Operators: the billing dashboard (/admin).
      {"GET", "/v1/admin/dashboard/revenue", "sv.v1.DashboardAdminService.GetRevenueSeries", ""},
      {"GET", "/v1/admin/dashboard/slaRefunds", "sv.v1.DashboardAdminService.GetSlaRefundsByMetric",
       ""},
      {"GET", "/v1/admin/dashboard/fleet", "sv.v1.DashboardAdminService.GetFleetUtilization", ""},
      {"GET", "/v1/admin/dashboard/trialGrants", "sv.v1.DashboardAdminService.ListTrialGrants", ""},
      {"GET", "/v1/admin/dashboard/topups", "sv.v1.DashboardAdminService.ListTopUps", ""},
      // Test and demo only: svd --fake-clock-start serves these.
      {"GET", "/v1/admin/clock", "sv.v1.DevClockService.GetClock", ""},
      {"POST", "/v1/admin/clock:advance", "sv.v1.DevClockService.AdvanceClock", "*"},
  };
  return kRoutes;
}

const std::vector<std::string>& RestExemptServices() {
  // Node agents speak gRPC with node credentials (docs/agent.md); they are
  // not part of the tenant or operator API.
  static const std::vector<std::string> kExempt = {
      "sv.v1.AgentService", "sv.v1.NodeCredentialService", "sv.v1.SlaTelemetryService"};
  return kExempt;
}

}  // namespace sv::server
