package testenv

import (
	"fmt"
	"net"
	"syscall"
	"time"

	"kipper.run/kip/test/controlplane"
)

// process is one control-plane program running in its own process group, its output going to a
// log file in the environment's directory.
type process struct{ *controlplane.Logged }

// spawn starts bin with args, output to dir/name.log. env is added to a minimal environment.
func spawn(dir, name, bin string, args []string, env []string) (*process, error) {
	p, err := controlplane.Spawn(dir, name, bin, args, env)
	if err != nil {
		return nil, err
	}
	return &process{p}, nil
}

// kill sends SIGKILL to the process group and waits for the process to be reaped. The
// environment's data is thrown away, so there is nothing to shut down gracefully.
func (p *process) kill() error {
	if !p.Stop(syscall.SIGKILL, 30*time.Second) {
		return fmt.Errorf("%s (pid %d) did not exit after SIGKILL", p.Name, p.Pid())
	}
	return nil
}

// freePorts returns n distinct free TCP ports on 127.0.0.1. Another program may take one before
// the control plane binds it; Start retries the whole start when a bind fails.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("find a free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

const dirPrefix = "kip-testenv-"
