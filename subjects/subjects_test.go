package subjects

import (
	"errors"
	"slices"
	"testing"
)

func TestValidate(t *testing.T) {
	tests := []struct {
		name      string
		in        string
		subjectOK bool
		filterOK  bool
	}{
		{"literal", "events.critical.sensor.fall", true, true},
		{"single token", "events", true, true},
		{"star", "events.*.sensor", false, true},
		{"gt last", "events.>", false, true},
		{"gt middle", "events.>.x", false, false},
		{"empty", "", false, false},
		{"empty token", "events..x", false, false},
		{"trailing dot", "events.", false, false},
		{"leading dot", ".events", false, false},
		{"space", "events.crit ical", false, false},
		{"tab", "events.a\tb", false, false},
		{"newline", "events.a\nb", false, false},
		{"partial wildcard", "events.a*", false, false},
		{"partial gt", "events.a>", false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := ValidateSubject(tt.in); (err == nil) != tt.subjectOK {
				t.Errorf("ValidateSubject(%q) = %v, want ok=%v", tt.in, err, tt.subjectOK)
			} else if err != nil && !errors.Is(err, ErrInvalid) {
				t.Errorf("ValidateSubject(%q) error %v does not match ErrInvalid", tt.in, err)
			}
			if err := ValidateFilter(tt.in); (err == nil) != tt.filterOK {
				t.Errorf("ValidateFilter(%q) = %v, want ok=%v", tt.in, err, tt.filterOK)
			}
		})
	}
}

func TestMatchCoversOverlap(t *testing.T) {
	tests := []struct {
		a, b             string
		covers, overlaps bool // Covers(a, b), Overlap(a, b)
	}{
		{"events.>", "events.critical.sensor.fall", true, true},
		{"events.>", "events", false, false},
		{"events.>", "events.*", true, true},
		{"events.>", "events.>", true, true},
		{"events.*", "events.>", false, true},
		{"events.*.sensor", "events.critical.sensor", true, true},
		{"events.*.sensor", "events.critical.sensor.fall", false, false},
		{"events.critical.>", "events.warning.>", false, false},
		{"events.critical.>", "events.*.sensor", false, true},
		{"events.a", "events.a", true, true},
		{"events.a", "events.b", false, false},
		{"events.a", "events.a.b", false, false},
		{"x.>", "x.a", true, true},
		{"other.>", "events.a", false, false},
		{"*", "events", true, true},
		{"*", "events.a", false, false},
		{">", "events.a.b", true, true},
	}
	for _, tt := range tests {
		if got := Covers(tt.a, tt.b); got != tt.covers {
			t.Errorf("Covers(%q, %q) = %v, want %v", tt.a, tt.b, got, tt.covers)
		}
		if got := Overlap(tt.a, tt.b); got != tt.overlaps {
			t.Errorf("Overlap(%q, %q) = %v, want %v", tt.a, tt.b, got, tt.overlaps)
		}
		if got := Overlap(tt.b, tt.a); got != tt.overlaps {
			t.Errorf("Overlap(%q, %q) = %v, want %v (symmetry)", tt.b, tt.a, got, tt.overlaps)
		}
	}
	if !Match("events.*.sensor.>", "events.critical.sensor.fall") {
		t.Error("Match with * and > failed")
	}
	if Match("events.*.sensor.>", "events.critical.sensor") {
		t.Error("> matched zero tokens")
	}
}

func TestNameAndDescribe(t *testing.T) {
	s, err := Name("events", Critical, "sensor.fall")
	if err != nil || s != "events.critical.sensor.fall" {
		t.Fatalf("Name = %q, %v", s, err)
	}
	if _, err := Name("events", "loud", "x"); err == nil {
		t.Error("Name accepted an unknown severity")
	}
	if _, err := Name("events", Info, "bad type"); err == nil {
		t.Error("Name accepted whitespace in the type")
	}
	if _, err := Name("events", Info, ""); err == nil {
		t.Error("Name accepted an empty type")
	}
	tests := []struct {
		subject, typ string
		sev          Severity
	}{
		{"events.critical.sensor.fall", "sensor.fall", Critical},
		{"events.warning.order", "order", Warning},
		{"events.info.a.b.c", "a.b.c", Info},
		{"events.CRITICAL.x", "events.CRITICAL.x", Info}, // tokens are lowercase in the scheme
		{"events.other.x", "events.other.x", Info},
		{"orders.created", "orders.created", Info},
	}
	for _, tt := range tests {
		typ, sev := Describe(tt.subject)
		if typ != tt.typ || sev != tt.sev {
			t.Errorf("Describe(%q) = %q, %q; want %q, %q", tt.subject, typ, sev, tt.typ, tt.sev)
		}
	}
	for _, in := range []string{"info", "INFO", "Warning", "critical"} {
		if _, err := ParseSeverity(in); err != nil {
			t.Errorf("ParseSeverity(%q): %v", in, err)
		}
	}
	if got := DeadLetter("dlq", "alerts", "events.critical.x"); got != "dlq.alerts.events.critical.x" {
		t.Errorf("DeadLetter = %q", got)
	}
}

func TestTable(t *testing.T) {
	tab, err := NewTable([]Route{
		{Name: "critical", Subjects: []string{"events.critical.>"}},
		{Name: "sensors", Subjects: []string{"events.*.sensor.>", "events.info.x"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := tab.Lookup("events.critical.sensor.fall"); !slices.Equal(got, []string{"critical", "sensors"}) {
		t.Errorf("Lookup = %v", got)
	}
	if got := tab.Lookup("events.info.x"); !slices.Equal(got, []string{"sensors"}) {
		t.Errorf("Lookup = %v", got)
	}
	if got := tab.Lookup("events.info.y"); got != nil {
		t.Errorf("Lookup = %v, want none", got)
	}
	if _, err := NewTable([]Route{{Name: "bad", Subjects: []string{"events.>.x"}}}); err == nil {
		t.Error("NewTable accepted an invalid filter")
	}
}
