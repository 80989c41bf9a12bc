package subjects_test

import (
	"fmt"

	"github.com/sotercare/jetbridge/subjects"
)

// An event's subject is <root>.<severity>.<type>; Describe reads the type
// and severity back.
func ExampleName() {
	s, err := subjects.Name("events", subjects.Critical, "sensor.fall")
	if err != nil {
		fmt.Println(err)
		return
	}
	typ, sev := subjects.Describe(s)
	fmt.Println(s, typ, sev)
	// Output:
	// events.critical.sensor.fall sensor.fall CRITICAL
}

// Match, Covers and Overlap follow the server's wildcards: "*" is one
// token, ">" one or more trailing tokens.
func ExampleMatch() {
	fmt.Println(subjects.Match("events.*.sensor.>", "events.critical.sensor.fall"))
	fmt.Println(subjects.Match("events.>", "events"))
	fmt.Println(subjects.Covers("events.>", "events.critical.>"))
	fmt.Println(subjects.Overlap("events.*.sensor.>", "events.critical.>"))
	// Output:
	// true
	// false
	// true
	// true
}

// An ordered route keyed by the fourth token: one patient's events land
// in one partition, whatever their severity, and the transforms tell the
// server to store them as <partition>.<subject> in the route's copy.
func ExamplePartitioner() {
	p, err := subjects.NewPartitioner([]string{"events.*.care.>"}, 16, []int{4})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, tr := range p.Transforms() {
		fmt.Println(tr.Source, "->", tr.Destination)
	}
	a, _ := p.Partition("events.critical.care.p1.fall")
	b, _ := p.Partition("events.info.care.p1.resolved")
	fmt.Println(p.Key("events.critical.care.p1.fall"), a == b)
	// Output:
	// events.*.care.* -> {{partition(16,2)}}.events.{{wildcard(1)}}.care.{{wildcard(2)}}
	// events.*.care.*.> -> {{partition(16,2)}}.events.{{wildcard(1)}}.care.{{wildcard(2)}}.>
	// p1 true
}
