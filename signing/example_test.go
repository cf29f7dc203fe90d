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
