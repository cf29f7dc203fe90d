package signing_test

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/signing"
)

// Example signs a delivery the way sluice does and verifies it the way a
// receiver must, using the Standard Webhooks test vector.
func Example() {
	secret, err := signing.ParseSecret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	if err != nil {
		fmt.Println(err)
		return
	}
	secrets := []signing.Secret{secret}
	id, ts := "msg_p5jXN8AQM9LWM0D4loKWxJek", int64(1614265330)
	body := []byte(`{"test": 2432232314}`)

	// Sender: set webhook-id, webhook-timestamp and webhook-signature.
	sig := signing.Sign(secrets, id, ts, body)
	fmt.Println(signing.HeaderSignature+":", sig)

	// Receiver: check the headers against its clock.
	now := time.Unix(ts, 0).Add(30 * time.Second)
	err = signing.Verify(secrets, id, strconv.FormatInt(ts, 10), sig, body, now, signing.DefaultTolerance)
	fmt.Println("verify:", err)

	// A replay an hour later is refused.
	err = signing.Verify(secrets, id, strconv.FormatInt(ts, 10), sig, body, now.Add(time.Hour), signing.DefaultTolerance)
	fmt.Println("replay too old:", errors.Is(err, signing.ErrTimestampTooOld))

	// Secrets never print their key.
	fmt.Println("secret:", secret)
	// Output:
	// webhook-signature: v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=
	// verify: <nil>
	// replay too old: true
	// secret: whsec_…redacted
}

// ExampleAppendSignature shows the allocation-free form for a hot path, with
// two secrets during a rotation.
func ExampleAppendSignature() {
	current, _ := signing.ParseSecret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	previous := signing.NewSecret([]byte("an-older-key-of-at-least-24-bytes"))
	buf := make([]byte, 0, 2*48) // 47 bytes per entry plus a separator
	buf = signing.AppendSignature(buf[:0], []signing.Secret{current, previous},
		"msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, []byte(`{"test": 2432232314}`))
	fmt.Println(string(buf[:47]))
	fmt.Println(len(buf))
	// Output:
	// v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=
	// 95
}

// ExampleSecret_PublicKey signs with an Ed25519 (whsk_) secret beside an
// HMAC one, as during a move from one scheme to the other, and verifies
// the way a receiver holding only the whpk_ public key does. The key is RFC
// 8032's TEST 1 seed; Python's cryptography and Node's crypto.sign give the
// same v1a entry.
func ExampleSecret_PublicKey() {
	hmacSecret, _ := signing.ParseSecret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	edSecret, err := signing.ParseSecret("whsk_nWGxne/9WmC6hEr0kuwsxERJxWl7MmkZcDusAxyuf2A=")
	if err != nil {
		fmt.Println(err)
		return
	}
	public, _ := edSecret.PublicKey()
	fmt.Println("public key:", public)

	id, ts := "msg_p5jXN8AQM9LWM0D4loKWxJek", int64(1614265330)
	body := []byte(`{"test": 2432232314}`)
	sig := signing.Sign([]signing.Secret{hmacSecret, edSecret}, id, ts, body)
	fmt.Println(signing.HeaderSignature+":", sig)

	// The receiver parses the whpk_ key it was given, never the secret.
	pk, err := signing.ParsePublicKey(public.Encode())
	if err != nil {
		fmt.Println(err)
		return
	}
	now := time.Unix(ts, 0)
	err = signing.Verify(nil, id, strconv.FormatInt(ts, 10), sig, body, now, signing.DefaultTolerance, pk)
	fmt.Println("verify:", err)
	fmt.Println("secret:", edSecret)
	// Output:
	// public key: whpk_11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo=
	// webhook-signature: v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE= v1a,fldxM4gAKugP6nnt1hdz3sgGfZ6d99nzrMFnZOELIxbzEHoVmAb2ADpkJK7zgPePmPsle0zV9jSeGlHFG2NVAw==
	// verify: <nil>
	// secret: whsk_…redacted
}
