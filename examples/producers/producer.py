#!/usr/bin/env python3
"""Post events to a sluice sidecar. Standard library only (Python 3.8+).

Environment:
  SLUICE_URL      ingest base URL (default http://127.0.0.1:8700)
  SLUICE_SOCKET   unix socket path of the ingest listener (wins over SLUICE_URL)
  EVENTS          how many events to post (default 10)
  EVENT_TYPE      event type (default example.created)
  KEY_PREFIX      Idempotency-Key prefix; keys are PREFIX-0 .. PREFIX-(N-1)
  INTERVAL_MS     pause between events (default 0)
  OVERSIZE_BYTES  if > 0, also post one event of this many bytes to show 413

Each event keeps its Idempotency-Key across retries, so a retry can never
create a second event: 202 is accepted, 200 is a duplicate of an accepted
event (also fine), 413 is given up, 503 waits Retry-After, other failures
back off and retry a few times. The last stdout line is a JSON summary.
"""
import http.client
import json
import os
import socket
import sys
import time
import urllib.parse

MAX_ATTEMPTS = 6


class UnixHTTPConnection(http.client.HTTPConnection):
    """HTTPConnection over a unix domain socket."""

    def __init__(self, path, timeout=10):
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        s.connect(self.socket_path)
        self.sock = s


def connect():
    sock = os.environ.get("SLUICE_SOCKET")
    if sock:
        return UnixHTTPConnection(sock), ""
    u = urllib.parse.urlsplit(os.environ.get("SLUICE_URL", "http://127.0.0.1:8700"))
    cls = http.client.HTTPSConnection if u.scheme == "https" else http.client.HTTPConnection
    return cls(u.hostname, u.port, timeout=10), u.path.rstrip("/")


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def post(event_type, key, body):
    """Post one event until it is settled; return accepted|duplicate|too_large|failed."""
    backoff = 0.2
    for attempt in range(1, MAX_ATTEMPTS + 1):
        conn, prefix = connect()
        try:
            conn.request("POST", f"{prefix}/v1/events/{event_type}", body=body,
                         headers={"Content-Type": "application/json", "Idempotency-Key": key})
            resp = conn.getresponse()
            status, retry_after, text = resp.status, resp.getheader("Retry-After"), resp.read()
        except OSError as e:  # refused, reset, timeout: the sidecar may be restarting
            status, retry_after, text = None, None, str(e).encode()
        finally:
            conn.close()
        if status == 202:
            return "accepted"
        if status == 200:
            return "duplicate"
        if status == 413:
            log(f"{key}: too large ({len(body)} bytes), giving up on this event")
            return "too_large"
        if status is not None and 400 <= status < 500 and status != 429:
            log(f"{key}: refused {status}: {text[:200]!r}")
            return "failed"
        wait = backoff
        if status in (429, 503) and retry_after and retry_after.isdigit():
            wait = min(int(retry_after), 30)
        log(f"{key}: attempt {attempt} got {status or text!r}, retrying in {wait}s")
        time.sleep(wait)
        backoff = min(backoff * 2, 5)
    return "failed"


def main():
    n = int(os.environ.get("EVENTS", "10"))
    event_type = os.environ.get("EVENT_TYPE", "example.created")
    prefix = os.environ.get("KEY_PREFIX") or f"py-{int(time.time())}"
    interval = int(os.environ.get("INTERVAL_MS", "0")) / 1000
    oversize = int(os.environ.get("OVERSIZE_BYTES", "0"))

    summary = {"producer": "python", "sent": 0, "accepted": 0, "duplicates": 0,
               "too_large": 0, "failed": 0, "ids": []}
    events = [(f"{prefix}-{i}", json.dumps({"n": i, "source": "python"}).encode()) for i in range(n)]
    if oversize > 0:
        events.append((f"{prefix}-big", json.dumps({"pad": "x" * oversize}).encode()))
    for key, body in events:
        outcome = post(event_type, key, body)
        summary["sent"] += 1
        field = {"accepted": "accepted", "duplicate": "duplicates"}.get(outcome, outcome)
        summary[field] += 1
        if outcome in ("accepted", "duplicate"):
            summary["ids"].append(key)
        if interval:
            time.sleep(interval)
    print(json.dumps(summary), flush=True)
    return 1 if summary["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
