package sshx

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"kipper.run/kip/test/need"
	"kipper.run/kip/test/sshd"
)

// BenchmarkRun200 runs 200 "true" commands on one host three ways: through sshx over its one
// connection; through OpenSSH's ssh with a ControlMaster connection established beforehand;
// and through a fresh ssh process and connection per command. Each reports the time per
// command (ms/cmd). All three send the same remote command line, so that only the transport
// differs, and they do so for three command lines:
//
//   - sudo: what sshx's Run sends for "true" as sshd.User: sudo and the kill wrapper;
//   - root: what it sends as root: the kill wrapper alone (sent as sshd.User all the same:
//     root's ~/.bashrc on the build machines would add 0.5 s to every command);
//   - bare: just "true", which shows the transports alone.
//
// sshx sends the latter two through the unexported run, raw. Run the benchmark with
//
//	go test ./internal/sshx -run '^$' -bench Run200 -benchtime 1x
func BenchmarkRun200(b *testing.B) {
	const commands = 200
	srv := sshd.Start(b)
	cfg, _ := testConfig(b, srv, sshd.User)
	c := dial(b, cfg)
	sshPath := need.Command(b, "ssh", "apt-get install openssh-client")

	// each runs one command the given way 200 times per iteration and reports ms/cmd.
	each := func(b *testing.B, run func(b *testing.B)) {
		for b.Loop() {
			for range commands {
				run(b)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N*commands), "ms/cmd")
	}
	ssh := func(b *testing.B, remote string, opts ...string) {
		args := append(opts, "-F", "/dev/null", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
			"-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "-i", srv.ClientKeyPath,
			"-p", strconv.Itoa(srv.Port), "-l", sshd.User, srv.Host, remote)
		if out, err := exec.Command(sshPath, args...).CombinedOutput(); err != nil {
			b.Fatalf("ssh: %v: %s", err, out)
		}
	}

	for _, tc := range []struct {
		name   string
		remote string // the command line the host receives
	}{
		{"sudo", wrapCommand("true", "benchmark", true)},
		{"root", wrapCommand("true", "benchmark", false)},
		{"bare", "true"},
	} {
		b.Run(tc.name+"/sshx", func(b *testing.B) {
			each(b, func(b *testing.B) {
				res, err := c.run(context.Background(), tc.remote, nil, raw)
				if err == nil {
					err = res.Err()
				}
				if err != nil {
					b.Fatal(err)
				}
			})
		})

		b.Run(tc.name+"/openssh-controlmaster", func(b *testing.B) {
			// A short directory: a socket path is limited to about 100 bytes.
			dir, err := os.MkdirTemp("", "cm")
			if err != nil {
				b.Fatal(err)
			}
			defer os.RemoveAll(dir)
			socket := "ControlPath=" + filepath.Join(dir, "s")
			master := []string{"-o", "ControlMaster=auto", "-o", socket, "-o", "ControlPersist=60"}
			ssh(b, "true", master...) // establishes the master connection
			defer exec.Command(sshPath, "-F", "/dev/null", "-o", socket, "-O", "exit", srv.Host).Run()
			each(b, func(b *testing.B) { ssh(b, tc.remote, master...) })
		})

		b.Run(tc.name+"/openssh-fresh", func(b *testing.B) {
			each(b, func(b *testing.B) { ssh(b, tc.remote) })
		})
	}
}
