package cli

import (
	"fmt"
	"log/slog"
)

// Commit and BuildDate are stamped by the build (make build, make images):
//
//	-ldflags "-X github.com/modelsphere/autoconfig/internal/cli.Version=0.2.0
//	          -X github.com/modelsphere/autoconfig/internal/cli.Commit=<git sha>
//	          -X github.com/modelsphere/autoconfig/internal/cli.BuildDate=<RFC 3339>"
//
// A plain `go build` leaves them empty, and every binary says so.
var (
	Commit    = ""
	BuildDate = ""
)

// Stamped reports whether the build stamped the commit and the date.
func Stamped() bool { return Commit != "" && BuildDate != "" }

// VersionString is what --version prints after the binary's name:
// "0.2.0 (commit 1a2b3c4, built 2026-12-02T08:00:00Z)", or for a plain go
// build "0.2.0 (unstamped build: commit and build date unknown; build with
// make build)".
func VersionString() string {
	if !Stamped() {
		return Version + " (unstamped build: commit and build date unknown; build with make build)"
	}
	return fmt.Sprintf("%s (commit %s, built %s)", Version, Commit, BuildDate)
}

// VersionAttrs are the version, commit and build date as log attributes
// ("unknown" when unstamped).
func VersionAttrs() []any {
	commit, date := Commit, BuildDate
	if commit == "" {
		commit = "unknown"
	}
	if date == "" {
		date = "unknown"
	}
	return []any{slog.String("version", Version), slog.String("commit", commit), slog.String("buildDate", date)}
}
