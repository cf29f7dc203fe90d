package testbed_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/signing"
	"github.com/sluicehq/sluice/testbed"
)

// seen is what a Hook recorded of one request.
type seen struct {
	path, id, attempt, body string
	n                       int64
	status                  int
	received                time.Time
}

func TestHook_SeesEveryRequestAndChoosesTheAnswer(t *testing.T) {
	sec, err := signing.GenerateSecret()
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var got []seen
	s := mustOpen(t, testbed.Options{Secrets: []signing.Secret{sec}, Hook: func(r testbed.Request, status int) int {
		mu.Lock()
		got = append(got, seen{string(r.Path()), string(r.Header(signing.HeaderID)), string(r.Header("X-Attempt")), string(r.Body()), r.N(), status, r.Received()})
		mu.Unlock()
		switch string(r.Body()) {
		case `"conflict"`:
			return http.StatusConflict
		case `"later"`:
			return http.StatusTooManyRequests
		case `"hold"`:
			return 0
		}
		return status
	}})
	s.SetMode("/down", testbed.ModeFail)
	c, ctx := newClient(t), waitCtx(t)
	before := time.Now()
	send1 := func(path, id, body string) (int, http.Header) {
		d := signed([]signing.Secret{sec}, id, body)
		d.attempt = "1"
		return send(t, ctx, c, s.URL()+path, d)
	}
	if code, _ := send1("/p", "a", `{}`); code != 200 {
		t.Fatalf("kept answer: %d", code)
	}
	if code, _ := send1("/p", "b", `"conflict"`); code != 409 {
		t.Fatalf("replaced answer: %d, want 409", code)
	}
	if code, hdr := send1("/p", "c", `"later"`); code != 429 || hdr.Get("Retry-After") != testbed.DefaultRetryAfter {
		t.Fatalf("a Hook's 429: %d, Retry-After %q", code, hdr.Get("Retry-After"))
	}
	if code, _ := send1("/down", "d", `{}`); code != 500 {
		t.Fatalf("the mode's 500 kept: %d", code)
	}
	if code, _ := send(t, ctx, c, s.URL()+"/p", delivery{id: "e", body: "{}"}); code != 401 {
		t.Fatalf("unsigned: %d", code)
	}

	mu.Lock()
	want := []seen{
		{path: "/p", id: "a", attempt: "1", body: `{}`, n: 1, status: 200},
		{path: "/p", id: "b", attempt: "1", body: `"conflict"`, n: 2, status: 200},
		{path: "/p", id: "c", attempt: "1", body: `"later"`, n: 3, status: 200},
		{path: "/down", id: "d", attempt: "1", body: `{}`, n: 1, status: 500},
		{path: "/p", id: "e", body: `{}`, n: 4, status: 401},
	}
	if len(got) != len(want) {
		t.Fatalf("the Hook saw %d requests, want %d: %+v", len(got), len(want), got)
	}
	for i, g := range got {
		if g.received.Before(before) || g.received.After(time.Now()) {
			t.Errorf("request %d received at %v", i, g.received)
		}
		g.received = time.Time{}
		if g != want[i] {
			t.Errorf("request %d: %+v, want %+v", i, g, want[i])
		}
	}
	mu.Unlock()
	// Counted as answered: the replaced answers too.
	st := s.Stats()["/p"]
	if st.Requests != 4 || st.Accepted != 1 || st.Statuses[409] != 1 || st.Statuses[429] != 1 || st.Statuses[401] != 1 || st.Unique != 1 {
		t.Fatalf("stats = %+v", st)
	}

	// 0 holds the request like a black hole.
	reqCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		d := signed([]signing.Secret{sec}, "f", `"hold"`)
		req, _ := http.NewRequestWithContext(reqCtx, http.MethodPost, s.URL()+"/p", strings.NewReader(d.body))
		req.Header.Set(signing.HeaderID, d.id)
		req.Header.Set(signing.HeaderTimestamp, d.ts)
		req.Header.Set(signing.HeaderSignature, d.sig)
		if resp, err := c.Do(req); err == nil {
			resp.Body.Close()
			t.Errorf("a held request was answered %s", resp.Status)
		}
	}()
	// Holding is counted once the request is judged, after InFlight.
	if err := s.Wait(ctx, func(m map[string]testbed.PathStats) bool { return m["/p"].InFlight == 1 && s.Totals().Holding == 1 }); err != nil {
		t.Fatalf("request not held: %v", err)
	}
	if tot := s.Totals(); tot.Holding != 1 || tot.Held != 1 {
		t.Fatalf("totals while holding: %+v", tot)
	}
	cancel()
	<-done
}

