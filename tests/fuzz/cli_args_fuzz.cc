// libFuzzer target: svctl's argument parsing. The input is an argv (NUL
// separates arguments); it goes through the real command tree
// (cli::BuildApp) and CLI11, and a command that parses runs its action with
// no way to reach a server (no endpoint, no key, no config file), so every
// check an action makes before dialing runs too. Nothing may crash, and no
// action may claim success without a server.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "cli/commands.h"

namespace {

constexpr size_t kArgsMax = 24;

void Check(bool condition) {
  if (!condition) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // Only the fuzzed argv says where to connect, and it is overridden below.
  for (const char* name : {"SVCTL_ENDPOINT", "SVCTL_TOKEN", "SVCTL_ADMIN_TOKEN", "SVCTL_CA_FILE",
                           "SVCTL_CLIENT_CERT", "SVCTL_CLIENT_KEY", "XDG_CONFIG_HOME"}) {
    unsetenv(name);
  }
  setenv("HOME", "/nonexistent-svctl-fuzz", 1);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> args = {"svctl"};
  std::string current;
  for (size_t i = 0; i < size && args.size() <= kArgsMax; ++i) {
    if (data[i] == 0) {
      args.push_back(current);
      current.clear();
    } else {
      current.push_back(static_cast<char>(data[i]));
    }
  }
  if (!current.empty() && args.size() <= kArgsMax) args.push_back(current);
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());

  sv::cli::Session session;
  sv::cli::Action action;
  CLI::App app{"svctl"};
  sv::cli::BuildApp(app, session, &action);
  std::ostringstream out, err;
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::ParseError& e) {
    app.exit(e, out, err);
    return 0;
  }
  if (!action) return 0;
  // Whatever the flags said: no endpoint, key, TLS files or config file.
  session.flags.endpoint.clear();
  session.flags.token.clear();
  session.flags.ca_file.clear();
  session.flags.client_cert_file.clear();
  session.flags.client_key_file.clear();
  session.flags.config_path = "/nonexistent-svctl-fuzz/config.json";
  std::streambuf* saved_out = std::cout.rdbuf(out.rdbuf());
  std::streambuf* saved_err = std::cerr.rdbuf(err.rdbuf());
  const int rc = action(session);
  std::cout.rdbuf(saved_out);
  std::cerr.rdbuf(saved_err);
  Check(rc == sv::cli::kExitFailed || rc == sv::cli::kExitUsage);
  Check(session.channel == nullptr);
  return 0;
}
