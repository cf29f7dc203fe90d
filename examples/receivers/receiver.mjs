#!/usr/bin/env node
// A webhook endpoint for sluice deliveries. Node.js 18+, built-in modules only.
//
// Environment: PORT (8080), WEBHOOK_SECRET (space-separated whsec_ secrets
// for HMAC "v1" signatures and whpk_ public keys for Ed25519 "v1a" ones, as
// during a rotation or a migration), FAIL_FIRST (answer 500 to the first N
// deliveries, to watch retries).
//
// POST any path: verifies the Standard Webhooks signature (HMAC-SHA256 or
// Ed25519 over "id.timestamp.body", timestamp within 5 minutes either way:
// one v1 entry must match a whsec_ secret or one v1a entry a whpk_ key) and
// answers
// 204 processed, 200 webhook-id already processed (not re-processed),
// 400 missing or malformed headers, 401 bad signature or stale timestamp,
// 500 while FAIL_FIRST lasts. GET /_stats: {received, duplicates, rejected}.
import http from 'node:http';
import crypto from 'node:crypto';

const TOLERANCE = 5 * 60; // seconds, either direction
const SEEN_TTL = 24 * 3600 * 1000; // remember ids as long as sluice's dedup window
const MAX_BODY = 1 << 20;

const hmacKeys = []; // whsec_: HMAC-SHA256 keys
const edKeys = []; // whpk_: Ed25519 public keys, as KeyObjects
for (const s of (process.env.WEBHOOK_SECRET || '').split(/\s+/).filter(Boolean)) {
  if (s.startsWith('whsec_')) {
    hmacKeys.push(Buffer.from(s.slice(6), 'base64'));
  } else if (s.startsWith('whpk_')) {
    const raw = Buffer.from(s.slice(5), 'base64');
    if (raw.length !== 32) throw new Error(`WEBHOOK_SECRET: a whpk_ key is 32 bytes, not ${raw.length}`);
    // The raw 32-byte key as a JWK (RFC 8037): x is its base64url.
    edKeys.push(crypto.createPublicKey({ key: { kty: 'OKP', crv: 'Ed25519', x: raw.toString('base64url') }, format: 'jwk' }));
  } else if (s.startsWith('whsk_')) {
    throw new Error("WEBHOOK_SECRET: a whsk_ key is the sender's secret; give its whpk_ public key");
  } else {
    throw new Error('WEBHOOK_SECRET: each key must start with whsec_ or whpk_');
  }
}
if (hmacKeys.length === 0 && edKeys.length === 0) throw new Error('WEBHOOK_SECRET is required');

// A v1a entry: a 64-byte signature in padded standard base64 (Buffer.from
// would skip characters that are not base64, so the form is checked first).
const ed25519Sig = /^[A-Za-z0-9+/]{86}==$/;

const stats = { received: 0, duplicates: 0, rejected: 0 };
const seen = new Map(); // webhook-id -> time processed
let failLeft = Number(process.env.FAIL_FIRST || 0);

// verify returns 0 when the delivery is authentic, else the status to answer.
function verify(id, ts, signature, body) {
  if (!id || !ts || !signature) return 400;
  if (!/^\d+$/.test(ts)) return 400;
  if (Math.abs(Date.now() / 1000 - Number(ts)) > TOLERANCE) return 401;
  const signed = Buffer.concat([Buffer.from(`${id}.${ts}.`), body]);
  const expected = hmacKeys.map((k) => crypto.createHmac('sha256', k).update(signed).digest());
  for (const entry of signature.split(' ')) {
    const [version, sig] = entry.split(',', 2);
    if (!sig) continue;
    if (version === 'v1') {
      const got = Buffer.from(sig, 'base64');
      if (expected.some((e) => e.length === got.length && crypto.timingSafeEqual(e, got))) return 0;
    } else if (version === 'v1a' && ed25519Sig.test(sig)) {
      const got = Buffer.from(sig, 'base64');
      if (edKeys.some((k) => crypto.verify(null, signed, k, got))) return 0;
    }
  }
  return 401;
}

function process_(id, body) {
  // Your business logic goes here; it runs once per webhook-id.
}

function answer(res, status, payload) {
  const data = payload === undefined ? '' : JSON.stringify(payload);
  res.writeHead(status, data ? { 'Content-Type': 'application/json' } : {});
  res.end(data);
}

const server = http.createServer((req, res) => {
  if (req.method === 'GET' && req.url === '/_stats') return answer(res, 200, stats);
  if (req.method !== 'POST') return answer(res, 405, { error: 'method not allowed' });
  const chunks = [];
  let size = 0;
  req.on('data', (c) => {
    size += c.length;
    if (size > MAX_BODY) { answer(res, 413, { error: 'body too large' }); req.destroy(); return; }
    chunks.push(c);
  });
  req.on('end', () => {
    if (failLeft > 0) { failLeft--; return answer(res, 500, { error: 'FAIL_FIRST' }); }
    const body = Buffer.concat(chunks);
    const id = req.headers['webhook-id'];
    const status = verify(id, req.headers['webhook-timestamp'], req.headers['webhook-signature'], body);
    if (status) { stats.rejected++; return answer(res, status, { error: status === 400 ? 'missing or malformed webhook headers' : 'bad signature' }); }
    const now = Date.now();
    if (seen.has(id)) { stats.duplicates++; return answer(res, 200, { duplicate: true }); }
    if (seen.size > 100000) for (const [k, t] of seen) if (now - t > SEEN_TTL) seen.delete(k);
    seen.set(id, now);
    process_(id, body);
    stats.received++;
    answer(res, 204);
  });
});

const port = Number(process.env.PORT || 8080);
server.listen(port, () => console.error(`receiver listening on :${port}`));
