// svagent: the node agent. See docs/agent.md.
#include <pthread.h>
#include <signal.h>

#include <fstream>
#include <iostream>
#include <thread>

#include "CLI/CLI.hpp"
#include "absl/strings/str_split.h"
#include "agent/agent.h"
#include "agent/fabric_probe.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

namespace {

constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;

int NvmlProbe(const std::string& library) {
  auto nvml = sv::agent::OpenNvml(library);
  if (!nvml.ok()) {
    std::cerr << "svagent: " << nvml.status().message() << "\n";
    return kExitFailed;
  }
  auto readings = (*nvml)->Sample();
  if (!readings.ok()) {
    std::cerr << "svagent: " << readings.status().message() << "\n";
    return kExitFailed;
  }
  nlohmann::json out = nlohmann::json::array();
  for (const auto& r : *readings) {
    out.push_back({{"gpu_index", r.gpu_index},
                   {"utilization_pct", r.utilization_pct},
                   {"memory_used_bytes", r.memory_used_bytes},
                   {"memory_total_bytes", r.memory_total_bytes},
                   {"temperature_c", r.temperature_c},
                   {"power_mw", r.power_mw},
                   {"throttle_reasons", r.throttle_reasons},
                   {"xid_errors", r.xid_errors},
                   {"ecc_uncorrected_errors", r.ecc_uncorrected_errors}});
  }
  std::cout << out.dump(2) << "\n";
  return kExitOk;
}

std::string ReadCredential(const std::string& path) {
  std::ifstream in(path);
  std::string credential;
  in >> credential;
  return credential;
}

}  // namespace

