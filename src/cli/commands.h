#ifndef SV_CLI_COMMANDS_H_
#define SV_CLI_COMMANDS_H_

// svctl's commands. Each group lives in its own file and registers its
// subcommands; a subcommand's callback stores the Action that main() runs
// after parsing.

#include <functional>
#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "cli/client.h"
#include "cli/output.h"

namespace CLI {
class App;
}

namespace sv::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;
inline constexpr int kExitUsage = 2;

struct Session {
  ConnectionFlags flags;
  std::string output = "table";
  Connection connection;
  std::shared_ptr<grpc::Channel> channel;

  Format format() const { return output == "json" ? Format::kJson : Format::kTable; }
  // Resolves the endpoint and key and dials; false with `error` set if not.
  bool Connect(std::string* error);
  // A fresh context with the key and the deadline.
  std::unique_ptr<grpc::ClientContext> Context() const;
};

using Action = std::function<int(Session&)>;

// One line on stderr: "svctl: error: ...". Returns kExitFailed.
int Fail(const std::string& message);
int FailRpc(const grpc::Status& status, const Session& session);

// The instance a command names: an id (ins-...) as it is, else the name of
// exactly one of the tenant's instances that are not deleted (names need
// not be unique, so two of one name are an error that lists their ids).
// Call after Connect. kExitOk with *id set, or the failure printed.
int ResolveInstance(Session& s, const std::string& id_or_name, std::string* id);
// The tenant an operator command names: an id (ten-...) as it is, else a
// tenant's name (names are unique). Call with the admin key connected.
// kExitOk with *id set (it may be id_or_name itself), or the failure printed.
int ResolveTenant(Session& s, const std::string& id_or_name, std::string* id);

void AddInstanceCommands(CLI::App& app, Action* action);
void AddAccountCommands(CLI::App& app, Action* action);
void AddAdminCommands(CLI::App& app, Action* action);
// svctl balance, usage, transfers, invoices and svctl admin topup|balances|
// revenue|audit; call after AddAdminCommands.
void AddBillingCommands(CLI::App& app, Action* action);
// svctl resize and svctl admin nodes|quota; call after AddAdminCommands.
void AddSchedulingCommands(CLI::App& app, Action* action);
// svctl stop, start, events and idle-policy.
void AddLifecycleCommands(CLI::App& app, Action* action);

// svctl sla <instance> and svctl admin sla-report|sla-override
// (sla_commands.cc); call after AddAdminCommands.
void AddSlaCommands(CLI::App& app, Action* action);

// svctl volumes ... (volume_commands.cc).
void AddVolumeCommands(CLI::App& app, Action* action);
// svctl library ..., svctl apps ... and svctl admin library|payout
// (app_commands.cc); call after AddAdminCommands.
void AddAppCommands(CLI::App& app, Action* action);
// svctl keys ..., users ..., audit and spend-cap (security_commands.cc).
void AddSecurityCommands(CLI::App& app, Action* action);

// The whole command tree (cli/app.cc): global flags into `session`, every
// group above. Parsing does no I/O; the stored action dials.
void BuildApp(CLI::App& app, Session& session, Action* action);

}  // namespace sv::cli

#endif  // SV_CLI_COMMANDS_H_
