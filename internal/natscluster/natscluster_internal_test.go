package natscluster

import (
	"net"
	"testing"
)

// TestStartRetriesTakenPort: when a chosen port is bound by someone else
// before the server binds it, Start gives up that attempt and comes up on
// fresh ports.
func TestStartRetriesTakenPort(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	taken := l.Addr().(*net.TCPAddr).Port

	calls := 0
	pickPorts = func(n int) ([]int, error) {
		calls++
		ports, err := freePorts(n)
		if calls == 1 && err == nil {
			ports[0] = taken // node-0's client port
		}
		return ports, err
	}
	t.Cleanup(func() { pickPorts = freePorts })

	c, err := Start(Options{Nodes: 1, Dir: t.TempDir()})
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	defer c.Close()
	if calls != 2 {
		t.Errorf("ports picked %d times, want 2 (one taken, one retry)", calls)
	}
	if c.URL(0) == "nats://"+l.Addr().String() {
		t.Errorf("node-0 reports the taken port %d", taken)
	}
}
