package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/sotercare/jetbridge/config"
	"github.com/sotercare/jetbridge/internal/cli"
	"github.com/sotercare/jetbridge/webhook"
)

// receiveOptions are the flags of bridge receive.
type receiveOptions struct {
	listen, secret string
	status         int
	failRate       float64
	verbose        bool
	delay          time.Duration
	json           bool
}

func newReceiveCmd() *cobra.Command {
	var o receiveOptions
	c := &cobra.Command{
		Use:   "receive",
		Short: "a local webhook receiver for trying the bridge",
		Long: `A local webhook receiver: prints one line per delivery (time, request number,
status answered, event id, type, severity, attempt, signature check), answers
--status, or 503 for a --fail-rate share of requests. On a terminal the
status is coloured. On SIGINT/SIGTERM it prints a summary in which requests
that the client abandoned before the answer (its timeout, during --delay)
are counted apart. It needs no configuration.`,
		Example: `  bridge receive --listen 127.0.0.1:9090                  # answer 202 to everything
  bridge receive --listen 127.0.0.1:9090 --fail-rate 0.5  # 503 for half of the requests
  bridge receive --listen 127.0.0.1:9090 --status 400     # reject: dead letters
  bridge receive --json | jq -c 'select(.status >= 300)'`,
		Args: cli.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error { return cmdReceive(o, c.OutOrStdout(), c.ErrOrStderr()) },
	}
	f := c.Flags()
	f.StringVarP(&o.listen, "listen", "l", "127.0.0.1:9090", "address to listen on: HOST:PORT, or a bare PORT for 127.0.0.1:PORT")
	f.IntVar(&o.status, "status", http.StatusAccepted, "status to answer")
	f.Float64Var(&o.failRate, "fail-rate", 0, "share of requests (0..1) answered 503 instead")
	f.StringVar(&o.secret, "secret", "", "Standard Webhooks signing secret (whsec_...): verify signatures")
	f.BoolVarP(&o.verbose, "verbose", "v", false, "also print every header and the body")
	f.DurationVar(&o.delay, "delay", 0, "wait this long before answering each request (a slow destination)")
	f.BoolVar(&o.json, "json", false, "one JSON object per request on stdout; the other lines go to stderr")
	return c
}

func cmdReceive(o receiveOptions, stdout, stderr io.Writer) error {
	switch {
	case o.status < 100 || o.status > 599:
		return usageErr("--status %d: not an HTTP status", o.status)
	case o.failRate < 0 || o.failRate > 1:
		return usageErr("--fail-rate %g: want a share between 0 and 1", o.failRate)
	case o.delay < 0:
		return usageErr("--delay %s: must not be negative", o.delay)
	}
	listen, err := receiveListenAddr(o.listen)
	if err != nil {
		return err
	}
	rc := &receiver{status: o.status, failRate: o.failRate, verbose: o.verbose && !o.json, delay: o.delay,
		out: stdout, json: o.json, color: !o.json && cli.IsTerminal(stdout)}
	if o.secret != "" {
		keys, err := (&config.Signing{Secrets: []config.Secret{config.Secret(o.secret)}}).Keys()
		if err != nil {
			return usageErr("--secret: %v", err)
		}
		rc.keys = keys
	}
	info := stdout // the lines that are not deliveries
	if o.json {
		info = stderr
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return listenErr("--listen", listen, err)
	}
	ctx, stop := signalContext()
	defer stop()
	srv := &http.Server{Handler: rc, ReadHeaderTimeout: 10 * time.Second}
	fmt.Fprintf(info, "receiving on http://%s/ (answering %d, failing %.0f%% with 503%s); Ctrl-C to stop\n",
		ln.Addr(), o.status, o.failRate*100, map[bool]string{true: ", verifying signatures"}[rc.keys != nil])
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	<-errc
	fmt.Fprintln(info, rc.summary())
	return nil
}

// receiveListenAddr is the address of receive --listen: HOST:PORT as
// given (":PORT" binds every interface, as in Go), or a bare PORT, which
// means 127.0.0.1:PORT (loopback, like the default). Anything else is bad
// usage naming the forms (docs/operating.md#commands).
func receiveListenAddr(listen string) (string, error) {
	if n, err := strconv.Atoi(listen); err == nil {
		if n < 0 || n > 65535 {
			return "", usageErr("--listen %q: not a port (0 to 65535); want HOST:PORT or PORT, e.g. 127.0.0.1:9090 or 9090", listen)
		}
		return net.JoinHostPort("127.0.0.1", listen), nil
	}
	if _, port, err := net.SplitHostPort(listen); err != nil || !validPort(port) {
		return "", usageErr("--listen %q: want HOST:PORT or PORT, e.g. 127.0.0.1:9090 or 9090", listen)
	}
	return listen, nil
}

// validPort reports whether p is a port number from 0 to 65535.
func validPort(p string) bool {
	n, err := strconv.Atoi(p)
	return err == nil && n >= 0 && n <= 65535 && p == strconv.Itoa(n)
}

// listenErr explains a listen failure; an address in use names the flag
// or setting and what to do.
func listenErr(setting, addr string, err error) error {
	if errors.Is(err, syscall.EADDRINUSE) {
		return fmt.Errorf("%s %s: the address is already in use (another bridge receive, or another program?); stop it or pick another port with %s", setting, addr, setting)
	}
	return fmt.Errorf("%s %s: %w", setting, addr, err)
}

