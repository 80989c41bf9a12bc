package config

import (
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"strings"
)

// Secret is a string that must not be shown: a password, a token, a signing
// secret, a header value or a URL that may carry credentials. Every way of
// printing or encoding it (fmt verbs, JSON, YAML, text) gives "[redacted]",
// or "" when it is empty; Value returns the real value.
type Secret string

const redacted = "[redacted]"

// Value returns the secret itself, for the code that has to use it.
func (s Secret) Value() string { return string(s) }

// String returns "[redacted]", or "" for an empty secret.
func (s Secret) String() string {
	if s == "" {
		return ""
	}
	return redacted
}

// GoString redacts the %#v form.
func (s Secret) GoString() string { return "config.Secret(" + `"` + s.String() + `"` + ")" }

// Format redacts every fmt verb, including those that do not use String
// (%d, %t...), which would otherwise print the raw string in an error
// notation such as %!d(config.Secret=...).
func (s Secret) Format(f fmt.State, verb rune) {
	if verb == 'v' && f.Flag('#') {
		io.WriteString(f, s.GoString())
		return
	}
	fmt.Fprintf(f, fmt.FormatString(f, verb), s.String())
}

// String prints the destination with its secrets redacted. It matters for
// a *Destination inside a Config printed with %s or %q: fmt prints such a
// pointer as %!s(*config.Destination=&{...}) without calling any method of
// the fields inside, so without String every secret would show. (A Format
// method would cover every verb, but Destination has a field named Format;
// the verbs left out, such as %t, make no sense for a Config.)
func (d Destination) String() string {
	type plain Destination // no methods: no recursion
	return fmt.Sprintf("%+v", plain(d))
}

// Format prints the signing secrets redacted, whatever the verb (see
// Destination.String).
func (s Signing) Format(f fmt.State, verb rune) {
	type plain Signing
	fmt.Fprintf(f, fmt.FormatString(f, verb), plain(s))
}

// MarshalJSON encodes the redacted form.
func (s Secret) MarshalJSON() ([]byte, error) { return json.Marshal(s.String()) }

// MarshalText encodes the redacted form (text loggers, JSON map keys).
// There is deliberately no UnmarshalText: decoding reads the real value.
func (s Secret) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// MarshalYAML encodes the redacted form.
func (s Secret) MarshalYAML() (any, error) { return s.String(), nil }

// RedactedURL returns the secret read as a URL with its user info, query
// values and fragment masked ("xxxxx") and its scheme, host and path kept,
// e.g. https://xxxxx@example.com/hook?key=xxxxx. A comma-separated list of
// absolute URLs (as NATS accepts) is redacted element by element. A value
// that does not parse as a URL gives "[redacted]".
func (s Secret) RedactedURL() string {
	if s == "" {
		return ""
	}
	parts := strings.Split(string(s), ",")
	if len(parts) > 1 {
		out := make([]string, len(parts))
		for i, p := range parts {
			u, err := url.Parse(strings.TrimSpace(p))
			if err != nil || u.Scheme == "" || u.Host == "" {
				return redactURL(string(s)) // not a list: one URL with a comma
			}
			out[i] = redactURL(strings.TrimSpace(p))
		}
		return strings.Join(out, ",")
	}
	return redactURL(string(s))
}

func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Opaque != "" {
		return redacted
	}
	if u.User != nil {
		u.User = url.User("xxxxx")
	}
	if u.RawQuery != "" {
		q, _ := url.ParseQuery(u.RawQuery) // a malformed pair is dropped, not shown
		for _, vs := range q {
			for i := range vs {
				vs[i] = "xxxxx"
			}
		}
		u.RawQuery = q.Encode()
	}
	if u.Fragment != "" {
		u.Fragment, u.RawFragment = "xxxxx", ""
	}
	return u.String()
}

// ShownURL is the secret read as a URL the way operators see it (bridge
// check, logs, /status, span attributes): with paths false, its scheme and
// host only, and "/…" for whatever follows ("https://hooks.example.com/…"),
// since a webhook URL often carries its secret in the path (Slack,
// Discord); with paths true, RedactedURL (path kept, user info and query
// values masked). A value that does not parse as a URL gives "[redacted]".
func (s Secret) ShownURL(paths bool) string {
	if paths || s == "" {
		return s.RedactedURL()
	}
	u, err := url.Parse(string(s))
	if err != nil || u.Opaque != "" || u.Host == "" {
		return redacted
	}
	shown := url.URL{Scheme: u.Scheme, Host: u.Host}
	if (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" {
		return shown.String() + "/…"
	}
	return shown.String()
}

// SensitiveHeader reports whether the value of the HTTP header name must be
// treated as a secret: Authorization, Proxy-Authorization, Cookie,
// Set-Cookie, or any name containing Key, Token or Secret, in any case.
func SensitiveHeader(name string) bool {
	n := strings.ToLower(name)
	switch n {
	case "authorization", "proxy-authorization", "cookie", "set-cookie":
		return true
	}
	return strings.Contains(n, "key") || strings.Contains(n, "token") || strings.Contains(n, "secret")
}
