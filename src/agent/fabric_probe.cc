#include "agent/fabric_probe.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "agent/telemetry.h"

namespace sv::agent {
namespace {

constexpr int kPeersMax = 64;
constexpr int kProbesPerPeerMax = 100;
constexpr int kPayloadBytes = 16;

absl::StatusOr<sockaddr_in> ParseAddress(const std::string& host_port) {
  const size_t colon = host_port.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(host_port.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("probe address must be host:port, got '",
                                                   host_port, "'"));
  }
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  const std::string host = host_port.substr(0, colon);
  if (getaddrinfo(host.empty() ? "0.0.0.0" : host.c_str(), nullptr, &hints, &found) != 0 ||
      found == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("cannot resolve probe host '", host, "'"));
  }
  sockaddr_in address = *reinterpret_cast<sockaddr_in*>(found->ai_addr);
  freeaddrinfo(found);
  address.sin_port = htons(static_cast<uint16_t>(port));
  return address;
}

}  // namespace

ProbeResponder::~ProbeResponder() { Stop(); }

absl::Status ProbeResponder::Start(const std::string& listen_address) {
  auto address = ParseAddress(listen_address);
  if (!address.ok()) return address.status();
  fd_ = socket(AF_INET, SOCK_DGRAM, 0);
  if (fd_ < 0 || bind(fd_, reinterpret_cast<sockaddr*>(&*address), sizeof(*address)) != 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen for probes on ", listen_address));
  }
  sockaddr_in bound{};
  socklen_t length = sizeof(bound);
  getsockname(fd_, reinterpret_cast<sockaddr*>(&bound), &length);
  port_ = ntohs(bound.sin_port);
  thread_ = std::thread([this] {
    char buffer[64];
    while (!stopping_.load()) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 100) <= 0) continue;
      sockaddr_in from{};
      socklen_t from_length = sizeof(from);
      ssize_t n = recvfrom(fd_, buffer, sizeof(buffer), 0, reinterpret_cast<sockaddr*>(&from),
                           &from_length);
      if (n > 0) {
        sendto(fd_, buffer, n, 0, reinterpret_cast<sockaddr*>(&from), from_length);
      }
    }
  });
  return absl::OkStatus();
}

void ProbeResponder::Stop() {
  stopping_ = true;
  if (thread_.joinable()) thread_.join();
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

absl::StatusOr<ProbeRound> ProbePeers(const std::vector<std::string>& peers,
                                      int probes_per_peer, absl::Duration timeout) {
  if (static_cast<int>(peers.size()) > kPeersMax || probes_per_peer < 1 ||
      probes_per_peer > kProbesPerPeerMax) {
    return absl::InvalidArgumentError(absl::StrCat("at most ", kPeersMax, " peers and 1..",
                                                   kProbesPerPeerMax, " probes each"));
  }
  ProbeRound round;
  const int timeout_ms = static_cast<int>(std::max<int64_t>(1, absl::ToInt64Milliseconds(timeout)));
  for (const std::string& peer : peers) {
    auto address = ParseAddress(peer);
    if (!address.ok()) return address.status();
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    if (fd < 0) return absl::UnavailableError("cannot open a probe socket");
    for (int i = 0; i < probes_per_peer; ++i) {
      uint64_t sequence = (static_cast<uint64_t>(i) << 32) | static_cast<uint64_t>(fd);
      char payload[kPayloadBytes] = {};
      std::memcpy(payload, &sequence, sizeof(sequence));
      const auto sent_at = std::chrono::steady_clock::now();
      sendto(fd, payload, sizeof(payload), 0, reinterpret_cast<const sockaddr*>(&*address),
             sizeof(*address));
      bool answered = false;
      while (!answered) {
        const auto waited = std::chrono::steady_clock::now() - sent_at;
        const int left_ms =
            timeout_ms - static_cast<int>(
                             std::chrono::duration_cast<std::chrono::milliseconds>(waited).count());
        pollfd p{fd, POLLIN, 0};
        if (left_ms <= 0 || poll(&p, 1, left_ms) <= 0) break;
        char reply[64];
        ssize_t n = recv(fd, reply, sizeof(reply), 0);
        uint64_t echoed = 0;
        if (n >= static_cast<ssize_t>(sizeof(echoed))) std::memcpy(&echoed, reply, sizeof(echoed));
        answered = echoed == sequence;  // Ignore late answers to earlier probes.
      }
      if (answered) {
        const auto rtt = std::chrono::steady_clock::now() - sent_at;
        round.one_way_ns.push_back(
            std::chrono::duration_cast<std::chrono::nanoseconds>(rtt).count() / 2);
      } else {
        ++round.lost;
      }
    }
    close(fd);
  }
  return round;
}

sla::LatencyHistogram FabricHistogram(const ProbeRound& round, absl::Duration lost_as) {
  sla::LatencyHistogram h;
  for (int64_t ns : round.one_way_ns) h.Record(ns);
  h.Record(absl::ToInt64Nanoseconds(lost_as), round.lost);
  return h;
}

}  // namespace sv::agent
