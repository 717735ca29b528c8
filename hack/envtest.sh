#!/usr/bin/env bash
# Builds a real kube-apiserver and etcd from the Go module proxy for envtest:
# no prebuilt envtest archive is downloaded, only Go modules (k8s.io/kubernetes
# with its staging modules replaced by the published ones, and etcd).
# Idempotent: binaries are cached in $ENVTEST_DIR (default
# .cache/envtest/<k8s version>) and rebuilt only when missing.
# Prints the directory to use as KUBEBUILDER_ASSETS on its last line.
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-v1.37.2}
STAGING_VERSION=${STAGING_VERSION:-v0.${K8S_VERSION#v1.}}
ETCD_VERSION=${ETCD_VERSION:-v3.7.3}
root=$(cd "$(dirname "$0")/.." && pwd)
out=${ENVTEST_DIR:-$root/.cache/envtest/$K8S_VERSION}
work=$root/.cache/envtest/build

mkdir -p "$out" "$work"
export GOFLAGS=-mod=mod
export CGO_ENABLED=0

if [ ! -x "$out/kube-apiserver" ]; then
  echo "building kube-apiserver $K8S_VERSION (cold: ~5 min, ~2.2 GiB RSS)" >&2
  d=$work/apiserver
  rm -rf "$d"; mkdir -p "$d"
  ( cd "$d"
    go mod init envtest.local/apiserver >/dev/null 2>&1
    kmod=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",*$/\1/p')
    # Every k8s.io staging module that k8s.io/kubernetes lists at v0.0.0 is
    # replaced by the published module of the matching version.
    mods=$(awk '/^require|^replace/{blk=1} /^\)/{blk=0} blk && $1 ~ /^k8s.io\// && $2=="v0.0.0"{print $1}' "$kmod" | sort -u)
    [ -n "$mods" ] || { echo "no staging modules found in $kmod" >&2; exit 1; }
    {
      echo "require k8s.io/kubernetes $K8S_VERSION"
      for m in $mods; do echo "replace $m => $m $STAGING_VERSION"; done
    } >> go.mod
    cat > tools.go <<'GO'
//go:build tools

package tools

import _ "k8s.io/kubernetes/cmd/kube-apiserver"
GO
    go mod tidy >/dev/null 2>&1 || go get k8s.io/kubernetes/cmd/kube-apiserver@"$K8S_VERSION"
    major=1; minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
    ld="-s -w"
    for p in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
      ld="$ld -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=$major -X $p.gitMinor=$minor"
    done
    go build -trimpath -tags=selinux,notest,grpcnotrace -ldflags "$ld" -o "$out/kube-apiserver.tmp" k8s.io/kubernetes/cmd/kube-apiserver
    mv "$out/kube-apiserver.tmp" "$out/kube-apiserver"
  )
fi

if [ ! -x "$out/etcd" ]; then
  echo "building etcd $ETCD_VERSION" >&2
  d=$work/etcd
  rm -rf "$d"; mkdir -p "$d"
  ( cd "$d"
    go mod init envtest.local/etcd >/dev/null 2>&1
    go get -tool "go.etcd.io/etcd/server/v3@$ETCD_VERSION" >/dev/null 2>&1
    go build -trimpath -ldflags "-s -w" -o "$out/etcd.tmp" go.etcd.io/etcd/server/v3
    mv "$out/etcd.tmp" "$out/etcd"
  )
fi

echo "$out"
