package config

import (
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strings"

	"github.com/sluicehq/sluice/proxy/admin"
	"github.com/sluicehq/sluice/signing"
)

// maxSecretFileSize bounds a secret or token file: anything larger is a
// mistake (the wrong path), not a list of secrets.
const maxSecretFileSize = 1 << 20

var envNamePattern = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// errNotOverAPI refuses secret_file and secret_env in a subscription
// document of the API: a client must not make the sidecar read its files
// or its environment.
var errNotOverAPI = invalidf("not accepted over the API: give the secret inline")

func (a *AdminConfig) resolveToken() error {
	a.ResolvedToken = ""
	switch {
	case a.Token != "" && a.TokenFile != "":
		return fieldErr("admin", nil, newReason(ErrConflict, "token and token_file are both set; use one"))
	case a.Token != "":
		if err := checkToken(a.Token); err != nil {
			return fieldErr("admin.token", redactedText, err)
		}
		a.ResolvedToken = a.Token
	case a.TokenFile != "":
		b, err := readSmallFile(a.TokenFile)
		if err != nil {
			return fieldErr("admin.token_file", a.TokenFile, &reason{kind: ErrInvalidValue, msg: err.Error(), cause: err})
		}
		tok := strings.TrimSpace(string(b))
		if tok == "" {
			return fieldErr("admin.token_file", a.TokenFile, newReason(ErrMissingValue, "file is empty"))
		}
		if err := checkToken(tok); err != nil {
			return fieldErr("admin.token_file", a.TokenFile, err)
		}
		a.ResolvedToken = tok
	}
	return nil
}

// resolveTenantTokens reads and checks admin.tokens into
// ResolvedTenantTokens; it runs after resolveToken. No error shows a
// token.
func (a *AdminConfig) resolveTenantTokens() error {
	a.ResolvedTenantTokens = nil
	if len(a.Tokens) == 0 {
		return nil
	}
	if a.ResolvedToken == "" {
		return fieldErr("admin.tokens", nil, newReason(ErrMissingValue,
			"tenant tokens need an operator token (admin.token or admin.token_file): without one the admin API asks no request for a token, so a tenant token would restrict nothing"))
	}
	out := make([]TenantToken, 0, len(a.Tokens))
	for i, t := range a.Tokens {
		p := fmt.Sprintf("admin.tokens[%d]", i)
		var tok, field string
		switch {
		case t.Token != "" && t.TokenFile != "":
			return fieldErr(p, nil, newReason(ErrConflict, "token and token_file are both set; use one"))
		case t.Token != "":
			field, tok = p+".token", t.Token
			if err := checkToken(tok); err != nil {
				return fieldErr(field, redactedText, err)
			}
		case t.TokenFile != "":
			field = p + ".token_file"
			b, err := readSmallFile(t.TokenFile)
			if err != nil {
				return fieldErr(field, t.TokenFile, &reason{kind: ErrInvalidValue, msg: err.Error(), cause: err})
			}
			if tok = strings.TrimSpace(string(b)); tok == "" {
				return fieldErr(field, t.TokenFile, newReason(ErrMissingValue, "file is empty"))
			}
			if err := checkToken(tok); err != nil {
				return fieldErr(field, t.TokenFile, err)
			}
		default:
			return fieldErr(p+".token", nil, newReason(ErrMissingValue, "no token: set token or token_file"))
		}
		if t.Tenant == "" {
			return fieldErr(p+".tenant", nil, newReason(ErrMissingValue, "required: the tenant the token acts for"))
		}
		if !idPattern.MatchString(t.Tenant) {
			return fieldErr(p+".tenant", t.Tenant, invalidf("must match %s", idPattern))
		}
		// A token must say who is asking: one shared with the operator or
		// another tenant would act for both.
		if tok == a.ResolvedToken {
			return fieldErr(field, nil, newReason(ErrDuplicate, "the same token as the operator's (admin.token or admin.token_file)"))
		}
		if j := slices.IndexFunc(out, func(o TenantToken) bool { return o.Token == tok }); j >= 0 {
			return fieldErr(field, nil, newReason(ErrDuplicate, "the same token as admin.tokens[%d]", j))
		}
		out = append(out, TenantToken{Token: tok, Tenant: t.Tenant})
	}
	a.ResolvedTenantTokens = out
	return nil
}

// checkToken requires a token that fits an Authorization header unchanged
// and is long enough not to be guessed (admin.MinTokenBytes).
func checkToken(tok string) error {
	for i := 0; i < len(tok); i++ {
		if tok[i] < 0x21 || tok[i] > 0x7e {
			return invalidf("token must be printable ASCII without spaces")
		}
	}
	if len(tok) < admin.MinTokenBytes {
		return invalidf("token must be at least %d bytes (a random one: openssl rand -hex 32)", admin.MinTokenBytes)
	}
	return nil
}

