package subjects_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sotercare/jetbridge/jetbridgetest"
	"github.com/sotercare/jetbridge/subjects"
)

// partitionCase is a route's filters and key, with subjects of its
// messages.
type partitionCase struct {
	name     string
	filters  []string
	tokens   []int
	subjects []string
	// same lists groups of subjects that share a key: each group must
	// land in one partition.
	same [][]string
}

var partitionCases = []partitionCase{
	{
		name: "whole subject", filters: []string{"events.>"},
		subjects: []string{"events.a", "events.critical.care.p1.fall", "events.info.x.y.z.w"},
	},
	{
		name: "whole subject, literal filter", filters: []string{"events.critical.fall", "events.*.sensor"},
		subjects: []string{"events.critical.fall", "events.warning.sensor", "events.info.sensor"},
	},
	{
		name: "token under >", filters: []string{"events.critical.>"}, tokens: []int{3},
		subjects: []string{"events.critical.p1", "events.critical.p1.fall", "events.critical.p2.fall.x.y"},
		same:     [][]string{{"events.critical.p1", "events.critical.p1.fall", "events.critical.p1.resolved.a"}},
	},
	{
		name: "one key through two severities", filters: []string{"events.*.care.>"}, tokens: []int{4},
		subjects: []string{"events.critical.care.p1", "events.warning.care.p1.fall", "events.info.care.p7.x"},
		same:     [][]string{{"events.critical.care.p1.fall", "events.warning.care.p1.resolved", "events.info.care.p1"}},
	},
	{
		name: "two filters, key in key order", filters: []string{"events.critical.>", "events.warning.*.*"}, tokens: []int{4, 3},
		subjects: []string{"events.critical.a", "events.critical.a.b", "events.critical.a.b.c", "events.warning.a.b"},
		same:     [][]string{{"events.critical.dev.p1.z", "events.warning.dev.p1"}},
	},
	{
		name: "literal in every filter", filters: []string{"events.a.*", "events.b.*"}, tokens: []int{2, 3},
		subjects: []string{"events.a.x", "events.b.x", "events.b.y"},
	},
	{
		name: "no wildcard key token: one partition", filters: []string{"events.a.*", "events.a.*.>"}, tokens: []int{2},
		subjects: []string{"events.a.x", "events.a.y.z", "events.a.q.r.s"},
		same:     [][]string{{"events.a.x", "events.a.y.z", "events.a.q.r.s"}},
	},
	{
		name: "token beyond a short filter", filters: []string{"events.*", "events.*.*.*"}, tokens: []int{2, 4},
		subjects: []string{"events.k", "events.k.m.n"},
	},
	{
		name: "> before the key and after", filters: []string{"events.>"}, tokens: []int{1, 5},
		subjects: []string{"events.a", "events.a.b", "events.a.b.c", "events.a.b.c.d", "events.a.b.c.d.e.f"},
	},
}

// The transforms are accepted by the server's own transform code, which
// maps each subject to CopySubject(Partition(subject), subject): the
// bridge computes the same partition as the server.
func TestPartitionTransformsAgreeWithTheServer(t *testing.T) {
	for _, c := range partitionCases {
		for _, n := range []int{1, 7, 16, 256} {
			t.Run(fmt.Sprintf("%s/%d", c.name, n), func(t *testing.T) {
				p, err := subjects.NewPartitioner(c.filters, n, c.tokens)
				if err != nil {
					t.Fatal(err)
				}
				trs := p.Transforms()
				for _, tr := range trs {
					if _, err := server.NewSubjectTransform(tr.Source, tr.Destination); err != nil {
						t.Fatalf("server refuses %s -> %s: %v", tr.Source, tr.Destination, err)
					}
				}
				for i, a := range trs {
					for _, b := range trs[:i] {
						if subjects.Overlap(a.Source, b.Source) {
							t.Errorf("sources %s and %s overlap", a.Source, b.Source)
						}
					}
				}
				all := slices.Clone(c.subjects)
				for _, g := range c.same {
					all = append(all, g...)
				}
				for _, s := range all {
					part, ok := p.Partition(s)
					if !ok || part < 0 || part >= n {
						t.Fatalf("Partition(%s) = %d, %v", s, part, ok)
					}
					var got []string
					for _, tr := range trs {
						if subjects.Match(tr.Source, s) {
							st, _ := server.NewSubjectTransform(tr.Source, tr.Destination)
							got = append(got, st.TransformSubject(s))
						}
					}
					if want := subjects.CopySubject(part, s); len(got) != 1 || got[0] != want {
						t.Errorf("%s: the server maps it to %v, want exactly %s", s, got, want)
					}
					gp, orig, ok := subjects.SplitCopySubject(subjects.CopySubject(part, s))
					if !ok || gp != part || orig != s {
						t.Errorf("SplitCopySubject(CopySubject(%d, %s)) = %d, %s, %v", part, s, gp, orig, ok)
					}
				}
				for _, g := range c.same {
					p0, _ := p.Partition(g[0])
					for _, s := range g[1:] {
						if ps, _ := p.Partition(s); ps != p0 || p.Key(s) != p.Key(g[0]) {
							t.Errorf("%s (key %q, partition %d) and %s (key %q, partition %d) should share key and partition",
								g[0], p.Key(g[0]), p0, s, p.Key(s), ps)
						}
					}
				}
			})
		}
	}
}

