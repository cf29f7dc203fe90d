package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// clockTicks is USER_HZ, the unit of utime and stime in /proc/<pid>/stat:
// 100 on every common Linux build; initClockTicks asks getconf.
var clockTicks = 100.0

func initClockTicks() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "getconf", "CLK_TCK").Output()
	if err != nil {
		return
	}
	if v, err := strconv.ParseFloat(strings.TrimSpace(string(out)), 64); err == nil && v > 0 {
		clockTicks = v
	}
}

// procCPU is the CPU time (user + system) process pid has used so far, at
// the resolution of a clock tick (10 ms).
func procCPU(pid int) (time.Duration, error) {
	t, err := procTimes(pid)
	return t.User + t.Sys, err
}

// cpuTimes splits a process's CPU time: at low load the sidecar's cost was
// about half system time, which utime+stime alone hides.
type cpuTimes struct {
	User, Sys time.Duration
}

// procTimes is the user and system CPU time process pid has used so far
// (utime and stime of /proc/<pid>/stat, clock ticks).
func procTimes(pid int) (cpuTimes, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return cpuTimes{}, err
	}
	// The command name (field 2) is in parentheses and may hold spaces.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 > len(b) {
		return cpuTimes{}, fmt.Errorf("parse /proc/%d/stat", pid)
	}
	f := strings.Fields(string(b[i+2:]))
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return cpuTimes{}, fmt.Errorf("parse /proc/%d/stat: %d fields", pid, len(f))
	}
	ut, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return cpuTimes{}, fmt.Errorf("parse /proc/%d/stat: %w", pid, err)
	}
	tick := func(n uint64) time.Duration { return time.Duration(float64(n) / clockTicks * float64(time.Second)) }
	return cpuTimes{User: tick(ut), Sys: tick(st)}, nil
}

// procWakeups counts what a process's fixed costs are made of: the context
// switches of all its threads (voluntary ones are mostly a thread going to
// sleep in futex or epoll and being woken again) and its read- and
// write-like syscalls (/proc/<pid>/io; epoll_wait, futex and timers are not
// in it). Threads that exited are not counted; Go's threads rarely do.
type wakeups struct {
	Voluntary, Involuntary int64
	SyscR, SyscW           int64
}

func (w wakeups) switches() int64 { return w.Voluntary + w.Involuntary }
func (w wakeups) syscalls() int64 { return w.SyscR + w.SyscW }

func (w *wakeups) add(o wakeups) {
	w.Voluntary += o.Voluntary
	w.Involuntary += o.Involuntary
	w.SyscR += o.SyscR
	w.SyscW += o.SyscW
}

func procWakeups(pid int) (wakeups, error) {
	var w wakeups
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return w, err
	}
	for _, t := range tasks {
		path := fmt.Sprintf("/proc/%d/task/%s/status", pid, t.Name())
		v, err1 := statusField(path, "voluntary_ctxt_switches:")
		n, err2 := statusField(path, "nonvoluntary_ctxt_switches:")
		if err1 != nil || err2 != nil {
			continue // the thread exited meanwhile
		}
		w.Voluntary += v
		w.Involuntary += n
	}
	r, err1 := statusField(fmt.Sprintf("/proc/%d/io", pid), "syscr:")
	wr, err2 := statusField(fmt.Sprintf("/proc/%d/io", pid), "syscw:")
	if err := errors.Join(err1, err2); err != nil {
		return w, err
	}
	w.SyscR, w.SyscW = r, wr
	return w, nil
}

// procRSS is the resident set size of pid in bytes (VmRSS).
func procRSS(pid int) (int64, error) {
	v, err := statusField(fmt.Sprintf("/proc/%d/status", pid), "VmRSS:")
	return v * 1024, err
}

// memUse is a process's resident memory in bytes, from /proc/<pid>/status.
// RSS (VmRSS) is Anon (RssAnon: Go heap, stacks, the runtime's own) plus
// File (RssFile: the binary's text and mmapped files, Badger's tables and
// value log among them) plus shared memory; HWM (VmHWM) is the highest RSS
// of the process's life, start-up included.
type memUse struct {
	RSS, HWM, Anon, File uint64
}

// procMem reads pid's memUse.
func procMem(pid int) (memUse, error) {
	path := fmt.Sprintf("/proc/%d/status", pid)
	var m memUse
	var errs []error
	for _, f := range []struct {
		key string
		v   *uint64
	}{{"VmRSS:", &m.RSS}, {"VmHWM:", &m.HWM}, {"RssAnon:", &m.Anon}, {"RssFile:", &m.File}} {
		kb, err := statusField(path, f.key)
		*f.v = uint64(kb) * 1024
		errs = append(errs, err)
	}
	return m, errors.Join(errs...)
}

// statusField reads "Key:   N kB" from a /proc status-like file.
func statusField(path, key string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), key); ok {
			fs := strings.Fields(rest)
			if len(fs) == 0 {
				break
			}
			return strconv.ParseInt(fs[0], 10, 64)
		}
	}
	return 0, fmt.Errorf("%s: no %s", path, key)
}

// machine describes where the numbers come from.
type machine struct {
	CPUs          int    `json:"nproc"`
	CPUModel      string `json:"cpu_model"`
	MemTotalBytes int64  `json:"mem_total_bytes"`
	Kernel        string `json:"kernel"`
	GoVersion     string `json:"go_version"`
	GoToolchain   string `json:"go_toolchain,omitempty"`
	GOMAXPROCS    int    `json:"gomaxprocs"`
	Date          string `json:"date"`
	Commit        string `json:"commit,omitempty"`
	SluiceVersion string `json:"sluice_version,omitempty"`
	ClockTicks    int    `json:"clock_ticks_per_s"`
}