int main(int argc, char** argv) {
  sv::agent::AgentOptions o;
  std::string credential_file, driver = "process", telemetry = "nvml", state_dir = ".svagent";
  std::string process_command = "sleep 2147483647", docker_path = "docker";
  std::string nvml_library = "libnvidia-ml.so.1", log_level = "info";
  int heartbeat_ms = 5000, telemetry_ms = 10000, backoff_max_ms = 10000;
  int sim_utilization_pct = 97;
  CLI::App app{"svagent - the sv node agent"};
  app.add_option("--endpoint", o.endpoint, "svd's gRPC address (host:port)");
  std::string ca_file;
  app.add_option("--ca-file", ca_file, "PEM CA bundle: connect with TLS, trusting it")
      ->check(CLI::ExistingFile);
  std::string client_cert_file, client_key_file;
  app.add_option("--client-cert", client_cert_file,
                 "PEM client certificate for svd's --tls-client-ca (with --client-key)")
      ->check(CLI::ExistingFile);
  app.add_option("--client-key", client_key_file, "PEM private key of --client-cert")
      ->check(CLI::ExistingFile);
  app.add_option("--credential-file", credential_file,
                 "File holding this node's credential (svn_...)")
      ->envname("SVAGENT_CREDENTIAL_FILE");
  app.add_option("--node-name", o.node_name, "Name this node registers as");
  app.add_option("--zone", o.zone)->capture_default_str();
  app.add_option("--pod", o.pod)->capture_default_str();
  app.add_option("--leaf-switch", o.leaf_switch)->capture_default_str();
  app.add_option("--gpu-model", o.gpu_model)->capture_default_str();
  app.add_option("--gpu-count", o.gpu_count)->check(CLI::Range(1, 8))->capture_default_str();
  app.add_option("--driver", driver, "process or docker")
      ->check(CLI::IsMember({"process", "docker"}))
      ->capture_default_str();
  app.add_option("--process-command", process_command,
                 "Shell command the process driver runs per instance")
      ->capture_default_str();
  app.add_option("--docker", docker_path, "The docker CLI")->capture_default_str();
  std::string hot_mounts_dir = "/var/lib/sv/instance-mounts";
  app.add_option("--hot-mounts-dir", hot_mounts_dir,
                 "docker: per-instance directories bound at /mnt with mount propagation, so "
                 "volumes under /mnt attach while a container runs (empty: at start only)")
      ->capture_default_str();
  std::string ssh_keys_dir = "/var/lib/sv/ssh-keys";
  app.add_option("--ssh-keys-dir", ssh_keys_dir,
                 "docker: per-instance authorized_keys files, bound read-only at "
                 "/root/.ssh/authorized_keys")
      ->capture_default_str();
  app.add_option("--state-dir", state_dir, "Pid files, probe files and the instance record")->capture_default_str();
  app.add_option("--telemetry", telemetry, "nvml, simulated or none")
      ->check(CLI::IsMember({"nvml", "simulated", "none"}))
      ->capture_default_str();
  app.add_option("--nvml-library", nvml_library)->capture_default_str();
  app.add_option("--storage-probe-bytes", o.storage_probe_bytes,
                 "Bytes each storage write probe writes and fsyncs (0: no probes)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 32))
      ->capture_default_str();
  app.add_option("--sim-utilization-pct", sim_utilization_pct,
                 "With --telemetry=simulated: utilization of GPUs that run an instance")
      ->check(CLI::Range(0, 100))
      ->capture_default_str();
  app.add_option("--heartbeat-interval-ms", heartbeat_ms)
      ->check(CLI::Range(50, 600000))
      ->capture_default_str();
  app.add_option("--telemetry-interval-ms", telemetry_ms)
      ->check(CLI::Range(50, 3600000))
      ->capture_default_str();
  app.add_option("--reconnect-backoff-max-ms", backoff_max_ms)
      ->check(CLI::Range(100, 600000))
      ->capture_default_str();
  app.add_option("--log-level", log_level)
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}))
      ->capture_default_str();
  std::string probe_listen, probe_peers;
  app.add_option("--probe-listen", probe_listen,
                 "host:port to answer peers' fabric-latency probes on (UDP; empty: off)");
  app.add_option("--probe-peers", probe_peers,
                 "Comma-separated host:port of peer agents to probe each telemetry round");
  auto* probe = app.add_subcommand("nvml-probe", "Print one round of NVML samples as JSON");
  CLI11_PARSE(app, argc, argv);
  spdlog::set_level(spdlog::level::from_str(log_level));
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ %v");
  if (probe->parsed()) return NvmlProbe(nvml_library);

  if (o.endpoint.empty() || o.node_name.empty() || credential_file.empty()) {
    std::cerr << "svagent: --endpoint, --node-name and --credential-file are required\n";
    return 2;
  }
  o.credential = ReadCredential(credential_file);
  if (o.credential.empty()) {
    std::cerr << "svagent: no credential in " << credential_file << "\n";
    return 2;
  }
  if (!ca_file.empty()) {
    std::ifstream ca(ca_file);
    o.ca_pem.assign(std::istreambuf_iterator<char>(ca), std::istreambuf_iterator<char>());
    if (o.ca_pem.empty()) {
      std::cerr << "svagent: cannot read CA file " << ca_file << "\n";
      return 2;
    }
  }
  if (client_cert_file.empty() != client_key_file.empty() ||
      (!client_cert_file.empty() && ca_file.empty())) {
    std::cerr << "svagent: --client-cert and --client-key go together, with --ca-file\n";
    return 2;
  }
  if (!client_cert_file.empty()) {
    std::ifstream cert(client_cert_file), key(client_key_file);
    o.client_cert_pem.assign(std::istreambuf_iterator<char>(cert),
                             std::istreambuf_iterator<char>());
    o.client_key_pem.assign(std::istreambuf_iterator<char>(key), std::istreambuf_iterator<char>());
    if (o.client_cert_pem.empty() || o.client_key_pem.empty()) {
      std::cerr << "svagent: cannot read --client-cert or --client-key\n";
      return 2;
    }
  }
  o.heartbeat_interval = absl::Milliseconds(heartbeat_ms);
  o.telemetry_interval = absl::Milliseconds(telemetry_ms);
  o.reconnect_backoff_max = absl::Milliseconds(backoff_max_ms);
  o.probe_dir = state_dir;
  o.record_file = state_dir + "/instances.json";
  for (absl::string_view peer : absl::StrSplit(probe_peers, ',', absl::SkipEmpty())) {
    o.probe_peers.emplace_back(peer);
  }
  sv::agent::ProbeResponder responder;
  if (!probe_listen.empty()) {
    if (absl::Status s = responder.Start(probe_listen); !s.ok()) {
      std::cerr << "svagent: " << s.message() << "\n";
      return kExitFailed;
    }
  }

  std::unique_ptr<sv::agent::TelemetrySource> source;
  if (telemetry == "nvml") {
    auto nvml = sv::agent::OpenNvml(nvml_library);
    if (!nvml.ok()) {
      std::cerr << "svagent: " << nvml.status().message() << "\n";
      return kExitFailed;
    }
    source = *std::move(nvml);
  } else if (telemetry == "simulated") {
    auto simulated = std::make_unique<sv::agent::SimulatedTelemetry>(o.gpu_count, 1);
    simulated->SetBusyUtilizationPct(sim_utilization_pct);
    source = std::move(simulated);
  }
  auto runtime = driver == "docker"
                     ? sv::agent::NewDockerDriver(docker_path, hot_mounts_dir, ssh_keys_dir)
                     : sv::agent::NewProcessDriver(state_dir + "/instances", process_command);

  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  sv::RealClock clock;
  sv::agent::Agent agent(o, std::move(runtime), std::move(source), clock);
  std::thread runner([&] { agent.Run(); });
  int signal_number = 0;
  sigwait(&signals, &signal_number);
  spdlog::info("svagent: got signal {}, stopping (instances keep running)", signal_number);
  agent.Stop();
  runner.join();
  return kExitOk;
}
