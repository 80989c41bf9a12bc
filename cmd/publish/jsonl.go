package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/sotercare/jetbridge/producer"
	"github.com/sotercare/jetbridge/subjects"
)

// jsonlEvent is one line of --jsonl input.
type jsonlEvent struct {
	ID       string            `json:"id"`
	Type     string            `json:"type"`
	Severity string            `json:"severity"`
	Subject  string            `json:"subject"`
	Metadata map[string]string `json:"metadata"`
	Payload  json.RawMessage   `json:"payload"` // published byte for byte
}

// eventFlags are the flags --jsonl refuses: each line carries its own.
var eventFlags = []string{"subject", "type", "severity", "id", "meta"}

// publishJSONL publishes one event per line, in order, and stops at the
// first line that is invalid or fails to publish.
func publishJSONL(o *options, pos []string, stdin io.Reader, stdout io.Writer) error {
	if len(pos) > 0 || o.set["file"] {
		return usagef("--jsonl cannot be combined with PAYLOAD or --file")
	}
	for _, name := range eventFlags {
		if o.set[name] {
			return usagef("--jsonl takes the event fields from each line; --%s cannot be combined with it", name)
		}
	}
	if err := subjects.ValidateSubject(o.root); err != nil {
		return usageMsg("--root: " + err.Error())
	}
	where := "" // prefix of line errors: the file, unless stdin
	r := stdin
	if o.jsonl != "-" {
		f, err := os.Open(o.jsonl)
		if err != nil {
			return fmt.Errorf("--jsonl: %w", err)
		}
		defer f.Close()
		r, where = f, o.jsonl+": "
	}

	check := producer.NewPublisher(nil, o.root) // renders without a connection
	var c *conn
	defer func() {
		if c != nil {
			c.close()
		}
	}()
	published := 0
	br := bufio.NewReader(r)
	for n := 1; ; n++ {
		line, readErr := br.ReadBytes('\n')
		if readErr != nil && !errors.Is(readErr, io.EOF) {
			return fmt.Errorf("--jsonl: read %sline %d: %w; %s", where, n, readErr, publishedBefore(published))
		}
		if line = bytes.TrimSpace(line); len(line) > 0 {
			lineErr := func(err error) error {
				return fmt.Errorf("%sline %d: %s; %s", where, n, err, publishedBefore(published))
			}
			ev, err := decodeLine(line)
			if err != nil {
				return lineErr(err)
			}
			msg, err := check.Message(ev)
			if err != nil {
				return lineErr(errors.New(trimBridge(err)))
			}
			ev.ID = msg.Header.Get(producer.HeaderEventID)
			if c == nil {
				if c, err = connect(o); err != nil {
					return err
				}
			}
			res, err := c.publish(ev, msg.Subject)
			if err != nil {
				return lineErr(err)
			}
			published++
			if err := printResult(stdout, o.json, res); err != nil {
				return err
			}
		}
		if readErr != nil { // io.EOF
			return nil
		}
	}
}

// decodeLine decodes and checks one non-blank line. Its errors never
// quote the payload.
func decodeLine(line []byte) (producer.Event, error) {
	if line[0] != '{' {
		return producer.Event{}, errors.New("not a JSON object")
	}
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	var l jsonlEvent
	if err := dec.Decode(&l); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return producer.Event{}, fmt.Errorf("field %q: want a %s, got a JSON %s", te.Field, te.Type, te.Value)
		}
		return producer.Event{}, fmt.Errorf("invalid JSON: %s", strings.TrimPrefix(err.Error(), "json: "))
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return producer.Event{}, errors.New("invalid JSON: data after the object")
	}
	if l.Type == "" && l.Subject == "" {
		return producer.Event{}, errors.New(`give "type" or "subject"`)
	}
	var sev subjects.Severity
	switch {
	case l.Severity != "":
		s, err := parseSeverity(l.Severity)
		if err != nil {
			return producer.Event{}, fmt.Errorf("severity %w", err)
		}
		sev = s
	}
	payload := []byte(l.Payload)
	if l.Payload == nil {
		payload = []byte(defaultPayload)
	}
	return producer.Event{
		ID: l.ID, Type: l.Type, Severity: sev, Subject: l.Subject,
		Metadata: l.Metadata, Payload: payload,
	}, nil
}

// publishedBefore tells how many events of the input are stored.
func publishedBefore(n int) string {
	switch n {
	case 0:
		return "no events published before it"
	case 1:
		return "1 event published before it"
	}
	return fmt.Sprintf("%d events published before it", n)
}
