package main

// Output helpers of the admin commands: tables, times, JSON.

import (
	"encoding/json"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

func newTable(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 8, 2, ' ', 0) }

// ago describes t relative to now: "3m12s ago", "in 2s".
func ago(t, now time.Time) string {
	d := t.Sub(now)
	if d < 0 {
		return roundDuration(-d) + " ago"
	}
	return "in " + roundDuration(d)
}

func roundDuration(d time.Duration) string {
	switch {
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Hour:
		return d.Round(time.Second).String()
	default:
		return strings.TrimSuffix(d.Round(time.Minute).String(), "0s")
	}
}

func stamp(t, now time.Time) string {
	return t.Local().Format("2006-01-02 15:04:05 MST") + " (" + ago(t, now) + ")"
}

// printJSON writes v indented as the admin API does, ending with a
// newline. v is a wire type of package proxy (or holds them), so --json
// shows the keys the API sends.
func printJSON(w io.Writer, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}
