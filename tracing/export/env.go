package export

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"net/url"
	"os"
	"strconv"
	"strings"
	"unicode"
)

// EnvError is a malformed OTEL_* variable: its name and what is wrong with
// the form of its value. It never holds the value, nor any part of it
// (exporter headers and endpoint user info are secrets).
type EnvError struct {
	Var     string
	Problem string
}

func (e *EnvError) Error() string { return e.Var + ": " + e.Problem }

// otlpVars are the OTEL_EXPORTER_OTLP_ suffixes the exporters read, each
// also as TRACES_<suffix>.
var otlpVars = []string{"ENDPOINT", "HEADERS", "TIMEOUT", "PROTOCOL", "COMPRESSION", "INSECURE", "CERTIFICATE", "CLIENT_CERTIFICATE", "CLIENT_KEY"}

// limitVars are the span limits of the SDK: whole numbers (negative:
// unlimited).
var limitVars = []string{
	"OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "OTEL_ATTRIBUTE_COUNT_LIMIT",
	"OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT",
	"OTEL_SPAN_EVENT_COUNT_LIMIT", "OTEL_EVENT_ATTRIBUTE_COUNT_LIMIT",
	"OTEL_SPAN_LINK_COUNT_LIMIT", "OTEL_LINK_ATTRIBUTE_COUNT_LIMIT",
}

// CheckedVariables are the variables CheckEnv checks, in its order.
func CheckedVariables() []string {
	vars := []string{"OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER"}
	for _, prefix := range []string{"OTEL_EXPORTER_OTLP_", "OTEL_EXPORTER_OTLP_TRACES_"} {
		for _, s := range otlpVars {
			vars = append(vars, prefix+s)
		}
	}
	vars = append(vars, "OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG",
		"OTEL_BSP_SCHEDULE_DELAY", "OTEL_BSP_EXPORT_TIMEOUT", "OTEL_BSP_MAX_QUEUE_SIZE", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE")
	vars = append(vars, limitVars...)
	return append(vars, "OTEL_RESOURCE_ATTRIBUTES", "OTEL_SERVICE_NAME")
}

// CheckEnv checks the form of every OTEL_* variable the SDK and the
// exporters read (CheckedVariables) and returns one error per malformed
// variable, in the order of CheckedVariables. The SDK itself would log a
// malformed value in full (a header value, an endpoint's password) and go
// on with its default; CheckEnv says what is wrong without quoting it.
// An empty variable is unset.
func CheckEnv() []*EnvError { return checkEnv(os.Getenv, os.ReadFile) }

func checkEnv(getenv func(string) string, readFile func(string) ([]byte, error)) []*EnvError {
	var out []*EnvError
	for _, name := range CheckedVariables() {
		raw := getenv(name)
		if raw == "" {
			continue
		}
		if why := checkVar(name, raw, getenv, readFile); why != "" {
			out = append(out, &EnvError{Var: name, Problem: why})
		}
	}
	return out
}

const (
	wantURL     = "want an http:// or https:// URL with a host, e.g. http://127.0.0.1:4318"
	wantPairs   = "want comma-separated key=value pairs with percent-encoded values"
	wantBool    = "want true or false"
	wantMillis  = "want a whole number of milliseconds, 0 or more"
	wantSampler = "want always_on, always_off, traceidratio, parentbased_always_on, parentbased_always_off or parentbased_traceidratio"
)

// checkVar is what is wrong with the form of name's value raw, or "". The
// OTLP exporters and the sampler trim spaces; the BSP and limit variables
// are read as they are.
func checkVar(name, raw string, getenv func(string) string, readFile func(string) ([]byte, error)) string {
	v := strings.TrimSpace(raw)
	if suffix, ok := strings.CutPrefix(name, "OTEL_EXPORTER_OTLP_"); ok {
		suffix = strings.TrimPrefix(suffix, "TRACES_")
		if v == "" {
			if suffix == "ENDPOINT" { // Enabled counts it as set
				return "is blank; " + wantURL
			}
			return "" // the exporters read it as unset
		}
		return checkOTLP(name, suffix, v, getenv, readFile)
	}
	switch name {
	case "OTEL_SDK_DISABLED":
		if !strings.EqualFold(v, "true") && !strings.EqualFold(v, "false") {
			return wantBool
		}
	case "OTEL_TRACES_EXPORTER":
		if raw != "otlp" && raw != "console" && raw != "none" {
			return "want otlp, console or none"
		}
	case "OTEL_TRACES_SAMPLER":
		switch strings.ToLower(v) {
		case "", "always_on", "always_off", "traceidratio", "parentbased_always_on", "parentbased_always_off", "parentbased_traceidratio":
		default:
			return wantSampler
		}
	case "OTEL_TRACES_SAMPLER_ARG":
		if v == "" {
			return ""
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || math.IsNaN(f) || f < 0 || f > 1 {
			return "want a number from 0 to 1 (the sampled ratio)"
		}
	case "OTEL_BSP_SCHEDULE_DELAY":
		if n, err := strconv.Atoi(raw); err != nil || n <= 0 {
			return "want a whole number of milliseconds, 1 or more"
		}
	case "OTEL_BSP_EXPORT_TIMEOUT":
		if n, err := strconv.Atoi(raw); err != nil || n < 0 {
			return wantMillis
		}
	case "OTEL_BSP_MAX_QUEUE_SIZE", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE":
		if n, err := strconv.Atoi(raw); err != nil || n <= 0 {
			return "want a whole number, 1 or more"
		}
	case "OTEL_RESOURCE_ATTRIBUTES":
		if v == "" {
			return ""
		}
		return checkPairs(v, func(k string) bool { return k != "" }, "the key is empty")
	case "OTEL_SERVICE_NAME":
		if v == "" {
			return "is blank; want a service name"
		}
		if strings.ContainsFunc(v, unicode.IsControl) {
			return "has a control character; want a service name"
		}
	default: // limitVars
		if _, err := strconv.Atoi(raw); err != nil {
			return "want a whole number (negative: no limit)"
		}
	}
	return ""
}

// checkOTLP checks OTEL_EXPORTER_OTLP_[TRACES_]<suffix> = v (trimmed, not
// empty) as the exporters read it.
func checkOTLP(name, suffix, v string, getenv func(string) string, readFile func(string) ([]byte, error)) string {
	switch suffix {
	case "ENDPOINT":
		u, err := url.Parse(v)
		if err != nil {
			return "does not parse as a URL; " + wantURL
		}
		if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return wantURL
		}
	case "HEADERS":
		return checkPairs(v, isToken, "the key is not an HTTP header name")
	case "TIMEOUT":
		if n, err := strconv.Atoi(v); err != nil || n < 0 {
			return wantMillis
		}
	case "PROTOCOL":
		if v != "http/protobuf" && v != "grpc" {
			return "want http/protobuf or grpc"
		}
	case "COMPRESSION":
		if v != "gzip" && v != "none" {
			return "want gzip or none"
		}
	case "INSECURE":
		if !strings.EqualFold(v, "true") && !strings.EqualFold(v, "false") {
			return wantBool
		}
	case "CERTIFICATE":
		b, err := readFile(v)
		if err != nil {
			return "the file it names " + readProblem(err)
		}
		if !x509.NewCertPool().AppendCertsFromPEM(b) {
			return "the file it names holds no PEM certificate"
		}
	case "CLIENT_CERTIFICATE", "CLIENT_KEY":
		pairName := strings.TrimSuffix(name, "CLIENT_CERTIFICATE") + "CLIENT_KEY"
		if suffix == "CLIENT_KEY" {
			pairName = strings.TrimSuffix(name, "CLIENT_KEY") + "CLIENT_CERTIFICATE"
		}
		pair := strings.TrimSpace(getenv(pairName))
		if pair == "" {
			return "is set without " + pairName + "; set both or neither"
		}
		b, err := readFile(v)
		if err != nil {
			return "the file it names " + readProblem(err)
		}
		if suffix == "CLIENT_KEY" {
			return "" // the pair is checked once, under CLIENT_CERTIFICATE
		}
		key, err := readFile(pair)
		if err != nil {
			return "" // reported under CLIENT_KEY
		}
		if _, err := tls.X509KeyPair(b, key); err != nil {
			return "the file it names and that of " + pairName + " are not a PEM certificate and its private key"
		}
	}
	return ""
}

// readProblem says why a file could not be read, without its path.
func readProblem(err error) string {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "does not exist"
	case errors.Is(err, fs.ErrPermission):
		return "cannot be read (permission denied)"
	}
	var pe *fs.PathError
	if errors.As(err, &pe) && pe.Err != nil {
		return "cannot be read (" + pe.Err.Error() + ")"
	}
	return "cannot be read"
}