// With many keys every partition is used, and the mapping depends on the
// key alone. The control hashes the whole subject instead of the key: then
// one key's subjects spread over several partitions.
func TestPartitionIsByKey(t *testing.T) {
	filters := []string{"events.*.care.>"}
	p, err := subjects.NewPartitioner(filters, 16, []int{4})
	if err != nil {
		t.Fatal(err)
	}
	whole, err := subjects.NewPartitioner(filters, 16, nil)
	if err != nil {
		t.Fatal(err)
	}
	used := map[int]bool{}
	spread := 0
	for k := range 500 {
		key := fmt.Sprintf("p%d", k)
		subs := []string{"events.critical.care." + key + ".fall", "events.info.care." + key, "events.warning.care." + key + ".a.b"}
		first, _ := p.Partition(subs[0])
		used[first] = true
		parts := map[int]bool{}
		for _, s := range subs {
			if got, _ := p.Partition(s); got != first {
				t.Fatalf("key %s: %s in partition %d, %s in %d", key, subs[0], first, s, got)
			}
			if p.Key(s) != key {
				t.Fatalf("Key(%s) = %q, want %q", s, p.Key(s), key)
			}
			w, _ := whole.Partition(s)
			parts[w] = true
		}
		if len(parts) > 1 {
			spread++
		}
	}
	if len(used) != 16 {
		t.Errorf("500 keys used %d of 16 partitions", len(used))
	}
	if spread == 0 {
		t.Error("control: hashing whole subjects kept every key in one partition; the test cannot tell keys from subjects")
	}
}

func TestPartitionerRefuses(t *testing.T) {
	tests := []struct {
		name    string
		filters []string
		n       int
		tokens  []int
		want    string
	}{
		{"no partitions", []string{"events.>"}, 0, nil, "0 partitions"},
		{"no tokens", []string{"events.>"}, 4, []int{}, "no key tokens"},
		{"token 0", []string{"events.>"}, 4, []int{0}, "token 0 is not from 1 to 32"},
		{"token 33", []string{"events.>"}, 4, []int{33}, "token 33 is not from 1 to 32"},
		{"repeated", []string{"events.>"}, 4, []int{3, 3}, "token 3 is repeated"},
		{"literal and star", []string{"events.a.x", "events.b.*"}, 4, []int{3}, "token 3 is a literal in filter 1 and a wildcard in filter 2"},
		{"literal and >", []string{"events.x.y", "events.>"}, 4, []int{2}, "token 2 is a literal in filter 1 and a wildcard in filter 2"},
		{"bad filter", []string{"events.>.x"}, 4, nil, "must be the last token"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := subjects.NewPartitioner(tt.filters, tt.n, tt.tokens)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want one containing %q", err, tt.want)
			}
			if !errors.Is(err, subjects.ErrKey) && !errors.Is(err, subjects.ErrInvalid) {
				t.Errorf("error %v matches neither ErrKey nor ErrInvalid", err)
			}
			var ke *subjects.KeyTokenError
			if strings.Contains(tt.name, "literal and") && !errors.As(err, &ke) {
				t.Errorf("error %v is not a *KeyTokenError", err)
			}
		})
	}
}

func TestSplitCopySubject(t *testing.T) {
	for _, s := range []string{"", "events", "x.events", "-1.events", "01.events", "1000.events", "3.", ".events"} {
		if p, o, ok := subjects.SplitCopySubject(s); ok {
			t.Errorf("SplitCopySubject(%q) = %d, %q, true", s, p, o)
		}
	}
	if p, o, ok := subjects.SplitCopySubject("255.events.a.b"); !ok || p != 255 || o != "events.a.b" {
		t.Errorf("SplitCopySubject = %d, %q, %v", p, o, ok)
	}
}

