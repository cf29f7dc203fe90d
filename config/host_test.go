package config

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
)

// TestOddIPv4HostRefused: a subscription whose URL spells an IPv4 address
// any way but as four decimal numbers is refused when it is created, from
// the file and over the API, with allow_private_targets on as well (it is
// not the SSRF guard that refuses it: the C resolver reads 2130706433 as
// 127.0.0.1 where Go reads a name). Names, including those whose first
// labels are numbers, and canonical addresses are accepted.
func TestOddIPv4HostRefused(t *testing.T) {
	bad := []string{
		"2130706433", // 127.0.0.1 as one decimal number
		"0x7f000001", // as one hex number
		"0X7F000001",
		"0x7f.0.0.1", // a hex part
		"0x7f.1",
		"127.1", // fewer than four parts
		"10.1",
		"0",
		"0x",
		"0177.0.0.1",      // octal
		"127.000.000.001", // leading zeros
		"010.0.0.1",
		"127.0.0.1.", // a trailing dot
		"1.2.3.4.5",
		"256.0.0.1",
		"hooks.example.123", // no top-level domain is a number
	}
	good := []string{
		"127.0.0.1",
		"8.8.8.8",
		"0.0.0.0",
		"hooks.example.com",
		"hooks.example.com.",
		"1.2.3.example.com",
		"0x7f.example.com",
		"123.example.com",
		"example.0x7g",
		"[::1]",
		"[::ffff:127.0.0.1]",
		"[2001:db8::1]",
	}
	file := func(t *testing.T, url string) error {
		path := filepath.Join(t.TempDir(), "sluice.yaml")
		writeFile(t, path, "allow_private_targets: true\nsubscriptions:\n  - id: a\n    url: "+url+"\n    secret: "+secretA+"\n")
		_, err := Load(path, goodEnviron, nil)
		return err
	}
	api := func(url string) error {
		_, err := ParseSubscription([]byte(`{"id": "a", "url": "` + url + `", "secret": "` + secretA + `"}`))
		return err
	}
	for _, host := range bad {
		t.Run("bad/"+host, func(t *testing.T) {
			url := "http://" + host + ":8080/hooks"
			for via, err := range map[string]error{"file": file(t, url), "api": api(url)} {
				var ve *ValidationError
				switch {
				case err == nil:
					t.Errorf("%s: %s accepted", via, url)
				case !errors.As(err, &ve) || !strings.HasSuffix(ve.Field, "url") || !errors.Is(err, ErrInvalidValue):
					t.Errorf("%s: %v (%T): want an invalid value of url", via, err, err)
				case !strings.Contains(err.Error(), "IPv4 address in another spelling"):
					t.Errorf("%s: %q does not say why", via, err)
				}
			}
		})
	}
	for _, host := range good {
		t.Run("good/"+host, func(t *testing.T) {
			url := "http://" + host + ":8080/hooks"
			for via, err := range map[string]error{"file": file(t, url), "api": api(url)} {
				if err != nil {
					t.Errorf("%s: %s refused: %v", via, url, err)
				}
			}
		})
	}
}
