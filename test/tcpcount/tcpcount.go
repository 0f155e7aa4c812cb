// Package tcpcount gives tests a loopback TCP listener that counts the connections made to it,
// to prove that some code path connects nowhere.
package tcpcount

import (
	"net"
	"sync/atomic"
	"testing"
)

// Listen returns the address of a listener that accepts, counts and closes every connection,
// and the count. It stops at the test's cleanup.
func Listen(t testing.TB) (addr string, accepted *atomic.Int32) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	accepted = new(atomic.Int32)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			c.Close()
		}
	}()
	return l.Addr().String(), accepted
}
