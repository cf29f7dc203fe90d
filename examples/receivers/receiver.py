#!/usr/bin/env python3
"""A webhook endpoint for sluice deliveries. Python 3.8+; standard library
only, unless given a whpk_ key: Ed25519 needs the cryptography package
(pip install cryptography, or Debian's python3-cryptography).

Environment:
  PORT            port to listen on (default 8080)
  WEBHOOK_SECRET  one or more keys, space-separated (rotation, migration):
                  whsec_ secrets (HMAC, "v1" signatures) and whpk_ public
                  keys (Ed25519, "v1a" signatures)
  FAIL_FIRST      answer 500 to the first N deliveries (to watch retries)

POST any path: verifies the Standard Webhooks signature (HMAC-SHA256 or
Ed25519 over "id.timestamp.body", timestamp within 5 minutes either way):
one "v1" entry must match a whsec_ secret or one "v1a" entry a whpk_ key.
Answers
  204  verified and processed
  200  verified, but this webhook-id was already processed (not re-processed)
  400  missing or malformed webhook headers
  401  bad signature or timestamp outside the tolerance
  500  FAIL_FIRST said so (sluice retries 5xx)
GET /_stats answers {"received", "duplicates", "rejected"}.
"""
import base64
import hashlib
import hmac
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TOLERANCE = 5 * 60          # seconds, either direction
SEEN_TTL = 24 * 3600        # remember ids as long as sluice's dedup window
MAX_BODY = 1 << 20


def parse_keys(value):
    """Returns (HMAC keys, Ed25519 public keys)."""
    hmac_keys, ed_keys = [], []
    for s in value.split():
        if s.startswith("whsec_"):
            hmac_keys.append(base64.b64decode(s[len("whsec_"):], validate=True))
        elif s.startswith("whpk_"):
            raw = base64.b64decode(s[len("whpk_"):], validate=True)
            if len(raw) != 32:
                sys.exit(f"WEBHOOK_SECRET: a whpk_ key is 32 bytes, not {len(raw)}")
            ed_keys.append(raw)
        elif s.startswith("whsk_"):
            sys.exit("WEBHOOK_SECRET: a whsk_ key is the sender's secret; give its whpk_ public key")
        else:
            sys.exit("WEBHOOK_SECRET: each key must start with whsec_ or whpk_")
    if not hmac_keys and not ed_keys:
        sys.exit("WEBHOOK_SECRET is required")
    if ed_keys:
        # Imported only here, so that HMAC needs nothing beyond the standard
        # library.
        try:
            from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
        except ImportError:
            sys.exit("WEBHOOK_SECRET: whpk_ keys need the cryptography package "
                     "(pip install cryptography, or apt install python3-cryptography)")
        try:
            ed_keys = [Ed25519PublicKey.from_public_bytes(k) for k in ed_keys]
        except ValueError as e:
            sys.exit(f"WEBHOOK_SECRET: not an Ed25519 public key: {e}")
    return hmac_keys, ed_keys


HMAC_KEYS, ED_KEYS = parse_keys(os.environ.get("WEBHOOK_SECRET", ""))
lock = threading.Lock()
stats = {"received": 0, "duplicates": 0, "rejected": 0}
seen = {}  # webhook-id -> time processed
fail_left = int(os.environ.get("FAIL_FIRST", "0"))


class BadRequest(Exception):
    pass


class Unauthorized(Exception):
    pass


def verify(msg_id, timestamp, signature, body, now):
    if not msg_id or not timestamp or not signature:
        raise BadRequest("missing webhook-id, webhook-timestamp or webhook-signature")
    if not timestamp.isdigit():
        raise BadRequest("malformed webhook-timestamp")
    if abs(now - int(timestamp)) > TOLERANCE:
        raise Unauthorized("timestamp outside the tolerance")
    signed = f"{msg_id}.{timestamp}.".encode() + body
    expected = [base64.b64encode(hmac.new(k, signed, hashlib.sha256).digest()) for k in HMAC_KEYS]
    for entry in signature.split(" "):
        version, _, sig = entry.partition(",")
        if version == "v1":
            for e in expected:
                if hmac.compare_digest(e, sig.encode()):
                    return
        elif version == "v1a" and ED_KEYS:
            if ed25519_matches(sig, signed):
                return
    raise Unauthorized("no matching signature")


def ed25519_matches(sig, signed):
    """Whether a v1a entry's base64 signature verifies with one of ED_KEYS."""
    from cryptography.exceptions import InvalidSignature
    try:
        raw = base64.b64decode(sig, validate=True)
    except ValueError:  # binascii.Error
        return False
    if len(raw) != 64:
        return False
    for key in ED_KEYS:
        try:
            key.verify(raw, signed)
            return True
        except InvalidSignature:
            continue
    return False


def process(msg_id, body):
    """Your business logic goes here; it runs once per webhook-id."""


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def answer(self, status, payload=None):
        data = json.dumps(payload).encode() if payload is not None else b""
        self.send_response(status)
        if data:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path != "/_stats":
            return self.answer(404, {"error": "not found"})
        with lock:
            return self.answer(200, dict(stats))

    def do_POST(self):
        global fail_left
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            self.close_connection = True
            return self.answer(413, {"error": "body too large"})
        body = self.rfile.read(length)
        with lock:
            if fail_left > 0:
                fail_left -= 1
                return self.answer(500, {"error": "FAIL_FIRST"})
        h = self.headers
        msg_id = h.get("webhook-id", "")
        try:
            verify(msg_id, h.get("webhook-timestamp", ""), h.get("webhook-signature", ""), body, time.time())
        except (BadRequest, Unauthorized) as e:
            with lock:
                stats["rejected"] += 1
            return self.answer(400 if isinstance(e, BadRequest) else 401, {"error": str(e)})
        now = time.time()
        with lock:
            if msg_id in seen:
                stats["duplicates"] += 1
                return self.answer(200, {"duplicate": True})
            if len(seen) > 100000:  # forget ids older than SEEN_TTL
                for k in [k for k, t in seen.items() if now - t > SEEN_TTL]:
                    del seen[k]
            seen[msg_id] = now
        process(msg_id, body)
        with lock:
            stats["received"] += 1
        return self.answer(204)

    def log_message(self, fmt, *args):
        pass  # quiet; stats are at /_stats


def main():
    port = int(os.environ.get("PORT", "8080"))
    srv = ThreadingHTTPServer(("", port), Handler)
    print(f"receiver listening on :{port}", file=sys.stderr, flush=True)
    srv.serve_forever()


if __name__ == "__main__":
    main()
