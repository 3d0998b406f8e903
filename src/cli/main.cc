// svctl: the command-line client of sv. Exit code 0 on success; otherwise
// one line on stderr naming the cause (1: the call failed, 2: bad usage).
#include "CLI/CLI.hpp"
#include "cli/commands.h"

int main(int argc, char** argv) {
  sv::cli::Session session;
  sv::cli::Action action;
  CLI::App app{"svctl - command-line client of the sv GPU cloud"};
  app.require_subcommand(1);
  app.add_option("--endpoint", session.flags.endpoint, "svd address host:port");
  app.add_option("--token", session.flags.token, "API key");
  app.add_option("--config", session.flags.config_path, "Config file path");
  app.add_option("--ca-file", session.flags.ca_file,
                 "PEM CA bundle: use TLS and trust it (or SVCTL_CA_FILE)");
  app.add_option("--timeout", session.flags.timeout_s, "Deadline of each call, seconds")
      ->check(CLI::Range(1, 3600));
  app.add_option("-o,--output", session.output, "Output format")
      ->check(CLI::IsMember({"table", "json"}));
  sv::cli::AddInstanceCommands(app, &action);
  sv::cli::AddAccountCommands(app, &action);
  sv::cli::AddAdminCommands(app, &action);
  sv::cli::AddBillingCommands(app, &action);
  sv::cli::AddSchedulingCommands(app, &action);
  sv::cli::AddLifecycleCommands(app, &action);
  sv::cli::AddVolumeCommands(app, &action);
  sv::cli::AddAppCommands(app, &action);
  sv::cli::AddSlaCommands(app, &action);
  sv::cli::AddSecurityCommands(app, &action);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? sv::cli::kExitOk : sv::cli::kExitUsage;
  }
  if (!action) return sv::cli::kExitUsage;
  return action(session);
}
