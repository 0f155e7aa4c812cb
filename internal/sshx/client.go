package sshx

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/crypto/ssh"
)

// maxSessions caps the commands a Client runs at once on its connection; more wait for a slot.
// OpenSSH's sshd allows 10 sessions per connection (MaxSessions); staying below leaves room for
// sessions the server has not finished tearing down.
const maxSessions = 8

// Timings, variables so that tests can shorten them.
var (
	// keepaliveInterval is how often a Client asks the server whether it is still there; after
	// keepaliveMaxMissed intervals without a reply the connection is closed.
	keepaliveInterval  = 15 * time.Second
	keepaliveMaxMissed = 3
	// dialBackoff is the wait before each retry of a failed connection attempt.
	dialBackoff = []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second}
)

var errClosed = errors.New("client closed")

// Client runs commands on one host over a single SSH connection, which it opens again when it
// drops. It is safe for concurrent use.
type Client struct {
	cfg   Config // resolved
	label string // user@host:port
	creds *credentials
	keys  hostKeys
	slots chan struct{} // one per running session

	// mu guards cur and closed. It is a channel so that waiting for it can end with a context.
	mu     chan struct{}
	cur    *conn
	closed bool

	commands atomic.Int64 // remote commands started, for -v and measurements
}

// Commands returns how many remote commands the client has started.
func (c *Client) Commands() int64 { return c.commands.Load() }

// Dial connects to the host cfg names, verifying its host key, and, for any user but root,
// checks that the user may run sudo without a password.
func Dial(ctx context.Context, cfg Config) (*Client, error) {
	c, err := newClient(cfg)
	if err != nil {
		return nil, err
	}
	if _, err := c.live(ctx); err != nil {
		return nil, c.wrapErr(err)
	}
	if c.cfg.User != "root" {
		if err := c.checkSudo(ctx); err != nil {
			c.Close()
			return nil, err
		}
	}
	return c, nil
}

// newClient resolves cfg and loads its credentials, without connecting.
func newClient(cfg Config) (*Client, error) {
	rc, err := cfg.resolve()
	if err != nil {
		return nil, fmt.Errorf("ssh %s: %w", cfg.Host, err)
	}
	creds, err := newCredentials(rc)
	if err != nil {
		return nil, fmt.Errorf("ssh %s: %w", rc.label(), err)
	}
	return &Client{
		cfg:   rc,
		label: rc.label(),
		creds: creds,
		keys:  hostKeys{path: rc.KnownHostsPath, notify: rc.notify},
		slots: make(chan struct{}, maxSessions),
		mu:    make(chan struct{}, 1),
	}, nil
}

// String returns user@host:port.
func (c *Client) String() string { return c.label }

// Port returns the SSH port the client connects to.
func (c *Client) Port() int { return c.cfg.Port }

// Host returns the host the client reaches: the address or name after ~/.ssh/config's
// HostName was applied.
func (c *Client) Host() string { return c.cfg.Host }

// User is the user kip logs in as.
func (c *Client) User() string { return c.cfg.User }

// Close closes the connection. Commands still running lose it.
func (c *Client) Close() error {
	c.mu <- struct{}{}
	defer func() { <-c.mu }()
	c.closed = true
	if c.cur != nil {
		c.cur.end(errClosed)
	}
	return nil
}

func (c *Client) wrapErr(err error) error { return fmt.Errorf("ssh %s: %w", c.label, err) }

// checkSudo makes sure the (non-root) user can run commands as root without a password.
func (c *Client) checkSudo(ctx context.Context) error {
	res, err := c.run(ctx, "sudo -n true", nil, raw)
	if err != nil {
		return err
	}
	switch res.ExitStatus {
	case 0:
		return nil
	case 127:
		return fmt.Errorf("user %s on %s cannot run sudo: it is not installed: install sudo or use --ssh-user root", c.cfg.User, c.cfg.Host)
	}
	return fmt.Errorf("user %[1]s on %[2]s cannot run sudo without a password: allow it (e.g. '%[1]s ALL=(ALL) NOPASSWD: ALL' in /etc/sudoers.d/%[1]s) or use --ssh-user root",
		c.cfg.User, c.cfg.Host)
}

// ErrUnreachable is in the chain of an error that says the host could not be reached: every
// attempt to connect failed on the network, or the connection dropped while a command ran.
// errors.Is(err, ErrUnreachable) tells such an error from a command that failed on the host.
var ErrUnreachable = errors.New("host unreachable")

type unreachable struct{ error }

func (u unreachable) Unwrap() error        { return u.error }
func (u unreachable) Is(target error) bool { return target == ErrUnreachable }

// live returns the open connection, connecting first if there is none or it has ended.
func (c *Client) live(ctx context.Context) (*conn, error) {
	select {
	case c.mu <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-c.mu }()
	if c.closed {
		return nil, errClosed
	}
	if c.cur != nil {
		if !c.cur.ended(0) {
			return c.cur, nil
		}
		c.cfg.notify("Reconnecting to %s (the connection was lost: %v)", c.label, c.cur.err)
	}
	cn, err := c.dial(ctx)
	if err != nil {
		return nil, err
	}
	c.cur = cn
	return cn, nil
}

