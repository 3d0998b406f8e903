// svctl's command tree, apart from main() so that tests/fuzz/cli_args_fuzz.cc
// drives the same parsing on arbitrary argv.
#include "CLI/CLI.hpp"
#include "cli/commands.h"

namespace sv::cli {

void BuildApp(CLI::App& app, Session& session, Action* action) {
  app.require_subcommand(1);
  app.add_option("--endpoint", session.flags.endpoint, "svd address host:port");
  app.add_option("--token", session.flags.token, "API key");
  app.add_option("--config", session.flags.config_path, "Config file path");
  app.add_option("--ca-file", session.flags.ca_file,
                 "PEM CA bundle: use TLS and trust it (or SVCTL_CA_FILE)");
  app.add_option("--client-cert", session.flags.client_cert_file,
                 "PEM client certificate for mutual TLS, with --client-key "
                 "(or SVCTL_CLIENT_CERT)");
  app.add_option("--client-key", session.flags.client_key_file,
                 "PEM private key of --client-cert (or SVCTL_CLIENT_KEY)");
  app.add_option("--timeout", session.flags.timeout_s, "Deadline of each call, seconds")
      ->check(CLI::Range(1, 3600));
  app.add_option("-o,--output", session.output, "Output format")
      ->check(CLI::IsMember({"table", "json"}));
  AddInstanceCommands(app, action);
  AddAccountCommands(app, action);
  AddAdminCommands(app, action);
  AddBillingCommands(app, action);
  AddSchedulingCommands(app, action);
  AddLifecycleCommands(app, action);
  AddVolumeCommands(app, action);
  AddAppCommands(app, action);
  AddSlaCommands(app, action);
  AddSecurityCommands(app, action);
}

}  // namespace sv::cli
