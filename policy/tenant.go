package policy

// ValidTenant reports whether t is a tenant id: 1 to 64 bytes of
// lowercase letters and digits, and after the first also '.', '_' and
// '-' (^[a-z0-9][a-z0-9._-]{0,63}$). Ingest's Sluice-Tenant header, the
// subscriptions' tenant key and tenant tokens all take this form.
func ValidTenant(t string) bool {
	if len(t) == 0 || len(t) > 64 {
		return false
	}
	for i := 0; i < len(t); i++ {
		c := t[i]
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
		case i > 0 && (c == '.' || c == '_' || c == '-'):
		default:
			return false
		}
	}
	return true
}
