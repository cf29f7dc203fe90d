package queuetest

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/queue"
)

// The contract of queue.Records, for a store that implements it: named
// small records beside the delivery state.

// runRecords runs the Records subtests; each skips when the backend's
// store does not implement queue.Records.
func runRecords(t *testing.T, b Backend) {
	for _, c := range []struct {
		name string
		test func(*testing.T, *env)
	}{
		{"PutGetReplace", testRecordPutGet},
		{"ListByPrefix", testRecordList},
		{"Delete", testRecordDelete},
		{"BadKeys", testRecordBadKeys},
		{"SurviveReopen", testRecordReopen},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.test(t, &env{b: b, place: b.NewPlace(t)})
		})
	}
}

// openRecords opens the env's store as queue.Records, or skips the test.
func openRecords(t *testing.T, e *env, opts Options) (queue.Store, queue.Records) {
	t.Helper()
	s := e.open(t, opts)
	r, ok := s.(queue.Records)
	if !ok {
		t.Skipf("%T does not implement queue.Records", s)
	}
	return s, r
}

func putRecord(t *testing.T, r queue.Records, key, value string) {
	t.Helper()
	if err := r.PutRecord(key, []byte(value)); err != nil {
		t.Fatalf("put record %s: %v", key, err)
	}
}

func wantRecord(t *testing.T, r queue.Records, key, want string) {
	t.Helper()
	v, err := r.GetRecord(key)
	if err != nil || string(v) != want {
		t.Fatalf("get record %s = %q, %v; want %q", key, v, err, want)
	}
}

func wantNoRecord(t *testing.T, r queue.Records, key string) {
	t.Helper()
	if v, err := r.GetRecord(key); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("get record %s = %q, %v; want ErrNotFound", key, v, err)
	}
}

func wantList(t *testing.T, r queue.Records, prefix string, want map[string]string) {
	t.Helper()
	got, err := r.ListRecords(prefix)
	if err != nil {
		t.Fatalf("list records %q: %v", prefix, err)
	}
	gotS := map[string]string{}
	for k, v := range got {
		gotS[k] = string(v)
	}
	if !maps.Equal(gotS, want) {
		t.Fatalf("list records %q = %v, want %v", prefix, gotS, want)
	}
}

func testRecordPutGet(t *testing.T, e *env) {
	_, r := openRecords(t, e, Options{})
	wantNoRecord(t, r, "token.abc")
	v := []byte(`{"tenant":"acme"}`)
	if err := r.PutRecord("token.abc", v); err != nil {
		t.Fatal(err)
	}
	copy(v, "XXXX") // the store kept its own copy
	wantRecord(t, r, "token.abc", `{"tenant":"acme"}`)
	putRecord(t, r, "token.abc", `{"tenant":"globex"}`)
	wantRecord(t, r, "token.abc", `{"tenant":"globex"}`)
	// Keys are case-sensitive and may be a single segment.
	putRecord(t, r, "token.ABC", "upper")
	putRecord(t, r, "flag", "")
	wantRecord(t, r, "token.abc", `{"tenant":"globex"}`)
	wantRecord(t, r, "token.ABC", "upper")
	wantRecord(t, r, "flag", "")
}

