package bridge

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sotercare/jetbridge/subjects"
)

// This file reads the messages of an ordered route's partitioned copy
// (ordered_provision.go) as the events they are copies of: the original
// stream, stream sequence and subject, from the Nats-Stream-Source header
// the server adds when it sources a message. With them, an ordered route
// has the same event ids (STREAM:SEQ by default), idempotency records and
// dead-letter origins as the route had unordered, and a dead letter names
// the source stream, never the copy.

// Headers the server adds to a copy's messages, which are not the event's:
// they are dropped from what the event carries on (a dead letter holding
// Nats-Stream-Source would be refused by the source stream on replay).
const (
	headerStreamSource = "Nats-Stream-Source"
	headerPinID        = "Nats-Pin-Id"
)

// maxStreamSourceHeader bounds the Nats-Stream-Source header read: the
// stream name, the sequence, the route's filters and transforms and the
// subject, each bounded by the server.
const maxStreamSourceHeader = 64 << 10

// ErrNotCopied: a message of a partitioned copy without a usable
// Nats-Stream-Source header (published into the copy directly, or from
// another source). It is an invalid event.
var ErrNotCopied = errors.New("not a message copied from the source stream")

// streamSource is what Nats-Stream-Source says about a copied message.
type streamSource struct {
	Stream  string
	Seq     uint64
	Subject string
}

// parseStreamSource reads the header the server writes when it sources a
// message: "<stream> <seq> <filters> <transforms> <subject> [<ident>]",
// where filters and transforms are joined with \f (never a space) and may
// be empty. stream must be the source stream.
func parseStreamSource(h, stream string) (streamSource, error) {
	if h == "" {
		return streamSource{}, fmt.Errorf("%w: no %s header", ErrNotCopied, headerStreamSource)
	}
	if len(h) > maxStreamSourceHeader {
		return streamSource{}, fmt.Errorf("%w: %s header of %d bytes", ErrNotCopied, headerStreamSource, len(h))
	}
	f := strings.Split(h, " ")
	if len(f) != 5 && len(f) != 6 {
		return streamSource{}, fmt.Errorf("%w: %s header has %d fields, want 5 or 6", ErrNotCopied, headerStreamSource, len(f))
	}
	if f[0] != stream {
		return streamSource{}, fmt.Errorf("%w: sourced from another stream than %s", ErrNotCopied, stream)
	}
	seq, err := strconv.ParseUint(f[1], 10, 64)
	if err != nil || seq == 0 {
		return streamSource{}, fmt.Errorf("%w: %s header has no stream sequence", ErrNotCopied, headerStreamSource)
	}
	if subjects.ValidateSubject(f[4]) != nil {
		return streamSource{}, fmt.Errorf("%w: %s header has no valid subject", ErrNotCopied, headerStreamSource)
	}
	return streamSource{Stream: f[0], Seq: seq, Subject: f[4]}, nil
}

// copyMsg is a message of a partitioned copy seen as the event it is a
// copy of: Subject, Metadata (stream and stream sequence) and Headers
// are the original's; acknowledgements go to the copy's message. Partition
// and CopySeq say where it is in the copy.
type copyMsg struct {
	jetstream.Msg
	subject   string
	md        *jetstream.MsgMetadata
	hdr       nats.Header
	partition int
	copySeq   uint64
}

// newCopyMsg reads m, a message of the copy of stream, whose subject is
// <partition>.<original subject>. The error matches ErrNotCopied when m
// is not a copied message (or ErrNoMetadata when it has no metadata).
func newCopyMsg(m jetstream.Msg, stream string) (*copyMsg, error) {
	md, err := m.Metadata()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNoMetadata, err)
	}
	src, err := parseStreamSource(m.Headers().Get(headerStreamSource), stream)
	if err != nil {
		return nil, err
	}
	p, orig, ok := subjects.SplitCopySubject(m.Subject())
	if !ok || orig != src.Subject {
		return nil, fmt.Errorf("%w: the copy's subject does not carry the original one", ErrNotCopied)
	}
	omd := *md
	omd.Stream = src.Stream
	omd.Sequence.Stream = src.Seq
	// The original's headers are the copy's without the two the copy and
	// the pull added, removed in place: the map is this message's own
	// (nats.go decodes one per message received), read through the
	// copyMsg from here on.
	hdr := m.Headers()
	delete(hdr, headerStreamSource)
	delete(hdr, headerPinID)
	return &copyMsg{Msg: m, subject: src.Subject, md: &omd, hdr: hdr, partition: p, copySeq: md.Sequence.Stream}, nil
}

// Subject is the original subject.
func (c *copyMsg) Subject() string { return c.subject }

// Metadata is the copy's, with the original stream and stream sequence.
func (c *copyMsg) Metadata() (*jetstream.MsgMetadata, error) {
	md := *c.md
	return &md, nil
}

// Headers are the original's (without the headers the copy added).
func (c *copyMsg) Headers() nats.Header { return c.hdr }
