package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	"github.com/sotercare/jetbridge/internal/embedded"
)

// runNatsd is the "_natsd" role: an embedded JetStream server on a random
// loopback port with the store under -store. It prints "ready <url>" and
// serves until SIGTERM (or SIGINT).
func runNatsd(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("_natsd", flag.ContinueOnError)
	store := fs.String("store", "", "JetStream store directory (required)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	srv, err := embedded.Start(ctx, embedded.Options{
		Listen:     "127.0.0.1:0",
		StoreDir:   *store,
		ServerName: "bench-natsd",
		Logf: func(format string, args ...any) {
			fmt.Fprintf(os.Stderr, format+"\n", args...)
		},
	})
	if err != nil {
		return err
	}
	fmt.Println("ready", srv.ClientURL())
	<-ctx.Done()
	srv.Shutdown()
	return nil
}
