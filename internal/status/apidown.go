package status

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/sshx"
)

// APIDownError is Collect's error when the cluster's API does not answer. What SSH showed of
// k3s on the server says why, when kip could look.
type APIDownError struct {
	// API is the API server's address; Err is how the request failed.
	API string
	Err error
	// Server is the server's SSH address, "" when none is known.
	Server string
	// Unit is k3s's unit on the server, nil when SSH did not show it; NotSeen then says why.
	Unit    *Unit
	NotSeen string
}

func (e *APIDownError) Error() string {
	s := fmt.Sprintf("the cluster's API at %s does not answer (%v)", e.API, e.Err)
	if e.Unit != nil {
		c := e.check()
		return s + "; over SSH, on the server " + e.Server + ": " + c.Detail + orEmpty(c.Fix, "; ")
	}
	return s + orEmpty(e.NotSeen, "; ")
}

func (e *APIDownError) Unwrap() error { return e.Err }

// check is the k3s service check of the server's unit, as doctor judges it with the API down.
func (e *APIDownError) check() Check {
	return checkUnit(target{addr: e.Server, server: true}, e.Unit, true)
}

func orEmpty(s, prefix string) string {
	if s == "" {
		return ""
	}
	return prefix + s
}

// WriteText says that the API does not answer and what SSH showed on the server: the unit's
// state, its last journal lines and the fix.
func (e *APIDownError) WriteText(w io.Writer) error {
	b := &strings.Builder{}
	fmt.Fprintf(b, "API: %s does not answer: %v\n", e.API, e.Err)
	if e.Unit == nil {
		if e.NotSeen != "" {
			fmt.Fprintf(b, "  %s %s\n", glyphSkipped, e.NotSeen)
		}
		_, err := io.WriteString(w, b.String())
		return err
	}
	c := e.check()
	glyph := map[CheckStatus]string{StatusOK: cli.GlyphOK, StatusWarn: cli.GlyphWarn, StatusFail: cli.GlyphFail}[c.Status]
	fmt.Fprintf(b, "\nServer %s, over SSH\n  %s %s\n", e.Server, glyph, c.Detail)
	if len(c.Log) > 0 {
		fmt.Fprintf(b, "    last %d lines of its journal:\n", len(c.Log))
		for _, l := range c.Log {
			fmt.Fprintf(b, "      %s\n", l)
		}
	}
	if c.Fix != "" {
		fmt.Fprintf(b, "    fix: %s\n", c.Fix)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// apiDown says err means the API did not answer: no connection, or a 5xx from whatever stands
// in front of it; not an answer that refuses (401, 403, 404).
func apiDown(err error) bool {
	if errors.Is(err, context.Canceled) {
		return false
	}
	var st apierrors.APIStatus
	if errors.As(err, &st) {
		switch st.Status().Code {
		case http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
			return true
		}
		return false
	}
	return true
}

// apiDownError explains an API that does not answer with what SSH shows of k3s on the server:
// one round trip, when the server's address and SSH are known.
func apiDownError(ctx context.Context, o *Options, c *kube.Clients, err error) error {
	e := &APIDownError{API: c.Config.Host, Err: err, Server: o.Server}
	switch {
	case o.APIOnly:
		e.NotSeen = "kip did not look at k3s on the server over SSH (--api-only)"
	case o.Dial == nil:
		e.NotSeen = "kip could not look at k3s on the server: SSH is not set up; " + sshFix
	case o.Server == "":
		e.NotSeen = "kip could not look at k3s on the server: it knows no SSH address for it (no saved cluster, and the cluster record is read through the API); pass --cluster with the cluster saved by kip install"
	default:
		t := target{addr: o.Server, server: true}
		in := inspectHost(ctx, o.Dial, t, hostRequest{probe: func(target) []string { return []string{unitArg(true)} }})
		switch {
		case in.dialErr != nil:
			if forget, ok := sshx.HostKeyChanged(in.dialErr); ok {
				e.NotSeen = fmt.Sprintf("kip refused %s over SSH: %v; %s", t.label(), in.dialErr, hostKeyFix(forget))
			} else {
				e.NotSeen = fmt.Sprintf("%s does not answer over SSH either (%v): is the server up? Look at it in your provider's console", t.label(), in.dialErr)
			}
		case in.probeErr != nil:
			e.NotSeen = fmt.Sprintf("cannot read k3s's state on %s: %v", t.label(), in.probeErr)
		case in.probe.unit == nil:
			e.NotSeen = "the host script showed no k3s unit on " + t.label()
		default:
			e.Unit = in.probe.unit
		}
	}
	return e
}
