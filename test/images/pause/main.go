// Command pause is a test-lab stand-in for the program in Kubernetes' pause image
// (build/pause/linux/pause.c): it holds a pod's namespaces open by waiting forever, exits 0
// on SIGINT or SIGTERM, and reaps zombie children on SIGCHLD, since it may be PID 1 of a
// pod's shared PID namespace. With -v it prints a version line and exits.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

const version = "kip-test-pause 3.6"

func main() {
	v := flag.Bool("v", false, "print the version and exit")
	flag.Parse()
	if *v {
		fmt.Println(version)
		return
	}
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	reap() // children that exited before the handler was installed
	for s := range sigs {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		reap()
	}
}

// reap collects every child that has exited.
func reap() {
	for {
		pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
		if err == syscall.EINTR {
			continue
		}
		if pid <= 0 || err != nil {
			return
		}
	}
}
