package config

import (
	"fmt"
	"time"

	"go.yaml.in/yaml/v3"
)

// The map and list items below use the legacy form of UnmarshalYAML
// (func(any) error): yaml.v3 then decodes them with the same strict decoder
// as the rest of the file, so an unknown key inside a destination or a route
// is still an error. yaml.Node.Decode would not be strict.

// UnmarshalYAML decodes a destination over its defaults.
func (d *Destination) UnmarshalYAML(unmarshal func(any) error) error {
	type plain Destination
	p := plain(defaultDestination())
	if err := unmarshal(&p); err != nil {
		return err
	}
	*d = Destination(p)
	return nil
}

// UnmarshalYAML decodes a status_retry block over its defaults.
func (s *StatusRetry) UnmarshalYAML(unmarshal func(any) error) error {
	type plain StatusRetry
	p := plain(defaultStatusRetry())
	if err := unmarshal(&p); err != nil {
		return err
	}
	*s = StatusRetry(p)
	return nil
}

// UnmarshalYAML decodes a rate_limit block over its defaults.
func (r *RateLimit) UnmarshalYAML(unmarshal func(any) error) error {
	type plain RateLimit
	p := plain(RateLimit{Per: Duration(time.Second), Burst: 1})
	if err := unmarshal(&p); err != nil {
		return err
	}
	*r = RateLimit(p)
	return nil
}

// UnmarshalYAML decodes a concurrency block over its defaults.
func (c *Concurrency) UnmarshalYAML(unmarshal func(any) error) error {
	type plain Concurrency
	p := plain(Concurrency{Min: 1})
	if err := unmarshal(&p); err != nil {
		return err
	}
	*c = Concurrency(p)
	return nil
}

// UnmarshalYAML decodes a retry_budget block over its defaults.
func (b *RetryBudget) UnmarshalYAML(unmarshal func(any) error) error {
	type plain RetryBudget
	p := plain(RetryBudget{Ratio: 0.2, MinPerSecond: 10})
	if err := unmarshal(&p); err != nil {
		return err
	}
	*b = RetryBudget(p)
	return nil
}

// UnmarshalYAML decodes a route over its defaults.
func (r *Route) UnmarshalYAML(unmarshal func(any) error) error {
	type plain Route
	p := plain(defaultRoute())
	if err := unmarshal(&p); err != nil {
		return err
	}
	*r = Route(p)
	return nil
}

// UnmarshalYAML accepts secret as one string or as a list (rotation).
func (s *Signing) UnmarshalYAML(unmarshal func(any) error) error {
	var raw struct {
		Secret secretList `yaml:"secret"`
	}
	if err := unmarshal(&raw); err != nil {
		return err
	}
	s.Secrets = raw.Secret
	return nil
}

type secretList []Secret

func (l *secretList) UnmarshalYAML(n *yaml.Node) error {
	switch n.Kind {
	case yaml.ScalarNode:
		*l = secretList{Secret(n.Value)}
		return nil
	case yaml.SequenceNode:
		out := make(secretList, 0, len(n.Content))
		for _, c := range n.Content {
			if c.Kind != yaml.ScalarNode {
				return typeError(c, "cannot unmarshal %s into config.Secret", c.ShortTag())
			}
			out = append(out, Secret(c.Value))
		}
		*l = out
		return nil
	}
	return typeError(n, "cannot unmarshal %s into config.secretList", n.ShortTag())
}

// UnmarshalYAML parses a Go duration string such as "250ms" or "2m".
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return typeError(n, "cannot unmarshal %s into config.Duration", n.ShortTag())
	}
	v, err := time.ParseDuration(n.Value)
	if err != nil {
		return typeError(n, "invalid duration %q: want a Go duration such as 250ms or 2m", n.Value)
	}
	*d = Duration(v)
	return nil
}

// MarshalYAML writes d as a Go duration string.
func (d Duration) MarshalYAML() (any, error) { return d.String(), nil }

// MarshalText writes d as a Go duration string (JSON, text logs).
func (d Duration) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// UnmarshalText parses a Go duration string.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return fmt.Errorf("invalid duration %q: want a Go duration such as 250ms or 2m", b)
	}
	*d = Duration(v)
	return nil
}

// String formats d like time.Duration.
func (d Duration) String() string { return time.Duration(d).String() }

// typeError reports a decoding problem the way yaml.v3 does, so that the
// decoder keeps going and Load reports it with the others. Messages follow
// yaml.v3's wording ("cannot unmarshal !!seq into T") or quote the bad
// value, so that Load can find the key path (see index.decodeErrors).
func typeError(n *yaml.Node, format string, args ...any) error {
	return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: ", n.Line) + fmt.Sprintf(format, args...)}}
}
