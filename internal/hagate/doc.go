// Package hagate keeps exactly one replica of a stateful router active:
// every replica joins leader election on the Lease <name>-ha and only the
// leader labels its own pod <name>-active=true, so a Service selecting that
// label has one endpoint while every replica stays Ready.
//
// The gate is level-triggered: every interval it reads its own pod and the
// Lease state and fixes the label, so a label removed or added by hand is
// corrected, and a leader whose app stops accepting connections drops its
// label and gives the Lease up.
//
// The invariant is "never two pods active unless one of them is
// terminating". It rests on four rules:
//
//   - A label is added only while the Lease is held (checked immediately
//     before the patch, against the time of the last successful renewal),
//     with a JSON patch that tests the pod's resourceVersion, and with a
//     request deadline inside the Lease's validity.
//   - A leader first removes the label from every other pod that carries it
//     and is not terminating (a crashed hagate or a dead node leaves its
//     pod labelled); it does not add its own label until that succeeded.
//   - A leader that stops being healthy removes its label before it
//     releases the Lease; one that loses the Lease drops the label at once.
//   - On planned shutdown (context cancelled, e.g. SIGTERM) the label is left
//     alone and the Lease released, so the terminating pod drains in-flight
//     streams while the standby takes new traffic. A pod with a
//     deletionTimestamp never contends and its label is never touched.
package hagate
