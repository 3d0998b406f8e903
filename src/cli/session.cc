#include <iostream>

#include "cli/commands.h"

namespace sv::cli {

bool Session::Connect(std::string* error) {
  if (!ResolveConnection(flags, &connection, error)) return false;
  channel = Dial(connection, error);
  return channel != nullptr;
}

std::unique_ptr<grpc::ClientContext> Session::Context() const {
  auto context = std::make_unique<grpc::ClientContext>();
  Prepare(connection, context.get());
  return context;
}

int Fail(const std::string& message) {
  std::cerr << "svctl: error: " << message << "\n";
  return kExitFailed;
}

int FailRpc(const grpc::Status& status, const Session& session) {
  return Fail(DescribeError(status, session.connection.endpoint));
}

}  // namespace sv::cli
