// pause does what Kubernetes' build/pause/linux/pause.c does, in Go so that it builds
// with the rest: it is PID 1 of every pod sandbox, holding the pod's namespaces open while
// the pod's containers come and go. As PID 1 it must reap the orphans reparented to it
// (else they stay zombies for the pod's life) and handle SIGINT/SIGTERM itself, since the
// kernel drops signals that PID 1 of a namespace does not handle. Static (CGO off), so it
// runs in a `FROM scratch` image.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

// version is stamped at build time with -ldflags "-X main.version=...".
var version = "unknown"

func main() {
	if len(os.Args) > 1 && (os.Args[1] == "-v" || os.Args[1] == "--version") {
		fmt.Printf("pause (kubeinfer) %s\n", version)
		return
	}
	if os.Getpid() != 1 {
		fmt.Fprintln(os.Stderr, "Warning: pause should be the first process")
	}
	signals := make(chan os.Signal, 16)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for received := range signals {
		if received == syscall.SIGCHLD {
			reap()
			continue
		}
		fmt.Fprintf(os.Stderr, "Shutting down, got signal: %v\n", received)
		os.Exit(0)
	}
}

// reap collects every exited child; signals coalesce, so one SIGCHLD may stand for many.
func reap() {
	for {
		var status syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}