// checkPairs checks a W3C-baggage-like list as the SDK splits it:
// comma-separated key=value entries, keys trimmed and accepted by keyOK,
// values percent-decoded (url.PathUnescape) to text without control
// characters. Entries are numbered from 1.
func checkPairs(v string, keyOK func(string) bool, badKey string) string {
	for i, entry := range strings.Split(v, ",") {
		k, val, found := strings.Cut(entry, "=")
		if !found {
			if strings.TrimSpace(entry) == "" {
				return fmt.Sprintf("entry %d is empty; %s", i+1, wantPairs)
			}
			return fmt.Sprintf("entry %d has no '='; %s", i+1, wantPairs)
		}
		if !keyOK(strings.TrimSpace(k)) {
			return fmt.Sprintf("entry %d: %s; %s", i+1, badKey, wantPairs)
		}
		dec, err := url.PathUnescape(strings.TrimSpace(val))
		if err != nil {
			return fmt.Sprintf("entry %d: the value is not percent-encoded correctly (write %% as %%25); %s", i+1, wantPairs)
		}
		if strings.ContainsFunc(dec, func(r rune) bool { return unicode.IsControl(r) && r != '\t' }) {
			return fmt.Sprintf("entry %d: the value holds a control character once decoded; %s", i+1, wantPairs)
		}
	}
	return ""
}

// isToken reports whether k is an HTTP header name (an RFC 9110 token),
// as the exporters require.
func isToken(k string) bool {
	if k == "" {
		return false
	}
	for _, c := range k {
		ok := c < unicode.MaxASCII && (c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			strings.ContainsRune("!#$%&'*+-.^_`|~", c))
		if !ok {
			return false
		}
	}
	return true
}
