#!/usr/bin/env bash
# Post events to a sluice sidecar with curl.
#
# Environment: SLUICE_URL (default http://127.0.0.1:8700) or SLUICE_SOCKET
# (unix socket path; uses curl --unix-socket), EVENTS (10), EVENT_TYPE
# (example.created), KEY_PREFIX, INTERVAL_MS (0), OVERSIZE_BYTES (if > 0, one
# extra event of that size, to show 413).
#
# Each event keeps its Idempotency-Key across retries: 202 accepted, 200
# duplicate (already accepted), 413 given up, 503 waits Retry-After, other
# failures back off and retry. The last stdout line is a JSON summary.
set -uo pipefail

n=${EVENTS:-10}
type=${EVENT_TYPE:-example.created}
prefix=${KEY_PREFIX:-curl-$(date +%s)}
interval_ms=${INTERVAL_MS:-0}
oversize=${OVERSIZE_BYTES:-0}
max_attempts=6

if [ -n "${SLUICE_SOCKET:-}" ]; then
  conn=(--unix-socket "$SLUICE_SOCKET")
  base=http://localhost
else
  conn=()
  base=${SLUICE_URL:-http://127.0.0.1:8700}
  base=${base%/}
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

sent=0 accepted=0 duplicates=0 too_large=0 failed=0 ids=()

# post KEY BODYFILE: prints accepted, duplicate, too_large or failed.
post() {
  local key=$1 file=$2 attempt status retry_after wait backoff=0.2
  for ((attempt = 1; attempt <= max_attempts; attempt++)); do
    : >"$tmp/headers"
    status=$(curl -sS "${conn[@]}" -o "$tmp/resp" -D "$tmp/headers" -w '%{http_code}' \
      --max-time 10 -X POST "$base/v1/events/$type" \
      -H 'Content-Type: application/json' -H "Idempotency-Key: $key" \
      --data-binary "@$file" 2>"$tmp/err") || status=000
    case $status in
      202) echo accepted; return ;;
      200) echo duplicate; return ;;
      413) echo "$key: too large, giving up on this event" >&2; echo too_large; return ;;
      429 | 5* | 000) ;;
      4*) echo "$key: refused $status: $(head -c 200 "$tmp/resp")" >&2; echo failed; return ;;
    esac
    wait=$backoff
    retry_after=$(tr -d '\r' <"$tmp/headers" | awk -F': *' 'tolower($1)=="retry-after"{print $2}')
    if [[ $status =~ ^(429|503)$ && $retry_after =~ ^[0-9]+$ ]]; then
      wait=$((retry_after > 30 ? 30 : retry_after))
    fi
    echo "$key: attempt $attempt got $status $(cat "$tmp/err"), retrying in ${wait}s" >&2
    sleep "$wait"
    backoff=$(awk -v b="$backoff" 'BEGIN{b*=2; print (b>5?5:b)}')
  done
  echo failed
}

keys=()
for ((i = 0; i < n; i++)); do
  keys+=("$prefix-$i")
  printf '{"n":%d,"source":"curl"}' "$i" >"$tmp/body-$i"
done
if [ "$oversize" -gt 0 ]; then
  keys+=("$prefix-big")
  { printf '{"pad":"'; head -c "$oversize" /dev/zero | tr '\0' x; printf '"}'; } >"$tmp/body-$n"
fi

for i in "${!keys[@]}"; do
  key=${keys[$i]}
  outcome=$(post "$key" "$tmp/body-$i")
  sent=$((sent + 1))
  case $outcome in
    accepted) accepted=$((accepted + 1)); ids+=("$key") ;;
    duplicate) duplicates=$((duplicates + 1)); ids+=("$key") ;;
    too_large) too_large=$((too_large + 1)) ;;
    *) failed=$((failed + 1)) ;;
  esac
  [ "$interval_ms" -gt 0 ] && sleep "$(awk -v m="$interval_ms" 'BEGIN{print m/1000}')"
done

# Keys use only [A-Za-z0-9._:@/+=-], so they need no JSON escaping.
idlist=
[ "${#ids[@]}" -gt 0 ] && idlist=$(printf '"%s",' "${ids[@]}")
printf '{"producer":"curl","sent":%d,"accepted":%d,"duplicates":%d,"too_large":%d,"failed":%d,"ids":[%s]}\n' \
  "$sent" "$accepted" "$duplicates" "$too_large" "$failed" "${idlist%,}"
[ "$failed" -eq 0 ]
