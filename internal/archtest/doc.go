// Package archtest holds no code: its tests enforce the architecture that
// docs/architecture.md draws — which packages may import what, and that
// every package running goroutines is in make test's race run.
package archtest
