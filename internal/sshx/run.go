package sshx

import (
	"bytes"
	"context"
	"crypto/rand"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"

	"kipper.run/kip/internal/fault"
	"kipper.run/kip/internal/stop"
)

// Result is what a finished remote command left behind.
type Result struct {
	Command    string // as given to Run
	Stdout     []byte
	Stderr     []byte
	ExitStatus int // 128+n when a signal n ended it

	host string // user@host:port, for Err
}

// Err returns nil when the command exited 0, and otherwise an error naming the host, the
// command, its exit status and the last line it wrote to stderr.
func (r Result) Err() error {
	if r.ExitStatus == 0 {
		return nil
	}
	msg := fmt.Sprintf("command %q exited %d", short(r.Command), r.ExitStatus)
	if line := lastLine(r.Stderr); line != "" {
		msg += ": " + line
	}
	if r.host != "" {
		msg = "ssh " + r.host + ": " + msg
	}
	return errors.New(msg)
}

// lastLine returns the last non-blank line of out, trimmed.
func lastLine(out []byte) string {
	s := strings.TrimSpace(string(out))
	return strings.TrimSpace(s[strings.LastIndexByte(s, '\n')+1:])
}

// short abbreviates a command for messages to its first 60 characters.
func short(cmd string) string {
	const max = 60
	if r := []rune(cmd); len(r) > max {
		return string(r[:max]) + "…"
	}
	return cmd
}

// Run runs cmd, a shell command line (build it with Command or Quote), as root on the host, and
// waits for it to finish. A non-zero exit status is not an error: it is in the Result (see
// Result.Err). Run refuses to start once the operator asked kip to stop (stop.Check); when ctx
// ends first, the command and everything it started on the host are killed. A command the
// connection dropped under is not run again: the error says its outcome is unknown.
func (c *Client) Run(ctx context.Context, cmd string) (Result, error) {
	return c.RunInput(ctx, cmd, nil)
}

// Output runs cmd like Run and returns its standard output, or an error when it could not run
// or exited non-zero (Result.Err).
func (c *Client) Output(ctx context.Context, cmd string) ([]byte, error) {
	res, err := c.Run(ctx, cmd)
	if err != nil {
		return nil, err
	}
	if err := res.Err(); err != nil {
		return nil, err
	}
	return res.Stdout, nil
}

// RunInput is Run with stdin as the command's standard input.
func (c *Client) RunInput(ctx context.Context, cmd string, stdin io.Reader) (Result, error) {
	return c.run(ctx, cmd, stdin, changing)
}

// Query is Output for a command that only reads the host: a test build of kip counts every
// other command as a write it may be killed after (package fault).
func (c *Client) Query(ctx context.Context, cmd string) ([]byte, error) {
	res, err := c.run(ctx, cmd, nil, reading)
	if err != nil {
		return nil, err
	}
	if err := res.Err(); err != nil {
		return nil, err
	}
	return res.Stdout, nil
}

// Probe is Run for a command that only reads the host (not counted as a write, as Query): its
// exit status is in the Result, for a caller to tell its outcomes apart.
func (c *Client) Probe(ctx context.Context, cmd string) (Result, error) {
	return c.run(ctx, cmd, nil, reading)
}

// kind is how run treats a command.
type kind int

const (
	// changing: wrapped to run as root and be stoppable, and counted as a write (package fault).
	changing kind = iota
	// reading: wrapped, not counted.
	reading
	// raw: sent as it is, not counted.
	raw
)

// killWrapper runs its first argument as a shell command in the background and waits for it;
// on SIGTERM it kills its whole process group with SIGKILL. kill.sh finds it by its name ($0,
// "kip-run-TOKEN") to stop the command. Signalling the session instead is not enough: sshd
// refuses signals for root's sessions, SIGKILL would kill only the process sshd started (sh
// does not exec its last command, so the command's children would live on), and the user
// could not signal a command sudo runs as root. The command keeps the session's stdin through
// fd 3: a background job's stdin is otherwise /dev/null.
const killWrapper = `trap 'kill -KILL 0' TERM; exec 3<&0; sh -c "$1" <&3 3<&- & wait $!`

//go:embed kill.sh
var killScript string

// stopTimeout bounds the stopping of a command whose context has ended.
const stopTimeout = 10 * time.Second

// wrap returns the command line sent to the host for cmd (see wrapCommand).
func (c *Client) wrap(cmd, token string) string { return wrapCommand(cmd, token, c.cfg.User != "root") }

// wrapCommand returns the command line that runs cmd under killWrapper named "kip-run-"+token,
// through sudo if asked.
func wrapCommand(cmd, token string, sudo bool) string {
	w := Command("sh", "-c", killWrapper, "kip-run-"+token, cmd)
	if sudo {
		w = "sudo -n " + w
	}
	return "exec " + w
}

