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
	ho := &slog.HandlerOptions{Level: lvl}
	if o.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, ho))
	}
	return slog.New(slog.NewTextHandler(w, ho))
}

// ParseLogLevel maps --log-level (debug, info, warn, error) to a level.
func ParseLogLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, fmt.Errorf("--log-level %q: use debug, info, warn or error", s)
	}
	return l, nil
}