// resolveSecrets checks that exactly one secret source is set, reads it and
// parses every secret into s.Resolved. Errors never contain secret text.
func (s *SubscriptionConfig) resolveSecrets(p string, lookup func(string) (string, bool)) error {
	s.Resolved = nil
	var sources []string
	if s.Secret != "" {
		sources = append(sources, "secret")
	}
	if len(s.Secrets) > 0 {
		sources = append(sources, "secrets")
	}
	if s.SecretFile != "" {
		sources = append(sources, "secret_file")
	}
	if s.SecretEnv != "" {
		sources = append(sources, "secret_env")
	}
	inline := lookup == nil
	switch {
	case len(sources) == 0 && inline:
		return fieldErr(joinPath(p, "secret"), nil, newReason(ErrMissingValue, "no secret: set secret or secrets"))
	case len(sources) == 0:
		return fieldErr(p+".secret", nil, newReason(ErrMissingValue, "no secret: set one of secret, secrets, secret_file or secret_env"))
	case len(sources) > 1:
		return fieldErr(p, nil, newReason(ErrConflict, "several secret sources (%s): set exactly one", strings.Join(sources, ", ")))
	case inline && (sources[0] == "secret_file" || sources[0] == "secret_env"):
		return fieldErr(joinPath(p, sources[0]), nil, errNotOverAPI)
	}

	if len(s.Secrets) > maxSecrets {
		return fieldErr(p+".secrets", nil, invalidf("lists %d secrets, more than %d", len(s.Secrets), maxSecrets))
	}
	var out []signing.Secret
	seen := map[string]bool{}
	add := func(field, where, raw string) error {
		sec, err := signing.ParseSecret(raw)
		if err != nil {
			return fieldErr(field, where, secretReason(err, raw))
		}
		// An Ed25519 key may be written as its seed or as seed and public
		// key; its public key names it either way.
		id := raw
		if pk, ok := sec.PublicKey(); ok {
			id = pk.Encode()
		}
		if seen[id] {
			return fieldErr(field, where, newReason(ErrDuplicate, "the same secret is listed twice"))
		}
		seen[id] = true
		out = append(out, sec)
		return nil
	}

	switch sources[0] {
	case "secret":
		if err := add(p+".secret", redactedText, s.Secret); err != nil {
			return err
		}
	case "secrets":
		for i, raw := range s.Secrets {
			if err := add(fmt.Sprintf("%s.secrets[%d]", p, i), redactedText, raw); err != nil {
				return err
			}
		}
	case "secret_file":
		f := p + ".secret_file"
		b, err := readSmallFile(s.SecretFile)
		if err != nil {
			return fieldErr(f, s.SecretFile, &reason{kind: ErrInvalidValue, msg: err.Error(), cause: err})
		}
		for n, line := range strings.Split(string(b), "\n") {
			line = strings.TrimSpace(line)
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			if err := add(f, s.SecretFile, line); err != nil {
				var ve *ValidationError
				if errors.As(err, &ve) {
					ve.Err = &reason{kind: ErrInvalidValue, msg: fmt.Sprintf("line %d: %v", n+1, ve.Err), cause: ve.Err}
				}
				return err
			}
		}
		if len(out) == 0 {
			return fieldErr(f, s.SecretFile, newReason(ErrMissingValue, "file holds no secret"))
		}
	case "secret_env":
		f := p + ".secret_env"
		if !envNamePattern.MatchString(s.SecretEnv) {
			return fieldErr(f, s.SecretEnv, invalidf("not a valid environment variable name"))
		}
		v, ok := lookup(s.SecretEnv)
		if !ok {
			return fieldErr(f, s.SecretEnv, newReason(ErrMissingValue, "environment variable is not set"))
		}
		fields := strings.Fields(v)
		if len(fields) == 0 {
			return fieldErr(f, s.SecretEnv, newReason(ErrMissingValue, "environment variable is empty"))
		}
		for i, raw := range fields {
			if err := add(f, s.SecretEnv, raw); err != nil {
				var ve *ValidationError
				if errors.As(err, &ve) {
					ve.Err = &reason{kind: ErrInvalidValue, msg: fmt.Sprintf("secret %d: %v", i+1, ve.Err), cause: ve.Err}
				}
				return err
			}
		}
	}
	if len(out) > maxSecrets { // secret_file or secret_env
		return fieldErr(joinPath(p, sources[0]), nil, invalidf("holds %d secrets, more than %d", len(out), maxSecrets))
	}
	s.Resolved = out
	return nil
}

// secretReason wraps a signing.ParseSecret error. signing promises not to
// repeat the secret; the text is scrubbed anyway because this message goes
// to logs.
func secretReason(err error, raw string) error {
	msg := err.Error()
	_, b64, _ := strings.Cut(raw, "_") // after whsec_, whsk_ or a mistaken prefix
	for _, s := range []string{raw, b64} {
		if len(s) >= 4 {
			msg = strings.ReplaceAll(msg, s, redactedText)
		}
	}
	return &reason{kind: ErrInvalidValue, msg: "invalid secret: " + strings.TrimPrefix(msg, "parse secret: "), cause: err}
}

// readSmallFile reads a secret or token file, refusing anything large enough
// to be a mistake.
func readSmallFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxSecretFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if len(b) > maxSecretFileSize {
		return nil, fmt.Errorf("read %s: larger than %d bytes", path, maxSecretFileSize)
	}
	return b, nil
}
