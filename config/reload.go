package config

import (
	"reflect"
	"strings"
)

// restartSections are the top-level keys whose values are used only at
// start (connections, streams, buckets, servers and the logger are made
// from them once): a change to any of them needs a restart
// (docs/configuration.md#what-a-reload-applies).
var restartSections = []string{"nats", "stream", "dead_letter", "idempotency", "admin", "log", "tracing"}

// RestartKeys returns the key paths (such as "stream.max_age" or
// "nats.url") whose values differ between running and next and cannot be
// applied to a running bridge, in the order of the file's sections; nil
// when next can be applied live. Values are compared, never returned, so
// a path is safe to log (it names a key, not its value).
//
// Destinations, routes and shutdown_timeout are not listed: a running
// bridge applies them (bridge.Reload). Whether a route may turn
// idempotency on without a restart depends on what the running bridge has
// provisioned, so the bridge decides that one itself.
func RestartKeys(running, next *Config) []string {
	var keys []string
	rv, nv := reflect.ValueOf(running).Elem(), reflect.ValueOf(next).Elem()
	t := rv.Type()
	for _, section := range restartSections {
		for i := range t.NumField() {
			f := t.Field(i)
			if yamlName(f) == section {
				keys = diffPaths(keys, section, rv.Field(i), nv.Field(i))
			}
		}
	}
	return keys
}

// diffPaths appends to keys the paths under path where a and b differ,
// down to the leaves of structs (lists, maps and scalars compare whole).
func diffPaths(keys []string, path string, a, b reflect.Value) []string {
	if a.Kind() != reflect.Struct {
		if !reflect.DeepEqual(a.Interface(), b.Interface()) {
			keys = append(keys, path)
		}
		return keys
	}
	for i := range a.NumField() {
		f := a.Type().Field(i)
		if !f.IsExported() {
			continue
		}
		name := yamlName(f)
		if name == "" || name == "-" {
			continue
		}
		keys = diffPaths(keys, path+"."+name, a.Field(i), b.Field(i))
	}
	return keys
}

// yamlName is the key of a struct field in the file.
func yamlName(f reflect.StructField) string {
	name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
	return name
}
