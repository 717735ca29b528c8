// Package reload is the library behind the reload sidecar (cmd/reload): it
// watches mounted ConfigMap directories (or one ConfigMap through the API),
// and on a settled change validates the new configuration, removes stale
// unix sockets, signals the consumer's main process and verifies that the
// reload took effect.
//
// The pieces, in the order a change flows through them:
//
//   - watch.go: fsnotify on the directories; a burst of events (kubelet's
//     "..data" symlink swap is several) is coalesced by a debounce and a
//     content fingerprint, so one change gives exactly one reload and a
//     half-done swap ("..data_tmp" present) is never acted on.
//
//   - proc.go: finds the target by argv[0] in /proc/*/cmdline (never by the
//     whole command line nor comm), excluding itself and worker children.
//
//   - sockets.go: removes "<route>.sock" files nothing listens on, which a
//     crashed nginx master leaves behind and which would make the next
//     "listen unix:" fail.
//
//   - reloader.go: check command, signal, verification by worker pids.
//
//   - push.go: dynamic peers. A change of peers tables only is pushed to
//     the engine's control socket instead of reloading; a table is checked
//     first (peers.ParseFile), and one the engine does not take keeps a
//     verdict (refused, waiting for its route) that says when it is pushed
//     again, so no table makes the sidecar reload or log at every resync.
//
//   - atomicwriter.go, configmap.go: API mode, which writes one ConfigMap's
//     keys in kubelet's layout without kubelet's 60–90 s delay.
//
//   - options.go, run.go: Options, the configuration the flags fill (each
//     flag also a PS_ variable); New, which checks a copy of them, fills in
//     the defaults and builds a Reloader whose state is its own; Command,
//     the binary for internal/cli; and Run, which serves /metrics,
//     /healthz and /readyz beside the Reloader.
//
//   - testhooks.go: the one way in for a test outside the package (a
//     Signaller in place of kill(2), an observer of every attempt).
//
// It must not import CUE or controller-runtime: the sidecar stays small.
package reload
