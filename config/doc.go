// Package config owns the bridge's configuration file: it expands ${VAR}
// references from the environment, decodes the YAML strictly (unknown keys
// are errors), applies every default in one place (defaults.go), validates
// the result and redacts secrets whenever a value is printed or encoded.
//
// Invariant: a *Config returned by Load or LoadFile is complete and valid —
// every default is filled in and Validate has passed — so the rest of the
// bridge may treat an impossible value as a programmer error. When loading
// fails, the error is a *ValidationError listing every problem, each a
// *FieldError that names the file, line and key path where they are known.
// No error text ever contains a secret.
//
// The package does no I/O beyond reading the file handed to LoadFile, and
// imports only the standard library, go.yaml.in/yaml/v3 and subjects.
package config
