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
