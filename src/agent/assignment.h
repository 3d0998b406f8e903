#ifndef SV_AGENT_ASSIGNMENT_H_
#define SV_AGENT_ASSIGNMENT_H_

// What svagent makes of one instance of svd's desired set (ServerMessage
// desired); tests/fuzz/agent_message_fuzz.cc drives it with arbitrary bytes.

#include "agent/runtime_driver.h"
#include "sv/v1/agent.pb.h"

namespace sv::agent {

RuntimeInstance InstanceFromAssignment(const v1::InstanceAssignment& a);

}  // namespace sv::agent

#endif  // SV_AGENT_ASSIGNMENT_H_
