//go:build unix

package testbed

import (
	"errors"
	"net"
	"syscall"
)

// closedByPeer reports whether the client has closed c, as the kernel
// knows it now: a peek at the socket finds end of file (or a reset) with
// nothing left to read. It reads nothing, so the goroutine holding c is
// undisturbed. False when it cannot tell (c closed here already, not a
// socket, data still queued).
func closedByPeer(c net.Conn) bool {
	// Down to the socket, through TLS and the listener's tracking.
	for {
		w, ok := c.(interface{ NetConn() net.Conn })
		if !ok {
			break
		}
		c = w.NetConn()
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	closed := false
	err = rc.Control(func(fd uintptr) {
		var b [1]byte
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		closed = n == 0 && err == nil || errors.Is(err, syscall.ECONNRESET)
	})
	return err == nil && closed
}
