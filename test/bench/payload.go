package main

import (
	"bytes"
	"strconv"
	"strings"
)

// payloadSize is the size of every published payload (1 KiB of JSON).
const payloadSize = 1024

// The payload carries the message's sequence number (0..N-1) and its
// publish time in Unix nanoseconds; the sink finds both by these markers
// in any body format (envelope copies the payload as published, raw and
// the naive bridge send it as is).
var (
	seqMarker = []byte(`"bench_seq":`)
	tsMarker  = []byte(`"bench_ts":`)
)

// payload builds the 1 KiB JSON payload of message seq published at ts.
func payload(seq int, ts int64) []byte {
	b := make([]byte, 0, payloadSize)
	b = append(b, '{')
	b = append(b, seqMarker...)
	b = strconv.AppendInt(b, int64(seq), 10)
	b = append(b, ',')
	b = append(b, tsMarker...)
	b = strconv.AppendInt(b, ts, 10)
	b = append(b, `,"pad":"`...)
	if pad := payloadSize - len(b) - len(`"}`); pad > 0 {
		b = append(b, strings.Repeat("x", pad)...)
	}
	return append(b, `"}`...)
}

// markedInt returns the non-negative integer that follows marker in body.
func markedInt(body, marker []byte) (int64, bool) {
	i := bytes.Index(body, marker)
	if i < 0 {
		return 0, false
	}
	rest := body[i+len(marker):]
	n, end := int64(0), 0
	for end < len(rest) && end < 19 && rest[end] >= '0' && rest[end] <= '9' {
		n = n*10 + int64(rest[end]-'0')
		end++
	}
	return n, end > 0
}
