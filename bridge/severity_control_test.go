package bridge

import "github.com/sotercare/jetbridge/subjects"

// headerWins gives a bridge the Event-Severity precedence it had before
// the subject decided: a valid header overrides the subject's severity
// token, and is never counted as a mismatch. The negative controls of
// severity_test.go inject it as the bridge's severity part.
func headerWins(b *Bridge) {
	b.parts.severity = func(header string, fromSubject subjects.Severity, _ bool) (subjects.Severity, string, error) {
		if header == "" {
			return fromSubject, "", nil
		}
		s, err := subjects.ParseSeverity(header)
		if err != nil {
			return fromSubject, "", &InvalidEventError{Reason: "Event-Severity is not INFO, WARNING or CRITICAL"}
		}
		return s, "", nil
	}
}