func TestRelease_EndsTheHeldRequestsOnly(t *testing.T) {
	s := mustOpen(t, testbed.Options{})
	s.SetMode("/hole", testbed.ModeBlackhole)
	c, ctx := newClient(t), waitCtx(t)
	hold := func() chan error {
		errc := make(chan error, 1)
		go func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.URL()+"/hole", strings.NewReader("{}"))
			resp, err := c.Do(req)
			if err == nil {
				resp.Body.Close()
				err = fmt.Errorf("answered %s", resp.Status)
			} else {
				err = nil // closed without an answer
			}
			errc <- err
		}()
		return errc
	}
	first := hold()
	if err := s.Wait(ctx, func(m map[string]testbed.PathStats) bool { return m["/hole"].InFlight == 1 }); err != nil {
		t.Fatal(err)
	}
	s.Release()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if err := s.Wait(ctx, func(m map[string]testbed.PathStats) bool { return m["/hole"].InFlight == 0 }); err != nil {
		t.Fatal(err)
	}
	// The mode stays: the next request is held again, until Close.
	second := hold()
	if err := s.Wait(ctx, func(m map[string]testbed.PathStats) bool { return m["/hole"].InFlight == 1 && s.Totals().Holding == 1 }); err != nil {
		t.Fatal(err)
	}
	tot := s.Totals()
	if tot.Held != 2 || tot.Holding != 1 || tot.HangUps != 0 {
		t.Fatalf("totals = %+v, want 2 held, 1 holding, no hang-ups (Release ended the first)", tot)
	}
	s.ResetModes()
	if code, _ := send(t, ctx, c, s.URL()+"/hole", delivery{}); code != 200 {
		t.Fatalf("after ResetModes: %d", code)
	}
	if st := s.Stats()["/hole"]; st.InFlight != 1 {
		t.Fatalf("ResetModes released a held request: %+v", st)
	}
	s.Release()
	if err := <-second; err != nil {
		t.Fatal(err)
	}
}

func TestMaxHold(t *testing.T) {
	s := mustOpen(t, testbed.Options{Mode: testbed.ModeBlackhole, MaxHold: 50 * time.Millisecond})
	ctx := waitCtx(t)
	resp, err := newClient(t).Post(s.URL()+"/hole", "application/json", strings.NewReader("{}"))
	if err == nil {
		resp.Body.Close()
		t.Fatalf("answered %s", resp.Status)
	}
	if err := s.Wait(ctx, func(m map[string]testbed.PathStats) bool { return m["/hole"].InFlight == 0 }); err != nil {
		t.Fatal(err)
	}
	if tot := s.Totals(); tot.Held != 1 || tot.HangUps != 0 {
		t.Fatalf("totals = %+v, want the hold ended by MaxHold, not by the client", tot)
	}
}

func TestTotalsAndAccepted(t *testing.T) {
	s := mustOpen(t, testbed.Options{})
	s.SetMode("/f", testbed.ModeFail)
	c, ctx := newClient(t), waitCtx(t)
	for _, p := range []string{"/a", "/a", "/b", "/f"} {
		send(t, ctx, c, s.URL()+p, delivery{})
	}
	if tot := s.Totals(); tot != (testbed.Totals{Requests: 4, Accepted: 3, Failed: 1}) {
		t.Fatalf("totals = %+v", tot)
	}
	if a, b, f, none := s.Accepted("/a"), s.Accepted("/b"), s.Accepted("/f"), s.Accepted("/none"); a != 2 || b != 1 || f != 0 || none != 0 {
		t.Fatalf("Accepted: /a %d, /b %d, /f %d, /none %d", a, b, f, none)
	}
}

func TestLean(t *testing.T) {
	s := mustOpen(t, testbed.Options{Lean: true})
	c, ctx := newClient(t), waitCtx(t)
	for _, id := range []string{"x", "x", "y"} {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.URL()+"/p", strings.NewReader("{}"))
		req.Header.Set(signing.HeaderID, id)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || len(b) != 0 || resp.Header.Get("Server") != "" || resp.Header.Get("Date") != "" || resp.Header.Get("Content-Type") != "" {
			t.Fatalf("lean answer: %d %q %v", resp.StatusCode, b, resp.Header)
		}
	}
	st := s.Stats()["/p"]
	if st.Accepted != 3 || st.Unique != 0 || st.Duplicates != 0 || s.IDs("/p") != nil {
		t.Fatalf("lean stats = %+v, ids %v: no webhook-id is kept", st, s.IDs("/p"))
	}
}

// TestHangUpReportsTheHeldRequest: HangUp is called once per black-holed
// request when its hold ends, with its path, its number and when it
// ended, and before the request stops counting as in flight.
func TestHangUpReportsTheHeldRequest(t *testing.T) {
	type hangUp struct {
		path  string
		n     int64
		ended time.Time
	}
	var mu sync.Mutex
	var got []hangUp
	s := mustOpen(t, testbed.Options{Mode: testbed.ModeBlackhole, MaxHold: 50 * time.Millisecond,
		HangUp: func(path string, n int64, ended time.Time) {
			mu.Lock()
			got = append(got, hangUp{path, n, ended})
			mu.Unlock()
		}})
	ctx, c := waitCtx(t), newClient(t)
	for i := range 2 {
		sent := time.Now()
		resp, err := c.Post(s.URL()+"/hole", "application/json", strings.NewReader("{}"))
		if err == nil {
			resp.Body.Close()
			t.Fatalf("answered %s", resp.Status)
		}
		if err := s.Wait(ctx, func(m map[string]testbed.PathStats) bool { return m["/hole"].InFlight == 0 }); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		if len(got) != i+1 {
			t.Fatalf("after request %d ended: %d HangUp calls", i+1, len(got))
		}
		h := got[i]
		mu.Unlock()
		if h.path != "/hole" || h.n != int64(i+1) || h.ended.Sub(sent) < 50*time.Millisecond {
			t.Fatalf("HangUp(%q, %d, %v after the send), want (\"/hole\", %d, at least MaxHold after)", h.path, h.n, h.ended.Sub(sent), i+1)
		}
	}
}
