// Package reload is the library behind the reload sidecar (cmd/reload): it
// watches mounted ConfigMap directories (or one ConfigMap through the API),
// and on a settled change validates the new configuration, removes stale
// unix sockets, signals the consumer's main process and verifies that the
// reload took effect.
//
// The pieces, in the order a change flows through them:
//
//   - watch.go: the loop (Reloader.watch). fsnotify on the directories; a
//     burst of events (kubelet's "..data" symlink swap is several) is
//     coalesced by a debounce bounded by --max-delay, so one change gives
//     exactly one reload and a half-done swap ("..data_tmp" present) is
//     never acted on. Its tickers look again at --resync and, with
//     --sock-dir, watch the target's pid at --sock-sweep.
//
//   - snapshot.go: Snapshot, the content fingerprint that tells a change
//     from a touch, read with every kubelet directory pinned to one
//     "..data" target.
//
//   - reloader.go: the Reloader, which holds the parts below; attempt,
//     which brings the target to one settled content; serving, what the
//     target serves; and trigger, how a change reaches the target (as the
//     signal and HTTP reloaders of Thanos' pkg/reloader): attempt offers
//     it to the pusher, then to the signalTrigger.
//
//   - signal.go: signalTrigger, a trigger that takes every change: check
//     command (check.go: checker), stale sockets removed, signal,
//     verification by worker pids, then every peers table pushed again.
//     It also owns the socket sweep: sockets.go removes "<route>.sock"
//     files nothing listens on, which a crashed nginx master leaves behind
//     and which would make the next "listen unix:" fail.
//
//   - proc.go: finds the target by argv[0] in /proc/*/cmdline (never by the
//     whole command line nor comm), excluding itself and worker children.
//
//   - push.go: pusher, the trigger of dynamic peers. A change of peers
//     tables only is pushed to the engine's control socket instead of
//     reloading; a table is checked first (peers.ParseFile), and one the
//     engine does not take keeps a verdict (refused, waiting for its
//     route) that says when it is pushed again, so no table makes the
//     sidecar reload or log at every resync. It owns the push serials,
//     the control client and the verdicts, and pushes every table to a
//     new master.
//
//   - apply.go, atomicwriter.go, configmap.go: API mode. applier writes
//     one ConfigMap's keys (ConfigMapSync, a Source) in kubelet's layout
//     without kubelet's 60–90 s delay, holding back (quarantine) each key
//     whose new version fails the check; it owns the quarantine and the
//     versions applied and refused.
//
//   - served.go: the served report (PodReporter) on the sidecar's Pod.
//
//   - options.go, run.go: Options, the configuration the flags fill (each
//     flag also a PS_ variable); New, which checks a copy of them, fills in
//     the defaults and builds a Reloader and its parts, whose state is
//     their own (what they share, env, is configuration and the seams
//     tests replace); Command, the binary for internal/cli; and Run, which
//     serves /metrics, /healthz and /readyz beside the Reloader.
//
//   - testhooks.go: the one way in for a test outside the package (a
//     Signaller in place of kill(2), an observer of every attempt).
//
// It must not import CUE or controller-runtime: the sidecar stays small.
package reload
