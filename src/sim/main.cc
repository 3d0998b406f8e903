// svsim: a fleet of simulated node agents, with scripted faults, speaking the
// real agent protocol to an svd. See docs/agent.md.
#include <pthread.h>
#include <signal.h>

#include <fstream>
#include <iostream>

#include <grpcpp/grpcpp.h>

#include "CLI/CLI.hpp"
#include "sim/fleet.h"
#include "spdlog/spdlog.h"
#include "sv/v1/agent.grpc.pb.h"

int main(int argc, char** argv) {
  std::string endpoint = "127.0.0.1:7070", admin_key_file = ".sv/admin.key", faults_file;
  std::string prefix;
  int nodes = 16, leaves = 2, pods = 1;
  CLI::App app{"svsim - simulated GPU nodes for sv"};
  app.add_option("--endpoint", endpoint, "svd's gRPC address")->capture_default_str();
  app.add_option("--admin-key-file", admin_key_file,
                 "Operator key, used to mint one credential per simulated node")
      ->capture_default_str();
  app.add_option("--nodes", nodes)->check(CLI::Range(1, 1024))->capture_default_str();
  app.add_option("--leaves", leaves)->check(CLI::Range(1, 1024))->capture_default_str();
  app.add_option("--pods", pods)->check(CLI::Range(1, 128))->capture_default_str();
  app.add_option("--name-prefix", prefix, "Prefix for node names (to run beside svd --dev)");
  app.add_option("--faults", faults_file, "Fault script (see docs/agent.md)");
  CLI11_PARSE(app, argc, argv);
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ %v");

  std::string admin_key;
  std::ifstream(admin_key_file) >> admin_key;
  if (admin_key.empty()) {
    std::cerr << "svsim: no operator key in " << admin_key_file << "\n";
    return 2;
  }
  sv::sim::FleetOptions options;
  options.endpoint = endpoint;
  options.nodes = sv::sim::StandardFleet(nodes, leaves, pods);
  for (auto& n : options.nodes) n.name = prefix + n.name;
  if (!faults_file.empty()) {
    auto faults = sv::agent::ReadFaultScript(faults_file);
    if (!faults.ok()) {
      std::cerr << "svsim: " << faults.status().message() << "\n";
      return 2;
    }
    options.faults = *faults;
  }
  auto channel = grpc::CreateChannel(endpoint, grpc::InsecureChannelCredentials());
  auto stub = sv::v1::NodeCredentialService::NewStub(channel);
  auto mint = [&](const std::string& node) -> absl::StatusOr<std::string> {
    grpc::ClientContext context;
    context.AddMetadata("authorization", "Bearer " + admin_key);
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    sv::v1::CreateNodeCredentialRequest request;
    request.set_node_name(node);
    sv::v1::CreateNodeCredentialResponse response;
    grpc::Status status = stub->CreateNodeCredential(&context, request, &response);
    if (!status.ok()) {
      return absl::UnavailableError("cannot mint a credential for " + node + ": " +
                                    status.error_message());
    }
    return response.credential();
  };
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  sv::RealClock clock;
  sv::sim::SimulatedFleet fleet(options, mint, clock);
  if (absl::Status s = fleet.Start(); !s.ok()) {
    std::cerr << "svsim: " << s.message() << "\n";
    return 1;
  }
  int signal_number = 0;
  sigwait(&signals, &signal_number);
  fleet.Stop();
  return 0;
}
