// Package readyz is the readyz sidecar: it serves GET /readyz, answering
// 503 while a required local TCP port has no LISTEN socket in the pod's
// network namespace (see internal/readiness and docs/readyz.md). Options
// holds its flags, Run serves, Command is the binary for internal/cli.
package readyz
