package sshx

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// Pool shares one Client per destination (user@host:port) among its users. The zero Pool is
// ready to use.
type Pool struct {
	mu      sync.Mutex
	entries map[string]*poolEntry
}

// poolEntry is a Client being dialled (ready open) or dialled.
type poolEntry struct {
	ready  chan struct{}
	client *Client
	err    error
}

// Get returns the pool's Client for the destination cfg resolves to, dialling it on first use.
// Concurrent Gets for one destination dial once; a failed dial is not remembered. Settings other
// than the destination (the key, for one) come from the Config that dialled.
func (p *Pool) Get(ctx context.Context, cfg Config) (*Client, error) {
	rc, err := cfg.resolve()
	if err != nil {
		return nil, fmt.Errorf("ssh %s: %w", cfg.Host, err)
	}
	key := rc.label()

	p.mu.Lock()
	if p.entries == nil {
		p.entries = make(map[string]*poolEntry)
	}
	e, ok := p.entries[key]
	if !ok {
		e = &poolEntry{ready: make(chan struct{})}
		p.entries[key] = e
	}
	p.mu.Unlock()

	if ok {
		select {
		case <-e.ready:
			return e.client, e.err
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	e.client, e.err = Dial(ctx, cfg)
	if e.err != nil {
		p.mu.Lock()
		delete(p.entries, key)
		p.mu.Unlock()
	}
	close(e.ready)
	return e.client, e.err
}

// Close closes every Client in the pool and empties it.
func (p *Pool) Close() error {
	p.mu.Lock()
	entries := p.entries
	p.entries = nil
	p.mu.Unlock()
	var errs []error
	for _, e := range entries {
		<-e.ready
		if e.client != nil {
			errs = append(errs, e.client.Close())
		}
	}
	return errors.Join(errs...)
}
