// svctl: the command-line client of sv. Exit code 0 on success; otherwise
// one line on stderr naming the cause (1: the call failed, 2: bad usage).
#include <cstdio>
#include <exception>

#include "CLI/CLI.hpp"
#include "cli/commands.h"

int main(int argc, char** argv) {
  sv::cli::Session session;
  sv::cli::Action action;
  CLI::App app{"svctl - command-line client of the sv GPU cloud"};
  sv::cli::BuildApp(app, session, &action);  // cli/app.cc
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? sv::cli::kExitOk : sv::cli::kExitUsage;
  }
  if (!action) return sv::cli::kExitUsage;
  try {
    return action(session);
  } catch (const std::exception& e) {
    // A command's own checks should have caught it; still one line, not an
    // abort.
    std::fprintf(stderr, "svctl: error: %s\n", e.what());
    return sv::cli::kExitUsage;
  }
}
