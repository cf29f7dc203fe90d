#!/usr/bin/env node
// Post events to a sluice sidecar. Node.js 18+, built-in modules only:
// fetch for TCP, node:http for a unix socket (fetch cannot dial one).
//
// Environment: SLUICE_URL (default http://127.0.0.1:8700) or SLUICE_SOCKET,
// EVENTS (10), EVENT_TYPE (example.created), KEY_PREFIX, INTERVAL_MS (0),
// OVERSIZE_BYTES (if > 0, one extra event of that size, to show 413).
//
// Each event keeps its Idempotency-Key across retries: 202 accepted, 200
// duplicate (already accepted), 413 given up, 503 waits Retry-After, other
// failures back off and retry. The last stdout line is a JSON summary.
import http from 'node:http';

const MAX_ATTEMPTS = 6;
const env = process.env;
const socketPath = env.SLUICE_SOCKET || '';
const baseURL = (env.SLUICE_URL || 'http://127.0.0.1:8700').replace(/\/$/, '');
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// send returns {status, retryAfter, text}; it throws on connection errors.
async function send(path, headers, body) {
  if (!socketPath) {
    const res = await fetch(baseURL + path, { method: 'POST', headers, body, signal: AbortSignal.timeout(10000) });
    return { status: res.status, retryAfter: res.headers.get('retry-after'), text: await res.text() };
  }
  return new Promise((resolve, reject) => {
    const req = http.request({ socketPath, path, method: 'POST', headers: { ...headers, 'Content-Length': body.length }, timeout: 10000 }, (res) => {
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (c) => { text += c; });
      res.on('end', () => resolve({ status: res.statusCode, retryAfter: res.headers['retry-after'] ?? null, text }));
    });
    req.on('timeout', () => req.destroy(new Error('timeout')));
    req.on('error', reject);
    req.end(body);
  });
}

async function post(type, key, body) {
  let backoff = 200;
  for (let attempt = 1; attempt <= MAX_ATTEMPTS; attempt++) {
    let r;
    try {
      r = await send(`/v1/events/${type}`, { 'Content-Type': 'application/json', 'Idempotency-Key': key }, body);
    } catch (e) { // refused, reset, timeout: the sidecar may be restarting
      r = { status: 0, retryAfter: null, text: String(e.cause?.code ?? e.message) };
    }
    if (r.status === 202) return 'accepted';
    if (r.status === 200) return 'duplicates';
    if (r.status === 413) {
      console.error(`${key}: too large (${body.length} bytes), giving up on this event`);
      return 'too_large';
    }
    if (r.status >= 400 && r.status < 500 && r.status !== 429) {
      console.error(`${key}: refused ${r.status}: ${r.text.slice(0, 200)}`);
      return 'failed';
    }
    let wait = backoff;
    if ((r.status === 429 || r.status === 503) && /^\d+$/.test(r.retryAfter ?? '')) {
      wait = Math.min(Number(r.retryAfter), 30) * 1000;
    }
    console.error(`${key}: attempt ${attempt} got ${r.status || r.text}, retrying in ${wait}ms`);
    await sleep(wait);
    backoff = Math.min(backoff * 2, 5000);
  }
  return 'failed';
}

const n = Number(env.EVENTS || 10);
const type = env.EVENT_TYPE || 'example.created';
const prefix = env.KEY_PREFIX || `node-${Math.floor(Date.now() / 1000)}`;
const interval = Number(env.INTERVAL_MS || 0);
const oversize = Number(env.OVERSIZE_BYTES || 0);

const summary = { producer: 'node', sent: 0, accepted: 0, duplicates: 0, too_large: 0, failed: 0, ids: [] };
const events = [];
for (let i = 0; i < n; i++) events.push([`${prefix}-${i}`, JSON.stringify({ n: i, source: 'node' })]);
if (oversize > 0) events.push([`${prefix}-big`, JSON.stringify({ pad: 'x'.repeat(oversize) })]);
for (const [key, json] of events) {
  const body = Buffer.from(json);
  const outcome = await post(type, key, body);
  summary.sent++;
  summary[outcome]++;
  if (outcome === 'accepted' || outcome === 'duplicates') summary.ids.push(key);
  if (interval) await sleep(interval);
}
console.log(JSON.stringify(summary));
process.exitCode = summary.failed ? 1 : 0;
