// Command pause is the process that holds a pod's namespaces open.
//
// It does what Kubernetes' own pause does: sleep until SIGINT or SIGTERM,
// exit 0 then, and reap any child that is re-parented to it (it is PID 1 of
// the pod's PID namespace when the pod shares one).
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "-v" {
		fmt.Println("gpufleet pause 1.0")
		return
	}
	if os.Getpid() != 1 {
		fmt.Fprintln(os.Stderr, "pause: warning: not PID 1")
	}
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range signals {
		if sig == syscall.SIGCHLD {
			for {
				pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
				if pid <= 0 || err != nil {
					break
				}
			}
			continue
		}
		fmt.Fprintf(os.Stderr, "pause: shutting down, got %v\n", sig)
		os.Exit(0)
	}
}