func testRecordList(t *testing.T, e *env) {
	s, r := openRecords(t, e, Options{})
	all := map[string]string{
		"token.a":       "1",
		"token.b_c-D":   "2",
		"token.b.deep":  "3",
		"token":         "4",
		"tokens.x":      "5",
		"other.token.a": "6",
	}
	for k, v := range all {
		putRecord(t, r, k, v)
	}
	// The delivery state beside the records is none of them.
	join(t, s, "token", nil)
	wantList(t, r, "", all)
	wantList(t, r, "token.", map[string]string{"token.a": "1", "token.b_c-D": "2", "token.b.deep": "3"})
	wantList(t, r, "token.b", map[string]string{"token.b_c-D": "2", "token.b.deep": "3"})
	wantList(t, r, "token.b.", map[string]string{"token.b.deep": "3"})
	wantList(t, r, "token", map[string]string{"token.a": "1", "token.b_c-D": "2", "token.b.deep": "3", "token": "4", "tokens.x": "5"})
	wantList(t, r, "tok", map[string]string{"token.a": "1", "token.b_c-D": "2", "token.b.deep": "3", "token": "4", "tokens.x": "5"})
	wantList(t, r, "other.", map[string]string{"other.token.a": "6"})
	wantList(t, r, "none.", map[string]string{})
	// A replaced record is listed with its new value, a deleted one not at all.
	putRecord(t, r, "token.a", "1b")
	if err := r.DeleteRecord("token.b_c-D"); err != nil {
		t.Fatal(err)
	}
	wantList(t, r, "token.", map[string]string{"token.a": "1b", "token.b.deep": "3"})
}

func testRecordDelete(t *testing.T, e *env) {
	_, r := openRecords(t, e, Options{})
	putRecord(t, r, "token.a", "1")
	putRecord(t, r, "token.b", "2")
	if err := r.DeleteRecord("token.a"); err != nil {
		t.Fatal(err)
	}
	wantNoRecord(t, r, "token.a")
	wantRecord(t, r, "token.b", "2")
	// Deleting what is not there (any more) is no error.
	for _, k := range []string{"token.a", "token.never"} {
		if err := r.DeleteRecord(k); err != nil {
			t.Fatalf("delete of missing record %s: %v", k, err)
		}
	}
	// A key deleted can be written again.
	putRecord(t, r, "token.a", "again")
	wantRecord(t, r, "token.a", "again")
}

func testRecordBadKeys(t *testing.T, e *env) {
	_, r := openRecords(t, e, Options{})
	bad := []string{
		"", ".", ".token", "token.", "token..a", "token/a", "token a", "token.*", "token.>",
		"tök", "token\x00", "token.a\n", strings.Repeat("a", queue.MaxRecordKeyBytes+1),
	}
	named := func(op, key string, err error) {
		t.Helper()
		if !errors.Is(err, queue.ErrBadKey) {
			t.Errorf("%s %q: %v, want ErrBadKey", op, key, err)
			return
		}
		if !strings.Contains(err.Error(), fmt.Sprintf("%q", key)) {
			t.Errorf("%s %q: %q does not name the key", op, key, err)
		}
	}
	for _, k := range bad {
		named("put", k, r.PutRecord(k, []byte("x")))
		_, err := r.GetRecord(k)
		named("get", k, err)
		named("delete", k, r.DeleteRecord(k))
	}
	for _, p := range []string{".", ".token", "token..", "token/", "token.*", "token >", "tök"} {
		_, err := r.ListRecords(p)
		named("list", p, err)
	}
	// Nothing was written by the refusals; the longest key is fine.
	wantList(t, r, "", map[string]string{})
	long := strings.Repeat("a", queue.MaxRecordKeyBytes)
	putRecord(t, r, long, "x")
	wantRecord(t, r, long, "x")
}

func testRecordReopen(t *testing.T, e *env) {
	s, r := openRecords(t, e, Options{Sync: true})
	putRecord(t, r, "token.keep", "1")
	putRecord(t, r, "token.gone", "2")
	putRecord(t, r, "token.replaced", "old")
	putRecord(t, r, "token.replaced", "new")
	if err := r.DeleteRecord("token.gone"); err != nil {
		t.Fatal(err)
	}
	s = e.reopen(t, s, Options{Sync: true})
	r = s.(queue.Records)
	wantRecord(t, r, "token.keep", "1")
	wantRecord(t, r, "token.replaced", "new")
	wantNoRecord(t, r, "token.gone")
	got, err := r.ListRecords("token.")
	if err != nil {
		t.Fatal(err)
	}
	if keys := slices.Sorted(maps.Keys(got)); !slices.Equal(keys, []string{"token.keep", "token.replaced"}) {
		t.Fatalf("records after reopen: %v", keys)
	}
}