// receiver is the deliberately unreliable webhook receiver of bridge
// receive: one line per delivery, a chosen status, a share of 503s.
type receiver struct {
	status   int
	failRate float64
	keys     [][]byte
	verbose  bool
	delay    time.Duration
	json     bool // one JSON object per request
	color    bool // colour the status (a terminal)

	count     atomic.Int64 // requests received
	abandoned atomic.Int64 // the client went away before the answer
	mu        sync.Mutex   // serialises output lines and byStatus
	byStatus  map[int]int  // answered requests per status
	out       io.Writer
}

// receiveLine is one request of receive --json.
type receiveLine struct {
	Time      string `json:"time"`
	N         int64  `json:"n"`
	Status    int    `json:"status"` // what was (or would have been) answered
	Abandoned bool   `json:"abandoned"`
	Method    string `json:"method"`
	Path      string `json:"path"`
	EventID   string `json:"event_id"`
	Type      string `json:"type"`
	Severity  string `json:"severity"`
	Attempt   string `json:"attempt"`
	Signature string `json:"signature"`
}

func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 10<<20))
	if err != nil {
		http.Error(w, "cannot read body", http.StatusBadRequest)
		return
	}
	n := rc.count.Add(1)
	status := rc.status
	if rc.failRate > 0 && rand.Float64() < rc.failRate {
		status = http.StatusServiceUnavailable
	}
	sig := "unsigned"
	if rc.keys != nil {
		sig = "ok"
		if err := webhook.Verify(r.Header, body, rc.keys, time.Now(), webhook.Tolerance); err != nil {
			sig = "INVALID (" + strings.TrimPrefix(err.Error(), "webhook: ") + ")"
			status = http.StatusUnauthorized
		}
	} else if r.Header.Get(webhook.HeaderSignature) != "" {
		sig = "not checked (no --secret)"
	}
	abandoned := false
	if rc.delay > 0 {
		select {
		case <-time.After(rc.delay):
		case <-r.Context().Done():
			abandoned = true // the client gave up
		}
	}
	if abandoned {
		rc.abandoned.Add(1)
	} else {
		w.WriteHeader(status)
	}

	rc.mu.Lock()
	defer rc.mu.Unlock()
	if !abandoned {
		if rc.byStatus == nil {
			rc.byStatus = map[int]int{}
		}
		rc.byStatus[status]++
	}
	line := receiveLine{
		Time: time.Now().Format("15:04:05.000"), N: n, Status: status, Abandoned: abandoned,
		Method: r.Method, Path: r.URL.Path, EventID: r.Header.Get("X-Event-Id"), Type: r.Header.Get("X-Event-Type"),
		Severity: r.Header.Get("X-Event-Severity"), Attempt: r.Header.Get("X-Delivery-Attempt"), Signature: sig,
	}
	if rc.json {
		_ = cli.WriteJSON(rc.out, line)
		return
	}
	code := rc.paint(status, strconv.Itoa(status))
	if abandoned {
		code = rc.paint(0, "abandoned (client gave up before the answer)")
	}
	fmt.Fprintf(rc.out, "%s #%d %s %s %s id=%s type=%s severity=%s attempt=%s signature=%s\n",
		line.Time, n, code, r.Method, escapeTerminal(r.URL.Path),
		cell(line.EventID), cell(line.Type), cell(line.Severity), cell(line.Attempt), sig)
	if rc.verbose {
		names := make([]string, 0, len(r.Header))
		for k := range r.Header {
			names = append(names, k)
		}
		slices.Sort(names)
		for _, k := range names {
			fmt.Fprintf(rc.out, "    %s: %s\n", shown(k), shown(strings.Join(r.Header[k], ", ")))
		}
		fmt.Fprintf(rc.out, "    body: %s\n", escapeLines(string(body)))
	}
}

// ANSI colours of a status on a terminal.
const (
	ansiGreen  = "\x1b[32m"
	ansiYellow = "\x1b[33m"
	ansiRed    = "\x1b[31m"
	ansiGrey   = "\x1b[90m"
	ansiReset  = "\x1b[0m"
)

// paint colours text by status class (0: abandoned) when rc.color.
func (rc *receiver) paint(status int, text string) string {
	if !rc.color {
		return text
	}
	c := ansiGrey
	switch {
	case status >= 200 && status < 300:
		c = ansiGreen
	case status >= 400 && status < 500:
		c = ansiYellow
	case status >= 500:
		c = ansiRed
	}
	return c + text + ansiReset
}

// summary is the last line: requests received, answered by status, and
// abandoned apart.
func (rc *receiver) summary() string {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	codes := slices.Sorted(maps.Keys(rc.byStatus))
	parts := make([]string, 0, len(codes))
	answered := 0
	for _, c := range codes {
		parts = append(parts, fmt.Sprintf("%d %d", rc.byStatus[c], c))
		answered += rc.byStatus[c]
	}
	s := fmt.Sprintf("received %d requests: %d answered", rc.count.Load(), answered)
	if len(parts) > 0 {
		s += " (" + strings.Join(parts, ", ") + ")"
	}
	return s + fmt.Sprintf(", %d abandoned by the client before the answer", rc.abandoned.Load())
}
