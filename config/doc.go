// Package config owns the bridge's configuration file: it decodes the YAML
// strictly (unknown keys are errors), resolves references in its values,
// applies every default in one place (defaults.go), validates the result
// and redacts secrets whenever a value is printed or encoded.
//
// References: inside any scalar value (plain, quoted or block; never in a
// key), ${VAR} and ${VAR:-default} take a value from the environment and
// ${file:PATH} the content of a file (Kubernetes Secret volumes, systemd
// LoadCredential with ${file:${CREDENTIALS_DIRECTORY}/name}). PATH may hold
// ${VAR} references; a relative PATH is relative to the configuration
// file's directory; exactly one trailing newline (\n or \r\n) is dropped;
// the file must be a regular file of at most MaxSecretFileSize bytes. $${
// is a literal ${. An unset ${VAR} without a default is an error naming VAR
// and the line.
//
// References are resolved in the parsed tree, after parsing and before
// decoding, so a value is data, never YAML: whatever a variable or a file
// holds becomes exactly the text of the scalar that refers to it, and can
// never add a key, an anchor, an alias, a tag, a comment or a list item.
// A plain scalar with references is then read as YAML reads a plain
// scalar's text (max_in_flight: ${N} is an integer; only an empty value is
// null); a quoted one is a string. Line numbers are those of the file.
//
// Invariant: a *Config returned by Load or LoadFile is complete and valid —
// every default is filled in and Validate has passed — so the rest of the
// bridge may treat an impossible value as a programmer error. When loading
// fails, the error is a *ValidationError listing every problem, each a
// *FieldError that names the file, line and key path where they are known.
// No error text ever contains a secret, nor any value that came from the
// environment or a file: such a value is named by its reference ("the
// value of ${N}"), and a file that cannot be read by its path.
//
// The package does no I/O beyond reading the file handed to LoadFile and
// the files its ${file:PATH} references name, and imports only the
// standard library, go.yaml.in/yaml/v3 and subjects.
package config