// dial connects, retrying with backoff while the failure is the network's or the server's
// connection limit's, never after an authentication or host key error.
func (c *Client) dial(ctx context.Context) (*conn, error) {
	auth, release, err := c.creds.methods()
	if err != nil {
		return nil, err
	}
	defer release()
	for attempt := 0; ; attempt++ {
		cn, err := c.dialOnce(ctx, auth)
		switch {
		case err == nil:
			return cn, nil
		case ctx.Err() != nil:
			return nil, fmt.Errorf("connect: %w", ctx.Err())
		case !transient(err):
			return nil, err
		case attempt == len(dialBackoff):
			return nil, unreachable{fmt.Errorf("%w (gave up after %d attempts)", err, attempt+1)}
		}
		wait := dialBackoff[attempt]
		c.cfg.notify("Connecting to %s failed (%v); retrying in %s", c.label, err, wait)
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return nil, fmt.Errorf("connect: %w", ctx.Err())
		}
	}
}

// dialOnce makes one attempt to connect and log in, bounded by the configured timeout.
func (c *Client) dialOnce(ctx context.Context, auth []ssh.AuthMethod) (*conn, error) {
	addr := c.cfg.addr()
	check, known, err := c.keys.callback(addr)
	if err != nil {
		return nil, err
	}
	d := net.Dialer{Timeout: c.cfg.Timeout}
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	// The handshake has no deadline of its own: bound it by the timeout and by ctx.
	nc.SetDeadline(time.Now().Add(c.cfg.Timeout))
	stop := context.AfterFunc(ctx, func() { nc.Close() })
	sc, chans, reqs, err := ssh.NewClientConn(nc, addr, &ssh.ClientConfig{
		User:              c.cfg.User,
		Auth:              auth,
		HostKeyCallback:   check,
		HostKeyAlgorithms: hostKeyAlgorithms(known),
	})
	if !stop() {
		err = ctx.Err()
	}
	if err != nil {
		nc.Close()
		var changed hostKeyError
		switch {
		case errors.As(err, &changed):
			return nil, changed // without x/crypto's "ssh: handshake failed: "
		case len(known) > 0 && strings.Contains(err.Error(), "no common algorithm for host key"):
			// x/crypto reports a failed negotiation only as text.
			return nil, c.keys.unoffered(addr, known, err)
		}
		return nil, c.creds.explainAuth(err, c.cfg.User)
	}
	nc.SetDeadline(time.Time{})
	return newConn(ssh.NewClient(sc, chans, reqs)), nil
}

// transient reports whether a failed connection attempt may succeed when repeated: a network
// error, or the server dropping the connection (sshd does so beyond MaxStartups).
func transient(err error) bool {
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) {
		return !dnsErr.IsNotFound
	}
	var netErr net.Error
	return errors.As(err, &netErr) || errors.Is(err, io.EOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNREFUSED)
}

// conn is one SSH connection; it records why it ended.
type conn struct {
	*ssh.Client
	done chan struct{} // closed when the connection has ended
	once sync.Once
	err  error // why it ended, set before done is closed
}

func newConn(client *ssh.Client) *conn {
	cn := &conn{Client: client, done: make(chan struct{})}
	go func() { cn.end(client.Wait()) }()
	go cn.keepalive(keepaliveInterval, keepaliveMaxMissed)
	return cn
}

// end closes the connection; the first cause given is the one reported.
func (cn *conn) end(cause error) {
	cn.once.Do(func() {
		if cause == nil || errors.Is(cause, io.EOF) {
			cause = errors.New("closed by the remote end")
		}
		cn.err = cause
		cn.Client.Close()
		close(cn.done)
	})
}

// ended reports whether the connection has ended, waiting up to wait for it to: a session sees
// its channel close slightly before the connection reports that it is gone.
func (cn *conn) ended(wait time.Duration) bool {
	select {
	case <-cn.done:
		return true
	default:
	}
	if wait <= 0 {
		return false
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-cn.done:
		return true
	case <-t.C:
		return false
	}
}

// keepalive sends keepalive@openssh.com every interval and closes the connection once maxMissed
// intervals have passed without a reply, as OpenSSH's ServerAliveInterval and
// ServerAliveCountMax do. A connection whose network silently died would otherwise hang.
func (cn *conn) keepalive(interval time.Duration, maxMissed int) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	var pending chan error // the reply to the outstanding request, if any
	missed := 0
	for {
		select {
		case <-cn.done:
			return
		case <-pending:
			pending, missed = nil, 0
		case <-tick.C:
			if pending == nil {
				pending = make(chan error, 1)
				go func(reply chan<- error) {
					_, _, err := cn.SendRequest("keepalive@openssh.com", true, nil)
					reply <- err
				}(pending)
				continue
			}
			if missed++; missed >= maxMissed {
				cn.end(fmt.Errorf("no reply from the server to %d keepalives in %s", missed, time.Duration(missed)*interval))
				return
			}
		}
	}
}