func machineInfo() machine {
	m := machine{
		CPUs: runtime.NumCPU(), GoVersion: runtime.Version(), GOMAXPROCS: runtime.GOMAXPROCS(0),
		Date: time.Now().UTC().Format(time.RFC3339), ClockTicks: int(clockTicks),
	}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.SplitSeq(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	if v, err := statusField("/proc/meminfo", "MemTotal:"); err == nil {
		m.MemTotalBytes = v * 1024
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "go", "version").Output(); err == nil {
		m.GoToolchain = strings.TrimSpace(string(out))
	}
	if out, err := exec.CommandContext(ctx, "git", "rev-parse", "--short", "HEAD").Output(); err == nil {
		m.Commit = strings.TrimSpace(string(out))
		if st, err := exec.CommandContext(ctx, "git", "status", "--porcelain").Output(); err == nil && len(bytes.TrimSpace(st)) > 0 {
			m.Commit += "+dirty"
		}
	}
	return m
}

func sluiceVersion(bin string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "version").Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}

// child is a process the harness started: the sidecar, the no-op server or
// the Badger appender. The harness stops every child it still holds when it
// exits.
type child struct {
	h      *harness
	name   string
	cmd    *exec.Cmd
	pid    int
	start  time.Time
	exited chan struct{}
	err    error // from Wait, valid after exited is closed
	logf   *os.File
	once   sync.Once
}

// runChildJSON runs bench itself as a child with args (a baseline's
// subcommand), waits at most limit for it to finish, and decodes what it
// printed (one JSON value) into v. name names its log, what the child in
// errors.
func (h *harness) runChildJSON(ctx context.Context, name, what string, args []string, limit time.Duration, v any) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	var out syncWriter
	logPath := filepath.Join(h.tmp, h.nextID(name)+".log")
	c, err := h.startChild(name, self, args, logPath, &out)
	if err != nil {
		return err
	}
	t := time.NewTimer(limit)
	defer t.Stop()
	select {
	case <-c.exited:
	case <-ctx.Done():
		c.stop(5 * time.Second)
		return ctx.Err()
	case <-t.C:
		c.stop(5 * time.Second)
		return fmt.Errorf("%s did not finish within %s", what, limit)
	}
	c.stop(time.Second)
	if c.err != nil {
		return fmt.Errorf("%s: %v: %s", what, c.err, tail(logPath, 1000))
	}
	if err := json.Unmarshal(out.bytes(), v); err != nil {
		return fmt.Errorf("%s output %q: %w", what, out.bytes(), err)
	}
	return nil
}

// syncWriter serialises writes (a child's stdout is copied by a goroutine
// of exec).
type syncWriter struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(p)
}

func (s *syncWriter) bytes() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return bytes.Clone(s.buf.Bytes())
}

// startChild starts bin with args; stderr goes to logPath, stdout to
// stdout (nil discards).
func (h *harness) startChild(name, bin string, args []string, logPath string, stdout io.Writer) (*child, error) {
	lf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout = stdout
	cmd.Stderr = lf
	// If the harness dies, so do its children.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	c := &child{h: h, name: name, cmd: cmd, exited: make(chan struct{}), logf: lf}
	c.start = time.Now()
	if err := cmd.Start(); err != nil {
		lf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	c.pid = cmd.Process.Pid
	h.mu.Lock()
	h.children[c] = true
	h.mu.Unlock()
	go func() {
		c.err = cmd.Wait()
		close(c.exited)
	}()
	return c, nil
}

// running reports whether the child has not exited.
func (c *child) running() bool {
	select {
	case <-c.exited:
		return false
	default:
		return true
	}
}

// stop sends SIGTERM, waits up to grace, then SIGKILLs. It returns how long
// the child took to exit after SIGTERM and whether it had to be killed.
func (c *child) stop(grace time.Duration) (took time.Duration, killed bool) {
	c.once.Do(func() {
		start := time.Now()
		if c.running() {
			c.cmd.Process.Signal(syscall.SIGTERM)
			t := time.NewTimer(grace)
			select {
			case <-c.exited:
			case <-t.C:
				killed = true
				c.cmd.Process.Kill()
				<-c.exited
			}
			t.Stop()
		}
		took = time.Since(start)
		c.logf.Close()
		c.h.mu.Lock()
		delete(c.h.children, c)
		c.h.mu.Unlock()
	})
	return took, killed
}

// tail returns the last n bytes of the child's stderr log.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	if len(b) > n {
		b = b[len(b)-n:]
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			b = b[i+1:]
		}
	}
	return strings.TrimSpace(string(b))
}

// lineWriter hands the first line written to it to a channel: children
// announce their address that way.
type lineWriter struct {
	mu   sync.Mutex
	buf  []byte
	sent bool
	ch   chan string
}

func newLineWriter() *lineWriter { return &lineWriter{ch: make(chan string, 1)} }

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.sent {
		return len(p), nil
	}
	w.buf = append(w.buf, p...)
	if i := bytes.IndexByte(w.buf, '\n'); i >= 0 {
		w.ch <- string(w.buf[:i])
		w.sent = true
		w.buf = nil
	}
	return len(p), nil
}

// firstLine waits for the child's first stdout line.
func firstLine(c *child, w *lineWriter, timeout time.Duration) (string, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case l := <-w.ch:
		return l, nil
	case <-c.exited:
		return "", fmt.Errorf("%s exited before announcing itself: %v", c.name, c.err)
	case <-t.C:
		return "", fmt.Errorf("%s did not announce itself within %s", c.name, timeout)
	}
}
