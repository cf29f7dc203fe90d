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

# Base images. A tag moves; a digest names the bytes. No digest is written
# here: none has been read from the registries, and a digest not read from
# them would claim more than the tag does. To pin a release, read the
# digests where the registries are reachable, e.g.
#   docker buildx imagetools inspect gcr.io/distroless/static-debian12:nonroot
# and pass them:
#   --build-arg RUNTIME_IMAGE=gcr.io/distroless/static-debian12:nonroot@sha256:<digest>
#   --build-arg BUILD_IMAGE=golang:1.26-bookworm@sha256:<digest>
# RUNTIME_IMAGE matters most: its files ship. BUILD_IMAGE's Go only
# bootstraps: .ci/build has it fetch the release toolchain, which the go
# command checks against the checksum database, so the builder's own Go
# version does not reach the binary.
ARG BUILD_IMAGE=golang:1.26-bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/static-debian12:nonroot

FROM ${BUILD_IMAGE} AS build
WORKDIR /src
# Dependencies and the release toolchain first, so code changes refetch
# neither. The golang image sets GOTOOLCHAIN=local; .ci/build sets its own
# regardless, and names it for this step too.
COPY go.mod go.sum ./
COPY .ci/build .ci/build
RUN GOTOOLCHAIN="$(sh .ci/build --toolchain)" go mod download
COPY . .
ARG VERSION=dev
ARG COMMIT=none
# .ci/build is the release build; CI runs the same script, so it cannot rot.
RUN sh .ci/build /out/sluice "${VERSION}" "${COMMIT}" \
 && mkdir -p /out/data

FROM ${RUNTIME_IMAGE}
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
# probes GET /readyz on the admin listener with the admin token. It cannot
# see the command the container runs, so it reads the --config and
# --admin-listen of `sluice serve` from PID 1; SLUICE_CONFIG is still the
# plainer way, as every other sluice command run in the container uses it.
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s CMD ["/sluice", "healthcheck"]
ENTRYPOINT ["/sluice"]
CMD ["serve"]
