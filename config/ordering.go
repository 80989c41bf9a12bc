package config

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sotercare/jetbridge/subjects"
)

// Ordering makes a route deliver the messages of one key in order
// (docs/configuration.md#routes): a message is sent only after the
// previous message of its key is settled, and different keys go
// concurrently. The route's messages are spread over Partitions partitions
// by their key, each owned by one live replica at a time.
type Ordering struct {
	// Key is what the messages are ordered by: the whole subject, or
	// some of its tokens.
	Key OrderingKey `yaml:"key"`
	// Partitions is the number of partitions, 1 to 256 (MaxPartitions).
	Partitions int `yaml:"partitions"`
	// OnDeadLetter is what a dead letter does to its key: continue with
	// its next message, or block the key until the dead letter is
	// replayed or purged.
	OnDeadLetter string `yaml:"on_dead_letter"`
}

// Values of Ordering.OnDeadLetter.
const (
	OnDeadLetterContinue = "continue"
	OnDeadLetterBlock    = "block"
)

// Bounds of an ordering block.
const (
	// MaxPartitions bounds ordering.partitions: each partition is a
	// durable consumer of the route's partitioned copy.
	MaxPartitions = 256
	// DefaultPartitions is ordering.partitions when the key is absent.
	DefaultPartitions = 16
)

// OrderingKey is the key of an ordered route: the whole subject (Tokens
// nil, written `key: subject`) or the subject tokens at the 1-based
// positions of Tokens, joined with "." (written `key: {tokens: [3, 4]}`).
// It has no yaml-tagged field: it decodes itself from either form.
type OrderingKey struct {
	Tokens []int
	// word is a scalar other than "subject", kept for Validate to report.
	word string
}

// IsSubject reports whether the key is the whole subject.
func (k OrderingKey) IsSubject() bool { return k.Tokens == nil }

// String is the key as it is written: "subject" or "tokens [3 4]".
func (k OrderingKey) String() string {
	if k.IsSubject() {
		return "subject"
	}
	return fmt.Sprintf("tokens %v", k.Tokens)
}

// UnmarshalYAML reads `subject` or a mapping with the one key tokens. A
// scalar other than subject is kept for Validate, which reports it with
// its key path; an unknown key of the mapping is an error as elsewhere.
func (k *OrderingKey) UnmarshalYAML(n *yaml.Node) error {
	switch n.Kind {
	case yaml.ScalarNode:
		*k = OrderingKey{}
		if n.Value != "subject" {
			k.word = n.Value
		}
		return nil
	case yaml.MappingNode:
		out := OrderingKey{Tokens: []int{}}
		var errs []string
		for i := 0; i+1 < len(n.Content); i += 2 {
			key, val := n.Content[i], n.Content[i+1]
			if key.Value != "tokens" {
				errs = append(errs, fmt.Sprintf("line %d: field %s not found in type config.OrderingKey", key.Line, key.Value))
				continue
			}
			if val.Kind != yaml.SequenceNode {
				what := strings.TrimPrefix(val.ShortTag(), "!!")
				if val.Kind == yaml.ScalarNode {
					what += " `" + val.Value + "`" // as yaml.v3 words it, so that Load finds the key
				}
				errs = append(errs, fmt.Sprintf("line %d: cannot unmarshal !!%s into []int", val.Line, what))
				continue
			}
			var toks []int
			if err := val.Decode(&toks); err != nil {
				var te *yaml.TypeError
				if errors.As(err, &te) {
					errs = append(errs, te.Errors...)
					continue
				}
				return err
			}
			out.Tokens = append(toks[:0:0], toks...)
		}
		if len(errs) > 0 {
			return &yaml.TypeError{Errors: errs}
		}
		*k = out
		return nil
	}
	return typeError(n, "cannot unmarshal %s into config.OrderingKey", n.ShortTag())
}

// MarshalYAML writes the key as it is read.
func (k OrderingKey) MarshalYAML() (any, error) {
	if k.IsSubject() {
		return "subject", nil
	}
	return map[string][]int{"tokens": k.Tokens}, nil
}

// UnmarshalYAML decodes an ordering block over its defaults.
func (o *Ordering) UnmarshalYAML(unmarshal func(any) error) error {
	type plain Ordering
	p := plain(defaultOrdering())
	if err := unmarshal(&p); err != nil {
		return err
	}
	*o = Ordering(p)
	return nil
}

// defaultOrdering fills an ordering block that is present; an absent one
// stays nil (the route is unordered).
func defaultOrdering() Ordering {
	return Ordering{Partitions: DefaultPartitions, OnDeadLetter: OnDeadLetterContinue}
}

// CopyStream names the partitioned copy of stream that an ordered route
// delivers from: <stream>-<route>.
func CopyStream(stream, route string) string { return stream + "-" + route }

// StateBucket is the key-value bucket of the bridge's shared state for the
// source stream (fleet flow control, ordered routes' presence and block
// records): <stream>_BRIDGE.
func StateBucket(stream string) string { return stream + "_BRIDGE" }

// BlockRecordPrefix is the key prefix, in StateBucket, of the block
// records of ordered route route (on_dead_letter: block): a record
// ord.<route>.blocked.<id> holds the key and the dead letter that blocks
// it (docs/delivery.md#ordered-delivery).
func BlockRecordPrefix(route string) string { return "ord." + route + ".blocked." }

