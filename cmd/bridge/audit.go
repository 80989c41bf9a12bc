package main

import (
	"fmt"
	"io"
	"os"
	"os/user"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// audit is the one line that every command changing what the bridge holds
// (dlq replay, dlq purge, idem forget, consumer delete) writes to its standard error when
// it is done, interrupted or failed halfway (docs/operating.md#audit-lines):
//
//	audit: time=2026-12-03T17:02:11Z user=alice host=ops-1 command="dlq replay" all=true route=ra ...
//
// Keys are fixed words; every value is bounded (maxAuditValue bytes, at
// most maxAuditSeqs sequences) and printed bare when it holds only
// [A-Za-z0-9._:,/@+-], else quoted with strconv.QuoteToASCII, so a value
// can neither break the line nor reach the terminal as a control or
// invisible character. Only the operator's own input (filters, the event
// id to forget) and what the command did (counts, sequences, states,
// digests) are written: never a payload, a header value or a body read
// from NATS. The line goes to the command's stderr only; a running bridge
// logs nothing of it.
type audit struct {
	b strings.Builder
}

// maxAuditValue bounds one value of the audit line, in bytes.
const maxAuditValue = 256

// maxAuditSeqs bounds the sequences listed under one key; the rest are
// counted (",...+N").
const maxAuditSeqs = 100

// newAudit starts the audit line of command: when, who and where.
func newAudit(command string) *audit {
	a := &audit{}
	a.b.WriteString("audit:")
	return a.field("time", time.Now().UTC().Format(time.RFC3339)).
		field("user", operator()).field("host", hostname()).field("command", command)
}

// operator is the user running the command: the account's name, else
// $USER, else "unknown".
func operator() string {
	if u, err := user.Current(); err == nil && u.Username != "" {
		return u.Username
	}
	if u := os.Getenv("USER"); u != "" {
		return u
	}
	return "unknown"
}

func hostname() string {
	if h, err := os.Hostname(); err == nil && h != "" {
		return h
	}
	return "unknown"
}

// field appends key=value, value bounded and quoted when needed; an empty
// value is "-".
func (a *audit) field(key, value string) *audit {
	a.b.WriteByte(' ')
	a.b.WriteString(key)
	a.b.WriteByte('=')
	a.b.WriteString(auditValue(value))
	return a
}

func (a *audit) count(key string, n int) *audit { return a.field(key, strconv.Itoa(n)) }

func (a *audit) flag(key string, v bool) *audit { return a.field(key, strconv.FormatBool(v)) }

// list appends the values joined by ","; "-" when there are none.
func (a *audit) list(key string, vs []string) *audit { return a.field(key, strings.Join(vs, ",")) }

// seqs appends sequences joined by ",", at most maxAuditSeqs of them.
func (a *audit) seqs(key string, ns []uint64) *audit {
	var b strings.Builder
	for i, n := range ns {
		if i == maxAuditSeqs {
			fmt.Fprintf(&b, ",...+%d", len(ns)-i)
			break
		}
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatUint(n, 10))
	}
	a.b.WriteByte(' ')
	a.b.WriteString(key)
	a.b.WriteByte('=')
	if b.Len() == 0 {
		a.b.WriteByte('-')
	} else {
		a.b.WriteString(b.String()) // digits, commas and the count: safe
	}
	return a
}

// selection appends what a dlq command was asked to work on.
func (a *audit) selection(all bool, seqs []uint64, route, reason string) *audit {
	return a.flag("all", all).seqs("seqs", seqs).field("route", route).field("reason", reason)
}

func (a *audit) write(w io.Writer) {
	a.b.WriteByte('\n')
	_, _ = io.WriteString(w, a.b.String())
}

// auditValue is value as the audit line holds it.
func auditValue(v string) string {
	if v == "" {
		return "-"
	}
	if len(v) > maxAuditValue {
		cut := maxAuditValue
		for cut > 0 && !utf8.RuneStart(v[cut]) {
			cut--
		}
		v = v[:cut] + fmt.Sprintf("...(%d bytes)", len(v))
	}
	for i := 0; i < len(v); i++ {
		if !bareAuditByte(v[i]) {
			return strconv.QuoteToASCII(v)
		}
	}
	return v
}

func bareAuditByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("._:,/@+-", c) >= 0
}
