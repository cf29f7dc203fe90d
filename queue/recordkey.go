package queue

import "fmt"

// MaxRecordKeyBytes bounds a Records key: far above what the proxy makes
// ("token." and a SHA-256 in hex is 70 bytes), low enough that a key fits
// any backend's key or subject.
const MaxRecordKeyBytes = 256

// CheckRecordKey returns nil if key can name a record (Records): one or
// more dot-separated, non-empty segments of [A-Za-z0-9_-], at most
// MaxRecordKeyBytes in all. Otherwise the error names the key and wraps
// ErrBadKey. Both backends call it, so they accept the same keys.
func CheckRecordKey(key string) error {
	if why := checkRecordKey(key, false); why != "" {
		return fmt.Errorf("record key %q: %s: %w", key, why, ErrBadKey)
	}
	return nil
}

// CheckRecordPrefix returns nil if prefix can start a record key
// (ListRecords): "" (every record), or complete segments optionally
// followed by a "." or the start of one more segment ("token.", "token",
// "tok"). Otherwise the error names the prefix and wraps ErrBadKey.
func CheckRecordPrefix(prefix string) error {
	if prefix == "" {
		return nil
	}
	if why := checkRecordKey(prefix, true); why != "" {
		return fmt.Errorf("record key prefix %q: %s: %w", prefix, why, ErrBadKey)
	}
	return nil
}

// checkRecordKey says what is wrong with key ("" when nothing is); a
// prefix may end in '.'.
func checkRecordKey(key string, prefix bool) string {
	switch {
	case key == "":
		return "empty"
	case len(key) > MaxRecordKeyBytes:
		return fmt.Sprintf("longer than %d bytes", MaxRecordKeyBytes)
	}
	seg := 0 // bytes of the current segment so far
	for i := 0; i < len(key); i++ {
		c := key[i]
		switch {
		case c == '.':
			if seg == 0 {
				return "an empty segment"
			}
			seg = 0
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '_', c == '-':
			seg++
		default:
			return fmt.Sprintf("byte %q at %d (segments of A-Z, a-z, 0-9, '_' and '-' separated by '.')", c, i)
		}
	}
	if seg == 0 && !prefix {
		return "an empty segment"
	}
	return ""
}