// MaxBlockRecord bounds a block record read back from StateBucket (one is
// a key and a sequence: far smaller); a larger one is ignored.
const MaxBlockRecord = 64 << 10

// ordering checks the ordering block of r, the route at path p: its key
// against the route's subjects (subjects.NewPartitioner's rules), its
// partitions and on_dead_letter, that its copy's name is not taken by a
// stream of the configuration, and that its destination's timeout leaves
// room in a partition's lease (OrderedMaxTimeout).
func (v *validator) ordering(c *Config, p string, r *Route) {
	o := r.Ordering
	if o == nil {
		return
	}
	op := p + ".ordering"
	if validName(r.Name) {
		cp := CopyStream(c.Stream.Name, r.Name)
		switch cp {
		case c.DeadLetter.Stream:
			v.addf(op, "the route's partitioned copy would be stream %s, which is dead_letter.stream: rename the route or the dead-letter stream", v.q("dead_letter.stream", cp))
		case "KV_" + c.Idempotency.Bucket:
			v.addf(op, "the route's partitioned copy would be stream %s, the idempotency bucket's stream: rename the route or the bucket", v.q("idempotency.bucket", cp))
		}
	}
	kp := op + ".key"
	switch {
	case o.Key.word != "":
		v.addf(kp, "must be subject or {tokens: [i, j, ...]} (1-based subject tokens), got %s", v.q(kp, o.Key.word))
	case o.Key.Tokens != nil:
		v.orderingTokens(p, kp+".tokens", r.Subjects, o.Key.Tokens)
	}
	if o.Partitions < 1 || o.Partitions > MaxPartitions {
		v.addf(op+".partitions", "must be 1 to %d, got %s", MaxPartitions, v.val(op+".partitions", o.Partitions))
	}
	v.oneOf(op+".on_dead_letter", o.OnDeadLetter, OnDeadLetterContinue, OnDeadLetterBlock)
	if d := c.Destinations[r.Destination]; d != nil && r.AckWait > 0 {
		if most := OrderedMaxTimeout(r.AckWait.D()); d.Timeout.D() > most {
			v.addf(op, "destination %s has timeout %s, more than %s: an ordered route gives each try at most ack_wait - 0.5s (its partitions' pinned TTL, ack_wait + 1s, less one pull and a margin); lower the timeout or raise ack_wait",
				r.Destination, d.Timeout, most)
		}
	}
}

// OrderedPullExpiry is the longest an ordered route's pulls stay open: a
// replica that dies sent its last pull at most that long before, so its
// partitions move (pinned TTL ack_wait + 1s after that pull) once the
// messages it held are due for redelivery. The bridge shortens them
// further for a route whose tries may run long (bridge's orderedExpiry).
const OrderedPullExpiry = time.Second

// OrderedMaxTimeout is the longest destination timeout an ordered route
// with ackWait allows: a try must end inside the partition's lease, which
// a live owner renews with every pull answered
// (docs/delivery.md#ordered-delivery). The lease is the pinned TTL
// (ackWait + 1s); the rule keeps a pull of OrderedPullExpiry and 0.5s of
// margin out of it. At that longest timeout the bridge's pulls last about
// half a second instead (orderedExpiry), so that the next pull's answer
// renews the lease before the try's cut.
func OrderedMaxTimeout(ackWait time.Duration) time.Duration {
	return ackWait + time.Second - OrderedPullExpiry - 500*time.Millisecond
}

// orderingTokens checks the key tokens at path: a non-empty list of
// distinct positions from 1 to subjects.MaxKeyToken, each the same kind
// (a literal, or a wildcard) in every subject of the route that has it.
func (v *validator) orderingTokens(route, path string, filters []string, toks []int) {
	if len(toks) == 0 {
		v.addf(path, "must list at least one token position (or use key: subject)")
		return
	}
	ok := true
	for i, t := range toks {
		tp := fmt.Sprintf("%s[%d]", path, i)
		switch {
		case t < 1 || t > subjects.MaxKeyToken:
			v.addf(tp, "must be a token position from 1 to %d, got %s", subjects.MaxKeyToken, v.val(tp, t))
			ok = false
		case slices.Contains(toks[:i], t):
			v.addf(tp, "repeats token %s", v.val(tp, t))
			ok = false
		}
	}
	for _, f := range filters {
		if subjects.ValidateFilter(f) != nil {
			return // reported with the subjects
		}
	}
	if !ok {
		return
	}
	fp := func(i int) string { return fmt.Sprintf("%s.subjects[%d]", route, i) }
	if _, err := subjects.NewPartitioner(filters, 1, toks); err != nil {
		var ke *subjects.KeyTokenError
		if errors.As(err, &ke) {
			v.addf(path, "token %d is a literal in %s and a wildcard in %s: the same key would go to two partitions; make it a wildcard in every subject, or a literal in every subject",
				ke.Token, v.q(fp(ke.Literal), filters[ke.Literal]), v.q(fp(ke.Wildcard), filters[ke.Wildcard]))
			return
		}
		v.addf(path, "%v", err)
	}
}
