package config

import (
	"encoding/base64"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// DestinationNames returns the names of the destinations, sorted.
func (c *Config) DestinationNames() []string {
	return slices.Sorted(maps.Keys(c.Destinations))
}

// Embedded reports whether the bridge starts its own JetStream server, that
// is whether nats.url is empty.
func (c *Config) Embedded() bool { return c.NATS.URL == "" }

// BackoffFor returns the delay before the redelivery that follows delivery
// number delivered (1-based): Backoff[delivered-1], the last entry repeating.
// It returns 0 when Backoff is empty.
func (r *Route) BackoffFor(delivered int) time.Duration {
	return BackoffAt(r.Backoff, uint64(max(delivered, 0)))
}

// BackoffAt is the one definition of a redelivery schedule's lookup: the
// delay before the redelivery that follows delivery number delivered
// (1-based; 0 counts as 1), list[delivered-1] with the last entry
// repeating, 0 for an empty list.
func BackoffAt[D ~int64](list []D, delivered uint64) time.Duration {
	if len(list) == 0 {
		return 0
	}
	i := min(max(delivered, 1)-1, uint64(len(list)-1))
	return time.Duration(list[i])
}

// Keys returns the HMAC keys of the signing secrets, in order: the base64
// decoding of a "whsec_" secret, or the bytes of any other. For a Config
// returned by Load it never fails.
func (s *Signing) Keys() ([][]byte, error) {
	keys := make([][]byte, 0, len(s.Secrets))
	for i, sec := range s.Secrets {
		k, err := signingKey(sec)
		if err != nil {
			return nil, fmt.Errorf("signing secret %d %w", i, err)
		}
		keys = append(keys, k)
	}
	return keys, nil
}

const signingPrefix = "whsec_"

var errSigningBase64 = errors.New("is not valid base64 after the whsec_ prefix")

// signingKey decodes a signing secret. Its error never contains the secret.
func signingKey(s Secret) ([]byte, error) {
	v, ok := strings.CutPrefix(s.Value(), signingPrefix)
	if !ok {
		return []byte(v), nil
	}
	if k, err := base64.StdEncoding.DecodeString(v); err == nil {
		return k, nil
	}
	if k, err := base64.RawStdEncoding.DecodeString(v); err == nil {
		return k, nil
	}
	return nil, errSigningBase64
}