// run runs cmd on a session of its own, once a session slot is free. Unless it is raw, cmd is
// wrapped (see wrap) so that it runs as root and can be stopped.
func (c *Client) run(ctx context.Context, cmd string, stdin io.Reader, k kind) (Result, error) {
	select {
	case c.slots <- struct{}{}:
		defer func() { <-c.slots }()
	case <-ctx.Done():
	}
	if err := stop.Check(ctx); err != nil {
		return Result{}, c.wrapErr(fmt.Errorf("command %q not started: %w", short(cmd), err))
	}
	c.commands.Add(1)
	sess, cn, err := c.session(ctx)
	if err != nil {
		return Result{}, c.wrapErr(fmt.Errorf("command %q not started: %w", short(cmd), err))
	}
	defer sess.Close()

	token, remote := rand.Text(), cmd
	if k != raw {
		remote = c.wrap(cmd, token)
	}
	var stdout, stderr bytes.Buffer
	sess.Stdout, sess.Stderr, sess.Stdin = &stdout, &stderr, stdin
	if err := sess.Start(remote); err != nil {
		return Result{}, c.lost(cn, cmd, err)
	}
	stopped, err := wait(ctx, sess)
	if stopped {
		why, done := "was cancelled", "stopped"
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			why, done = "timed out", "was stopped"
		}
		if k != raw {
			if err := c.stopRemote(cn, token); err != nil {
				return Result{}, c.wrapErr(fmt.Errorf("command %q %s (%w), and stopping it on the host failed: %v; it may still be running",
					short(cmd), why, ctx.Err(), err))
			}
		}
		return Result{}, c.wrapErr(fmt.Errorf("command %q %s and %s: %w", short(cmd), why, done, ctx.Err()))
	}

	res := Result{Command: cmd, Stdout: stdout.Bytes(), Stderr: stderr.Bytes(), host: c.label}
	var exit *ssh.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exit):
		res.ExitStatus = exit.ExitStatus()
	default:
		return res, c.lost(cn, cmd, err)
	}
	if k == changing {
		fault.Remote(c.label, cmd)
	}
	return res, nil
}

// wait waits for the command started on sess to end. When ctx ends first, it closes the session
// and reports that the command was stopped waiting for.
func wait(ctx context.Context, sess *ssh.Session) (stopped bool, err error) {
	done := make(chan error, 1)
	go func() { done <- sess.Wait() }()
	select {
	case err := <-done:
		return false, err
	case <-ctx.Done():
		sess.Close()
		return true, nil
	}
}

// stopRemote kills the command started under token, with kill.sh run on a session of its own.
// It runs once the command's context has ended, so it has a timeout of its own; it uses no
// session slot, as it acts for a command that holds one.
func (c *Client) stopRemote(cn *conn, token string) error {
	ctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
	defer cancel()
	sess, err := openSession(ctx, cn)
	if err != nil {
		return err
	}
	defer sess.Close()
	if err := sess.Start(c.wrap(Command("sh", "-c", killScript, "kip-kill", token), rand.Text())); err != nil {
		return err
	}
	if stopped, err := wait(ctx, sess); stopped {
		return ctx.Err()
	} else if exit := (*ssh.ExitError)(nil); errors.As(err, &exit) && exit.ExitStatus() == 1 {
		return errors.New("it survived SIGTERM for 5s")
	} else if err != nil {
		return err
	}
	return nil
}

// session opens a session on a live connection. A connection found dead here is replaced once:
// nothing has started on it, so nothing can run twice.
func (c *Client) session(ctx context.Context) (*ssh.Session, *conn, error) {
	cn, err := c.live(ctx)
	if err != nil {
		return nil, nil, err
	}
	sess, err := openSession(ctx, cn)
	if err != nil && cn.ended(time.Second) {
		if cn, err = c.live(ctx); err != nil {
			return nil, nil, err
		}
		sess, err = openSession(ctx, cn)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("open session: %w", err)
	}
	return sess, cn, nil
}

// openSession opens a session on cn. sshd refuses sessions beyond MaxSessions, counting those
// whose command has not exited yet (stopped commands, for a moment), so a refusal is retried
// for a while.
func openSession(ctx context.Context, cn *conn) (*ssh.Session, error) {
	const maxDelay, patience = 200 * time.Millisecond, 5 * time.Second
	deadline := time.Now().Add(patience)
	for delay := 10 * time.Millisecond; ; delay = min(2*delay, maxDelay) {
		sess, err := cn.NewSession()
		var refused *ssh.OpenChannelError
		if !errors.As(err, &refused) || time.Now().After(deadline) {
			return sess, err
		}
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return nil, err
		}
	}
}

// lost explains a command that ended without an exit status, normally because the connection
// dropped while it ran.
func (c *Client) lost(cn *conn, cmd string, err error) error {
	if !cn.ended(time.Second) {
		return c.wrapErr(fmt.Errorf("command %q ended without an exit status: %w; it may or may not have completed", short(cmd), err))
	}
	return unreachable{fmt.Errorf("connection to %s lost while running %q: %w; the command may or may not have completed", c.label, short(cmd), cn.err)}
}
