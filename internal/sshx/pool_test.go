package sshx

import (
	"context"
	"errors"
	"sync"
	"testing"

	"kipper.run/kip/test/sshd"
)

func TestPool(t *testing.T) {
	srv := sshd.Start(t)
	cfg, _ := testConfig(t, srv, sshd.User)
	var p Pool
	defer p.Close()

	clients := make([]*Client, 5)
	var wg sync.WaitGroup
	for i := range clients {
		wg.Go(func() {
			c, err := p.Get(context.Background(), cfg)
			if err != nil {
				t.Error(err)
			}
			clients[i] = c
		})
	}
	wg.Wait()
	for _, c := range clients[1:] {
		if c != clients[0] {
			t.Fatal("Get returned different clients for one destination")
		}
	}
	mustRun(t, clients[0], "true")
	if n := srv.Connections(); n != 1 {
		t.Errorf("sshd serves %d connections, want 1", n)
	}

	// Another user is another destination.
	other := cfg
	other.User = sshd.NoSudoUser
	if _, err := p.Get(context.Background(), other); err == nil {
		t.Error("Get as a user without sudo succeeded")
	}

	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := clients[0].Run(context.Background(), "true"); !errors.Is(err, errClosed) {
		t.Errorf("Run after Pool.Close = %v, want %v", err, errClosed)
	}
	c, err := p.Get(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if c == clients[0] {
		t.Error("Get after Close returned the closed client")
	}
	mustRun(t, c, "true")
}
