# syntax=docker/dockerfile:1
# Image of the autoconfig CLI and controller (autoconfig controller | vet | compile | crd).
# Static (CGO_ENABLED=0), multi-stage, non-root. Build from the repository root:
#   docker build -f Dockerfile -t ghcr.io/modelsphere/autoconfig:0.1.0 .
# Build args: GO_BASE (builder image), RUNTIME_BASE (final image; must hold
# nothing but the binary's needs: CA certificates and /etc/passwd are enough),
# GOPROXY (module proxy for air-gapped builds), VERSION (stamped into the binary).
ARG GO_BASE=golang:1.26-bookworm
ARG RUNTIME_BASE=gcr.io/distroless/static-debian12:nonroot

FROM ${GO_BASE} AS build
ARG GOPROXY=https://proxy.golang.org,direct
ARG VERSION=0.1.0
ENV CGO_ENABLED=0 GOPROXY=${GOPROXY} GOFLAGS=-trimpath
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/root/go/pkg/mod go mod download
# Only the Go sources: the build context's .cache (envtest binaries) and
# testdata never reach the builder.
COPY cmd/ cmd/
COPY compiler/ compiler/
COPY internal/ internal/
COPY schema/ schema/
RUN --mount=type=cache,target=/root/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    go build -ldflags "-s -w -X github.com/modelsphere/autoconfig/internal/cli.Version=${VERSION}" -o /out/autoconfig ./cmd/autoconfig

FROM ${RUNTIME_BASE}
COPY --from=build /out/autoconfig /usr/local/bin/autoconfig
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/autoconfig"]
