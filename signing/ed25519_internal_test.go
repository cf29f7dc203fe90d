package signing

import (
	"encoding/base64"
	"encoding/hex"
	"testing"
)

// TestEd25519_RFC8032Signatures checks RFC 8032 section 7.1's TEST 1, 2
// and 3 through this package's own Ed25519 code: ParseSecret of the
// vector's whsk_ seed signs the vector's MESSAGE into the v1a entry of its
// SIGNATURE, and ParsePublicKey of its whpk_ PUBLIC KEY accepts that entry
// and refuses it for another message, another key or a flipped bit. The
// exported API cannot reach a bare message: it always signs
// id.timestamp.body.
func TestEd25519_RFC8032Signatures(t *testing.T) {
	vectors := []struct{ name, seed, public, message, signature string }{
		{"TEST 1",
			"9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60",
			"d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a",
			"",
			"e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b"},
		{"TEST 2",
			"4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb",
			"3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c",
			"72",
			"92a009a9f0d4cab8720e820b5f642540a2b27b5416503f8fb3762223ebdb69da085ac1e43e15996e458f3613d0f11d8c387b2eaeb4302aeeb00d291612bb0c00"},
		{"TEST 3",
			"c5aa8df43f9f837bedb7442f31dcb7b166d38535076f094b85ce3a2e0b4458f7",
			"fc51cd8e6218a1a38da47ed00230f0580816ed13ba3303ac5deb911548908025",
			"af82",
			"6291d657deec24024827e69c3abe01a30ce548a284743a445e3680d7db5ac3ac18ff9b538d16f290ae67f760984dc6594a7c15e9716ed28dc027beceea1ec40a"},
	}
	unhex := func(s string) []byte {
		b, err := hex.DecodeString(s)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	b64 := base64.StdEncoding.EncodeToString
	var others []PublicKey
	for _, v := range vectors {
		pk, err := ParsePublicKey("whpk_" + b64(unhex(v.public)))
		if err != nil {
			t.Fatal(err)
		}
		others = append(others, pk)
	}
	for i, v := range vectors {
		t.Run(v.name, func(t *testing.T) {
			msg, sig := unhex(v.message), unhex(v.signature)
			want := "v1a," + b64(sig)
			for _, form := range [][]byte{unhex(v.seed), append(unhex(v.seed), unhex(v.public)...)} {
				sec, err := ParseSecret("whsk_" + b64(form))
				if err != nil {
					t.Fatal(err)
				}
				if got := string(sec.k.ed.appendEntry(nil, msg)); got != want {
					t.Fatalf("%d-byte key: entry %q, want the RFC's %q", len(form), got, want)
				}
				if !sec.k.ed.pub.Equal(others[i]) {
					t.Fatalf("%d-byte key: public key %s, want the RFC's", len(form), sec.k.ed.pub)
				}
			}
			pk := others[i]
			if !pk.verifyEntries(want, msg) {
				t.Fatal("the RFC signature does not verify with the RFC public key")
			}
			if !pk.verifyEntries("v1,AAAA v1a,"+b64(make([]byte, 64))+" "+want, msg) {
				t.Fatal("the RFC signature does not verify as the last entry of a list")
			}
			if pk.verifyEntries(want, append(msg, 0)) {
				t.Fatal("the RFC signature verifies for another message")
			}
			if others[(i+1)%len(others)].verifyEntries(want, msg) {
				t.Fatal("the RFC signature verifies with another vector's public key")
			}
			for _, bit := range []int{0, 255, 256, 511} {
				flipped := append([]byte(nil), sig...)
				flipped[bit/8] ^= 1 << (bit % 8)
				if pk.verifyEntries("v1a,"+b64(flipped), msg) {
					t.Fatalf("the RFC signature with bit %d flipped verifies", bit)
				}
			}
		})
	}
}
