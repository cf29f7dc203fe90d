# sluice container image: a static binary on distroless, running as nonroot.
#
#   docker build -t sluice --build-arg VERSION=v0.1.0 --build-arg COMMIT=$(git rev-parse --short HEAD) .
#
# Listeners: sluice binds 127.0.0.1 by default, on purpose: as a sidecar its
# only producer is the service next to it. Inside a container, loopback is
# that container's own, so bind what the producer can reach:
#   - a pod or a shared network namespace: 127.0.0.1 keeps working;
#   - otherwise SLUICE_LISTEN=0.0.0.0:8700, or a unix socket on a shared
#     volume, e.g. SLUICE_LISTEN=unix:///run/sluice/ingest.sock.
# The admin API (8701) stays on loopback unless admin.token_file is set
# (SLUICE_ADMIN__TOKEN_FILE): sluice refuses SLUICE_ADMIN__LISTEN=0.0.0.0:8701
# without an operator token (admin.insecure_no_token: true overrides that,
# dangerously). The HEALTHCHECK below probes it on loopback either way.

FROM golang:1.26-bookworm AS build
WORKDIR /src
# Dependencies first, so code changes do not refetch modules.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
ARG COMMIT=none
# .ci/build is the release build; CI runs the same script, so it cannot rot.
RUN sh .ci/build /out/sluice "${VERSION}" "${COMMIT}" \
 && mkdir -p /out/data

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/sluice /sluice
# An empty data dir owned by the nonroot user (65532), so a fresh named volume
# inherits that owner. A bind mount keeps the host's owner: make it writable
# for uid 65532.
COPY --from=build --chown=65532:65532 /out/data /var/lib/sluice
WORKDIR /var/lib/sluice
# The Badger log. Mount a persistent volume here: an accepted event lives
# only in this directory until every entitled subscription is done with it.
VOLUME /var/lib/sluice
ENV SLUICE_DATA_DIR=/var/lib/sluice
# 8700 ingest, 8701 admin API (see the note on listeners above).
EXPOSE 8700 8701
# The image has no shell or curl: `sluice healthcheck` reads the same config
# as serve (the file named by SLUICE_CONFIG, and the SLUICE_ environment) and
# probes GET /readyz on the admin listener with the admin token. Point
# SLUICE_CONFIG at your mounted file rather than passing --config, so both
# find it.
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s CMD ["/sluice", "healthcheck"]
ENTRYPOINT ["/sluice"]
CMD ["serve"]
