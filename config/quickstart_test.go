package config

import (
	"os"
	"testing"
)

// The quickstart file shipped beside the package must load with an empty
// environment: every variable in it has a default.
func TestQuickstartLoads(t *testing.T) {
	data, err := os.ReadFile("quickstart.yaml")
	if err != nil {
		t.Fatal(err)
	}
	c, err := loadWith(data, "quickstart.yaml", lookupIn(nil))
	if err != nil {
		t.Fatal(err)
	}
	if !c.Embedded() {
		t.Error("the quickstart does not use the embedded server")
	}
}
