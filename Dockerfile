# syntax=docker/dockerfile:1
# Image of one binary of the repository, chosen by the build arg BINARY:
#   autoconfig  the CLI and controller (autoconfig controller | vet | compile | crd)
#   reload      the reload sidecar (docs/reload.md)
#   hagate      the hagate sidecar (docs/hagate.md)
#   readyz      the readyz sidecar (docs/readyz.md)
# Static (CGO_ENABLED=0), multi-stage, non-root (65532:65532). Build from the
# repository root, stamped like make build (version, commit, the commit's date):
#   docker build --build-arg BINARY=reload --build-arg VERSION=0.1.0 \
#     --build-arg COMMIT=$(git rev-parse --short=12 HEAD) \
#     --build-arg BUILD_DATE=$(TZ=UTC git log -1 --format=%cd --date=format-local:%Y-%m-%dT%H:%M:%SZ) \
#     -t ghcr.io/modelsphere/autoconfig-reload:0.1.0 .
# Image names: autoconfig for BINARY=autoconfig, autoconfig-<BINARY> for the
# sidecars. Several platforms at once: docker buildx build --platform
# linux/amd64,linux/arm64 (the builder stage cross-compiles on the build host).
# Without a container engine, make images builds the same images
# (hack/images).
# Build args: BINARY (above), GO_BASE (builder image), RUNTIME_BASE (final
# image; must hold nothing but the binary's needs: CA certificates and
# /etc/passwd are enough), GOPROXY (module proxy for air-gapped builds),
# GOSUMDB (checksum database; "off" behind a private proxy, go.sum still
# checks every module), GOTOOLCHAIN (local: the Go of GO_BASE, which must
# satisfy go.mod; auto downloads the toolchain go.mod asks for through
# GOPROXY), VERSION, COMMIT, BUILD_DATE (stamped into the binary with the
# Makefile's LDFLAGS: --version, the build log line, autoconfig_build_info;
# without COMMIT and BUILD_DATE the binary says it is an unstamped build).
# With BINARY=reload: the reload sidecar signals the consumer's main process,
# so it must run as the same user as that process (runAsUser in the pod spec)
# or with CAP_KILL; docs/consumers.md shows both. The image default stays
# non-root.
ARG BINARY=autoconfig
ARG GO_BASE=golang:1.26-bookworm
ARG RUNTIME_BASE=gcr.io/distroless/static-debian12:nonroot
ARG VERSION=0.1.0
ARG COMMIT=
ARG BUILD_DATE=

FROM --platform=$BUILDPLATFORM ${GO_BASE} AS build
ARG BINARY
ARG GOPROXY=https://proxy.golang.org,direct
ARG GOSUMDB=sum.golang.org
ARG GOTOOLCHAIN=local
ARG VERSION
ARG COMMIT
ARG BUILD_DATE
ARG TARGETOS
ARG TARGETARCH
# The module and build caches at fixed paths, whatever GO_BASE's GOPATH and HOME.
ENV CGO_ENABLED=0 GOPROXY=${GOPROXY} GOSUMDB=${GOSUMDB} GOTOOLCHAIN=${GOTOOLCHAIN} \
    GOMODCACHE=/cache/go-mod GOCACHE=/cache/go-build
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/cache/go-mod go mod download
# Only the Go sources: the build context's .cache (envtest binaries) and
# testdata never reach the builder.
COPY cmd/ cmd/
COPY compiler/ compiler/
COPY internal/ internal/
COPY schema/ schema/
# -buildvcs=false: the commit is stamped through -ldflags (as make images
# builds them).
RUN --mount=type=cache,target=/cache/go-mod --mount=type=cache,target=/cache/go-build \
    case "${BINARY}" in autoconfig|reload|hagate|readyz) ;; \
      *) echo "BINARY=${BINARY}: want autoconfig, reload, hagate or readyz" >&2; exit 1 ;; esac && \
    GOOS=${TARGETOS} GOARCH=${TARGETARCH} go build -trimpath -buildvcs=false \
      -ldflags "-s -w -X github.com/modelsphere/autoconfig/internal/cli.Version=${VERSION} -X github.com/modelsphere/autoconfig/internal/cli.Commit=${COMMIT} -X github.com/modelsphere/autoconfig/internal/cli.BuildDate=${BUILD_DATE}" \
      -o /out/${BINARY} ./cmd/${BINARY}

# The runtime stage common to all four; the image-<BINARY> stages below add
# what cannot take a build arg: the entrypoint (exec form) and the
# description.
FROM ${RUNTIME_BASE} AS runtime
ARG BINARY
ARG VERSION
ARG COMMIT
ARG BUILD_DATE
LABEL org.opencontainers.image.title="${BINARY}" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${COMMIT}" \
      org.opencontainers.image.created="${BUILD_DATE}" \
      org.opencontainers.image.source="https://github.com/modelsphere/autoconfig" \
      org.opencontainers.image.licenses="Apache-2.0"
WORKDIR /
USER 65532:65532

FROM runtime AS image-autoconfig
LABEL org.opencontainers.image.description="ModelRoute control plane: the autoconfig CLI (vet, compile, diff, crd) and the in-cluster controller"
ENTRYPOINT ["/usr/local/bin/autoconfig"]

FROM runtime AS image-reload
LABEL org.opencontainers.image.description="reload sidecar: watches the mounted route ConfigMap and reloads the consumer on a settled change"
ENTRYPOINT ["/usr/local/bin/reload"]

FROM runtime AS image-hagate
LABEL org.opencontainers.image.description="hagate sidecar: keeps one replica of a stateful router active by leader election on a Lease and a pod label"
ENTRYPOINT ["/usr/local/bin/hagate"]

FROM runtime AS image-readyz
LABEL org.opencontainers.image.description="readyz sidecar: answers GET /readyz with 503 while a required local TCP port has no listener"
ENTRYPOINT ["/usr/local/bin/readyz"]

FROM image-${BINARY}
ARG BINARY
COPY --from=build --chown=65532:65532 --chmod=0755 /out/${BINARY} /usr/local/bin/${BINARY}
