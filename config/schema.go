package config

// schema.json beside this file is the JSON Schema of the configuration
// file, generated from the types of this package by ./schemagen
// (docs/configuration.md#editor-support); config/schemagen's tests fail
// while it is not current.
//go:generate go run ./schemagen -root .. -o schema.json
