#include "agent/assignment.h"

namespace sv::agent {

RuntimeInstance InstanceFromAssignment(const v1::InstanceAssignment& a) {
  RuntimeInstance r{a.instance_id(), {a.gpu_indices().begin(), a.gpu_indices().end()},
                    a.image(), {}, {}};
  for (const auto& v : a.volumes()) {
    r.volumes.push_back({v.source(), v.target(), v.read_only(), v.volume_id()});
  }
  for (const auto& p : a.ports()) {
    r.ports.push_back({p.host_port(), p.container_port(), p.protocol()});
  }
  r.authorized_keys.assign(a.authorized_keys().begin(), a.authorized_keys().end());
  r.run = a.run();
  r.confirmed = a.confirmed();
  return r;
}

}  // namespace sv::agent
