#!/usr/bin/env bash
# kubeapi-build.sh: builds a real kube-apiserver, kube-controller-manager and etcd into $KA/bin, from the
# Go module proxy alone, for tests that need a real API server (no kubelet: pods are stored, not run).
# Usage: bash .ci/kubeapi-build.sh [kube] [etcd]   (SKIP_KCM=1 skips the controller manager)
#
# TestKubeAPI (cmd/sluice) runs against them with SLUICE_KUBEAPI=1; it
# looks in $KA/bin's default, or in $SLUICE_KUBEAPI_BIN (docs/kubernetes.md).
#
#   kube-apiserver           k8s.io/kubernetes $K8S_VERSION (staging modules pinned to $STAGING_VERSION)
#   kube-controller-manager  same module (optional; SKIP_KCM=1 skips it)
#   etcd                     go.etcd.io/etcd/server/v3 $ETCD_VERSION (etcdmain.Main in a tiny main)
#
# Only the Go module proxy is used. k8s.io/kubernetes cannot be `go install`ed
# (its go.mod replaces every k8s.io staging module with ./staging/...), so a
# scratch module requires it and replaces each staging module with its
# published version. Each step prints how long it took. Measured on the shared
# 2-core machine (load 6-25 from other work), cold cache: kube-apiserver 1760 s,
# then kube-controller-manager 336 s (shares most packages), etcd 470 s (built
# at the same time as kube-apiserver). With a warm cache each is a
# relink of ~10-60 s.
#
set -euo pipefail


KA=${KA:-${XDG_CACHE_HOME:-$HOME/.cache}/kubeapi}  # binaries, runs and logs (outside the repo)
K8S_VERSION=${K8S_VERSION:-v1.37.2}
STAGING_VERSION=${STAGING_VERSION:-v0.37.2}
ETCD_VERSION=${ETCD_VERSION:-v3.7.3}
BIN=$KA/bin
mkdir -p "$BIN" "$KA/logs"

timed() { # timed NAME CMD...: runs CMD, prints NAME's seconds
	local name=$1 s e
	shift
	s=$(date +%s)
	"$@"
	e=$(date +%s)
	echo "build: $name: $((e - s))s"
}

# --- kube-apiserver (and kube-controller-manager) -------------------------
kube() {
	cd "$KA"
	go mod download -json "k8s.io/kubernetes@$K8S_VERSION" >/dev/null
	local kdir
	kdir=$(go env GOMODCACHE)/k8s.io/kubernetes@$K8S_VERSION
	{
		echo "module kubeapi"
		echo
		echo "go $(awk '/^go /{print $2; exit}' "$kdir/go.mod")"
		echo
		echo "require k8s.io/kubernetes $K8S_VERSION"
		echo
		echo "replace ("
		sed -n '/^replace (/,/^)/p' "$kdir/go.mod" | awk -v v="$STAGING_VERSION" '/=>/{print "\t" $1 " => " $1 " " v}'
		echo ")"
	} >go.mod
	rm -f go.sum
	go get "k8s.io/kubernetes/cmd/kube-apiserver@$K8S_VERSION" "k8s.io/kubernetes/cmd/kube-controller-manager@$K8S_VERSION"
	# Without these the binaries say v0.0.0-master to /version (behaviour is
	# 1.x's either way: component-base's DefaultKubeBinaryVersion is compiled in).
	local minor=${K8S_VERSION#v1.}
	minor=${minor%%.*}
	local v="-X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1"
	v="$v -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean"
	v="$v -X k8s.io/component-base/version.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
	timed kube-apiserver go build -trimpath -ldflags "-s -w $v" -o "$BIN/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver
	if [ "${SKIP_KCM:-0}" != 1 ]; then
		timed kube-controller-manager go build -trimpath -ldflags "-s -w $v" -o "$BIN/kube-controller-manager" k8s.io/kubernetes/cmd/kube-controller-manager
	fi
}

# --- etcd ------------------------------------------------------------------
etcd() {
	mkdir -p "$KA/etcd"
	cd "$KA/etcd"
	cat >main.go <<'EOF'
// etcd: a plain etcd server binary, built from go.etcd.io/etcd/server/v3.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
EOF
	printf 'module etcdbin\n\ngo 1.26.0\n' >go.mod
	rm -f go.sum
	go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION"
	go mod tidy
	timed etcd go build -trimpath -ldflags "-s -w" -o "$BIN/etcd" .
}

steps=${*:-kube etcd}
for step in $steps; do
	( $step ) 2>&1 | tee "$KA/logs/build-$step.log"
done
"$BIN/kube-apiserver" --version || true
"$BIN/etcd" --version | head -3 || true

