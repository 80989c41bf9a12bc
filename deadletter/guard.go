package deadletter

import (
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/sotercare/jetbridge/config"
	"github.com/sotercare/jetbridge/subjects"
)

// maxReplaySubject bounds the length in bytes of a subject that replay
// publishes to. Dead letters are untrusted input.
const maxReplaySubject = 1024

// systemTokens are first subject tokens reserved for NATS itself, named
// in refusals. Every first token that starts with "$" is refused, these
// and any other.
var systemTokens = map[string]string{
	"$JS":   "the JetStream API",
	"$JSC":  "JetStream internals",
	"$NRG":  "JetStream clustering",
	"$KV":   "a key-value bucket",
	"$O":    "an object store",
	"$SYS":  "the system account",
	"$MQTT": "the MQTT gateway",
	"$SRV":  "the service API",
}

// ReplayRefusedError is a dead letter that replay refuses to republish
// (see docs/security.md): nothing was stored by the source
// stream and the dead letter is kept. It matches ErrReplayRefused and
// ErrNotReplayable.
//
// Reason names the rule that failed; it holds names from the
// configuration but never a header value or payload byte. Subject is the
// dead letter's Bridge-Original-Subject as stored: untrusted, so escape it
// before printing it.
type ReplayRefusedError struct {
	Seq     uint64 // the dead letter's sequence on the dead-letter stream
	Subject string
	Reason  string
	Err     error // the JetStream error when the PubAck came from another stream
}

func (e *ReplayRefusedError) Error() string {
	return fmt.Sprintf("deadletter: dead letter %d refused for replay: %s", e.Seq, e.Reason)
}

// Is makes a refusal match ErrReplayRefused and, being one way of not
// being replayable, ErrNotReplayable.
func (e *ReplayRefusedError) Is(target error) bool {
	return target == ErrReplayRefused || target == ErrNotReplayable
}

func (e *ReplayRefusedError) Unwrap() error { return e.Err }

// guard decides which dead letters replay may republish. It holds
// copies of the configuration it needs, taken once by Open.
type guard struct {
	stream   string              // stream.name
	subjects []string            // stream.subjects
	prefix   string              // dead_letter.subject_prefix
	routes   map[string][]string // route name -> its subjects filters
}

func newGuard(cfg *config.Config) guard {
	g := guard{
		stream:   cfg.Stream.Name,
		subjects: append([]string(nil), cfg.Stream.Subjects...),
		prefix:   cfg.DeadLetter.SubjectPrefix,
		routes:   make(map[string][]string, len(cfg.Routes)),
	}
	for _, r := range cfg.Routes {
		g.routes[r.Name] = append([]string(nil), r.Subjects...)
	}
	return g
}

// check returns nil when d may be republished, else an error matching
// ErrNotReplayable (and ErrReplayRefused for every rule but a missing
// subject). A dead letter is republished only when all hold:
//   - Bridge-Original-Subject is a valid literal subject: printable UTF-8,
//     no whitespace or wildcards, no empty token, at most maxReplaySubject
//     bytes;
//   - it is not a system or internal subject: no first token starting
//     with "$" ($JS, $KV, $O, $SYS, ...), no _INBOX, nothing under the
//     dead-letter prefix, whatever stream.subjects says;
//   - Bridge-Original-Stream is stream.name;
//   - the subject is inside stream.subjects and, when Bridge-Route names a
//     configured route, inside that route's subjects;
//   - the dead letter was stored with its payload (no
//     Bridge-Payload-Omitted).
func (g guard) check(d Message) error {
	refuse := func(format string, args ...any) error {
		return &ReplayRefusedError{Seq: d.Seq, Subject: d.Subject, Reason: fmt.Sprintf(format, args...)}
	}
	s := d.Subject
	if s == "" {
		return notReplayable(d.Seq, "no "+HeaderOriginalSubject+" header")
	}
	if why := literalSubjectProblem(s); why != "" {
		return refuse("%s %s", HeaderOriginalSubject, why)
	}
	first, _, _ := strings.Cut(s, ".")
	if strings.HasPrefix(first, "$") {
		if what, ok := systemTokens[first]; ok {
			return refuse("%s is a NATS system subject (%s, %s)", HeaderOriginalSubject, first, what)
		}
		return refuse("%s is a NATS system subject (first token starts with \"$\")", HeaderOriginalSubject)
	}
	if first == "_INBOX" {
		return refuse("%s is a reply inbox (_INBOX)", HeaderOriginalSubject)
	}
	if g.prefix != "" && (s == g.prefix || strings.HasPrefix(s, g.prefix+".")) {
		return refuse("%s is under the dead-letter prefix %s", HeaderOriginalSubject, g.prefix)
	}
	switch stream := d.OriginalStream; {
	case stream == "":
		return refuse("no %s header (want %s)", HeaderOriginalStream, g.stream)
	case stream != g.stream:
		return refuse("%s is not the configured stream %s", HeaderOriginalStream, g.stream)
	}
	if !matchesAny(g.subjects, s) {
		return refuse("%s is outside stream %s's subjects %s", HeaderOriginalSubject, g.stream, strings.Join(g.subjects, ", "))
	}
	if filters, ok := g.routes[d.Route]; ok && !matchesAny(filters, s) {
		return refuse("%s is outside route %s's subjects %s", HeaderOriginalSubject, d.Route, strings.Join(filters, ", "))
	}
	if vs, ok := d.Header[HeaderPayloadOmitted]; ok {
		size := "size unknown"
		if len(vs) > 0 {
			if n, err := strconv.ParseUint(vs[0], 10, 64); err == nil {
				size = strconv.FormatUint(n, 10) + " bytes"
			}
		}
		where := "seq unknown"
		if d.OriginalSeq > 0 {
			where = "seq " + strconv.FormatUint(d.OriginalSeq, 10)
		}
		return refuse("stored without its payload (%s); read it from %s %s while the stream retains it", size, g.stream, where)
	}
	return nil
}

// literalSubjectProblem says what makes s unfit to publish to, or "".
// Stricter than the server: besides whitespace it refuses every control
// or invisible format character and invalid UTF-8, which only serve to
// hide what a subject is.
func literalSubjectProblem(s string) string {
	if len(s) > maxReplaySubject {
		return fmt.Sprintf("is longer than %d bytes", maxReplaySubject)
	}
	if !utf8.ValidString(s) {
		return "is not valid UTF-8"
	}
	for _, r := range s {
		if r <= ' ' || unicode.IsSpace(r) || unicode.IsControl(r) || unicode.Is(unicode.Cf, r) || !unicode.IsPrint(r) {
			return "contains whitespace, a control or an invisible character"
		}
	}
	for _, tok := range strings.Split(s, ".") {
		switch {
		case tok == "":
			return "has an empty token"
		case strings.ContainsAny(tok, "*>"):
			return "contains a wildcard"
		}
	}
	// Belt and braces: the subjects package agrees it is a literal subject.
	if subjects.ValidateSubject(s) != nil {
		return "is not a valid subject"
	}
	return ""
}

func matchesAny(filters []string, subject string) bool {
	for _, f := range filters {
		if subjects.Match(f, subject) {
			return true
		}
	}
	return false
}
