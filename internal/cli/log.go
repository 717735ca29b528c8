package cli

import (
	"fmt"
	"io"
	"log/slog"

	"github.com/spf13/pflag"
)

// LogOptions are --log-level and --log-format, the same on every binary
// that logs.
type LogOptions struct {
	Level  string
	Format string
}

// AddFlags registers --log-level and --log-format.
func (o *LogOptions) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.Level, "log-level", "info", "log `level`: debug, info, warn or error")
	fs.StringVar(&o.Format, "log-format", "text", "log `format`: text or json")
}

// Validate checks both flags.
func (o *LogOptions) Validate() error {
	if _, err := ParseLogLevel(o.Level); err != nil {
		return err
	}
	if o.Format != "text" && o.Format != "json" {
		return fmt.Errorf("--log-format %q: use text or json", o.Format)
	}
	return nil
}

// Logger builds the slog logger writing to w (options already validated;
// an unknown level falls back to info).
func (o *LogOptions) Logger(w io.Writer) *slog.Logger {
	lvl, _ := ParseLogLevel(o.Level)
	ho := &slog.HandlerOptions{Level: lvl, ReplaceAttr: levelName}
	if o.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, ho))
	}
	return slog.New(slog.NewTextHandler(w, ho))
}

// levelName prints the level of a record by its name only: logr's V(n)
// is slog level -n, which slog would print as "DEBUG+3"; every level below
// INFO is DEBUG here, and the four names are the --log-level values.
func levelName(groups []string, a slog.Attr) slog.Attr {
	if len(groups) > 0 || a.Key != slog.LevelKey {
		return a
	}
	l, ok := a.Value.Any().(slog.Level)
	if !ok {
		return a
	}
	switch {
	case l < slog.LevelInfo:
		a.Value = slog.StringValue("DEBUG")
	case l < slog.LevelWarn:
		a.Value = slog.StringValue("INFO")
	case l < slog.LevelError:
		a.Value = slog.StringValue("WARN")
	default:
		a.Value = slog.StringValue("ERROR")
	}
	return a
}

// ParseLogLevel maps --log-level (debug, info, warn, error) to a level.
func ParseLogLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, fmt.Errorf("--log-level %q: use debug, info, warn or error", s)
	}
	return l, nil
}
