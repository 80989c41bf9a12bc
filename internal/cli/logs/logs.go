// Package logs is the one logger setup of the commands: JSON lines, or a
// console format (coloured only on a terminal), with an RFC 3339 timestamp
// and the service name on every line.
package logs

import (
	"io"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/sotercare/jetbridge/internal/cli"
)

// New returns a logger writing to w: format "console" or "json"
// (anything else is JSON), level a zerolog level name ("" is info);
// service "" leaves out the service field.
func New(format, level, service string, w io.Writer) (zerolog.Logger, error) {
	lvl, err := zerolog.ParseLevel(strings.ToLower(level))
	if err != nil {
		return zerolog.Nop(), err
	}
	if lvl == zerolog.NoLevel {
		lvl = zerolog.InfoLevel
	}
	zerolog.TimeFieldFormat = time.RFC3339Nano
	if format == "console" {
		w = zerolog.ConsoleWriter{Out: w, TimeFormat: "15:04:05.000", NoColor: !cli.IsTerminal(w)}
	}
	ctx := zerolog.New(w).Level(lvl).With().Timestamp()
	if service != "" {
		ctx = ctx.Str("service", service)
	}
	return ctx.Logger(), nil
}