// A stream sourced from EVENTS with the transforms stores every message of
// the route's filters, and only those, under <partition>.<subject>, with
// the partition Partition computes; EVENTS keeps its subjects. This is
// the server itself, not its transform code alone.
func TestPartitionedCopyOnTheServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js := jetbridgetest.NewServer(t).JetStream()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "EVENTS", Subjects: []string{"events.>"}}); err != nil {
		t.Fatal(err)
	}
	filters := []string{"events.critical.>", "events.warning.*.*"}
	p, err := subjects.NewPartitioner(filters, 8, []int{4, 3})
	if err != nil {
		t.Fatal(err)
	}
	var trs []jetstream.SubjectTransformConfig
	for _, tr := range p.Transforms() {
		trs = append(trs, jetstream.SubjectTransformConfig{Source: tr.Source, Destination: tr.Destination})
	}
	copyStream, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name:    "EVENTS-r",
		Sources: []*jetstream.StreamSource{{Name: "EVENTS", SubjectTransforms: trs}},
	})
	if err != nil {
		t.Fatal(err)
	}
	var published []string
	for k := range 40 {
		for _, s := range []string{
			fmt.Sprintf("events.critical.dev.k%d", k),
			fmt.Sprintf("events.critical.dev.k%d.fall", k),
			fmt.Sprintf("events.warning.dev.k%d", k),
			fmt.Sprintf("events.critical.k%d", k),
			fmt.Sprintf("events.info.dev.k%d", k), // outside the route
		} {
			if _, err := js.Publish(ctx, s, nil); err != nil {
				t.Fatal(err)
			}
			published = append(published, s)
		}
	}
	inRoute := 0
	for _, s := range published {
		if _, ok := p.Partition(s); ok {
			inRoute++
		}
	}
	if inRoute != 160 {
		t.Fatalf("%d subjects in the route, want 160", inRoute)
	}
	cons, err := copyStream.CreateConsumer(ctx, jetstream.ConsumerConfig{AckPolicy: jetstream.AckNonePolicy})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for len(got) < inRoute {
		batch, err := cons.Fetch(inRoute-len(got), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for m := range batch.Messages() {
			got = append(got, m.Subject())
			n++
		}
		if n == 0 {
			t.Fatalf("the copy holds %d messages, want %d", len(got), inRoute)
		}
	}
	perKey := map[string]map[string]bool{}
	i := 0
	for _, s := range published {
		want, ok := p.Partition(s)
		if !ok {
			continue
		}
		if got[i] != subjects.CopySubject(want, s) {
			t.Errorf("copy message %d: %s, want %s", i, got[i], subjects.CopySubject(want, s))
		}
		part, _, _ := strings.Cut(got[i], ".")
		if perKey[p.Key(s)] == nil {
			perKey[p.Key(s)] = map[string]bool{}
		}
		perKey[p.Key(s)][part] = true
		i++
	}
	for k, parts := range perKey {
		if len(parts) != 1 {
			t.Errorf("key %q in partitions %v", k, parts)
		}
	}
	info, err := js.Stream(ctx, "EVENTS")
	if err != nil {
		t.Fatal(err)
	}
	if n := info.CachedInfo().State.Msgs; n != uint64(len(published)) {
		t.Errorf("EVENTS holds %d messages, want %d", n, len(published))
	}
	if got := info.CachedInfo().Config.Subjects; !slices.Equal(got, []string{"events.>"}) {
		t.Errorf("EVENTS subjects %v", got)
	}
}

// FuzzKey checks Key against its definition (the subject's tokens at the
// key's positions, "" beyond the end, joined with "."), for one and for
// several key tokens, and that one key token costs no allocation.
func FuzzKey(f *testing.F) {
	for _, s := range []string{"events.info.k1", "events.info.k1.more", "events", "events.info", "", "a..b", "events.x.care.p7.fall"} {
		f.Add(s)
	}
	one, err := subjects.NewPartitioner([]string{">"}, 4, []int{3})
	if err != nil {
		f.Fatal(err)
	}
	several, err := subjects.NewPartitioner([]string{">"}, 4, []int{4, 2, 6})
	if err != nil {
		f.Fatal(err)
	}
	want := func(subject string, tokens []int) string {
		toks := strings.Split(subject, ".")
		parts := make([]string, len(tokens))
		for i, t := range tokens {
			if t-1 < len(toks) {
				parts[i] = toks[t-1]
			}
		}
		return strings.Join(parts, ".")
	}
	f.Fuzz(func(t *testing.T, subject string) {
		if got, w := one.Key(subject), want(subject, []int{3}); got != w {
			t.Fatalf("Key(%q) with token 3 = %q, want %q", subject, got, w)
		}
		if got, w := several.Key(subject), want(subject, []int{4, 2, 6}); got != w {
			t.Fatalf("Key(%q) with tokens 4, 2, 6 = %q, want %q", subject, got, w)
		}
	})
}

func TestKeyOfOneTokenAllocatesNothing(t *testing.T) {
	p, err := subjects.NewPartitioner([]string{"events.>"}, 16, []int{3})
	if err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(100, func() { _ = p.Key("events.info.k123.more") }); n != 0 {
		t.Errorf("Key allocates %v times per call, want 0", n)
	}
}
