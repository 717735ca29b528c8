# autoconfig — one entry point for builds, generated files and tests.
# `make test` does everything a fresh clone needs; `make verify` fails on drift.

GO          ?= go
BIN         := bin
ENVTEST_DIR := $(CURDIR)/.cache/envtest/v1.37.2
export KUBEBUILDER_ASSETS ?= $(ENVTEST_DIR)
# Packages whose tests also run under the race detector: every package that
# starts goroutines in its code or tests, and the sink (called by concurrent
# reconcile workers). internal/archtest fails when one is missing.
RACE_PKGS   := ./schema/... ./compiler/... ./cmd/... ./internal/... ./hack/...
CRD_FILE    := deploy/crds/routing.modelsphere.dev_modelroutes.yaml
# Build stamp of every binary (--version, the "build" log line, the
# autoconfig_build_info metric). The date is the commit's, so a build of
# one commit is reproducible.
VERSION     ?= $(shell sed -n 's/^var Version = "\(.*\)"$$/\1/p' internal/cli/cli.go)
COMMIT      ?= $(shell git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
BUILD_DATE  ?= $(shell TZ=UTC git log -1 --format=%cd --date=format-local:%Y-%m-%dT%H:%M:%SZ 2>/dev/null || TZ=UTC date +%Y-%m-%dT%H:%M:%SZ)
IMAGES_DIR  ?= out/images
LDFLAGS     := -s -w -X github.com/modelsphere/autoconfig/internal/cli.Version=$(VERSION) -X github.com/modelsphere/autoconfig/internal/cli.Commit=$(COMMIT) -X github.com/modelsphere/autoconfig/internal/cli.BuildDate=$(BUILD_DATE)

.PHONY: all build test lua-test bench-engine fuzz-push fault cluster-scripts verify generate deps envtest demo clean fmt vet unit race bench-applied property fuzz install uninstall deploy undeploy images

PROPERTY_N    ?= 2000
PROPERTY_SEED ?= 1
FUZZTIME      ?= 10m

all: build

build: ## build every binary into bin/, stamped with version, commit and build date
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN)/ ./cmd/...

deps: ## install Debian packages the tests need (nginx + lua)
	bash hack/install-deps.sh

envtest: ## build kube-apiserver + etcd for envtest (cached; ~5 min cold)
	bash hack/envtest.sh

generate: ## regenerate every generated file
	$(GO) tool deepcopy-gen --go-header-file hack/boilerplate.go.txt --output-file zz_generated.deepcopy.go ./schema/routespec ./schema/v1alpha1
	$(GO) run ./cmd/autoconfig crd > $(CRD_FILE).tmp && mv $(CRD_FILE).tmp $(CRD_FILE)
	@if [ -d deploy/helm/autoconfig/crds ]; then cp $(CRD_FILE) deploy/helm/autoconfig/crds/; fi
	$(GO) run ./hack/kustomize -out deploy/kustomize
	$(GO) run ./cmd/autoconfig crd --reference > docs/reference.md
	mkdir -p deploy/schemas && $(GO) run ./cmd/autoconfig crd --json-schema > deploy/schemas/modelroute-v1alpha1.schema.json
	$(GO) run ./cmd/autoconfig crd --openapi > deploy/schemas/modelroute-v1alpha1.openapi.json

fmt:
	gofmt -w $$(git ls-files '*.go')

vet:
	$(GO) vet ./...

verify: generate ## fail on drift: generated files, go.mod tidiness, gofmt
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt needed"; exit 1; }
	$(GO) mod tidy -diff
	@git diff --exit-code -- deploy testdata docs/reference.md schema || { echo "generated files drifted: run make generate and commit"; exit 1; }

# The engine's pure lua modules (ring, bounded load, AIMD, SSE, body key,
# metrics) under busted, run by LuaJIT as nginx runs them.
lua-test: deps ## luacheck (any warning fails, .luacheckrc), then the busted specs of the engine's lua modules
	cd deploy/openresty/lua && luacheck --quiet --formatter=plain . && luajit /usr/bin/busted --lpath='./?.lua' spec

unit:
	$(GO) test -count=1 -timeout 40m ./...

race:
	$(GO) test -count=1 -race -timeout 30m $(RACE_PKGS)

# End to end: an EndpointSlice change to the controller's write and to nginx
# serving it (p50/p99; docs/controller.md "Applied"). Part of make test.
bench-applied:
	$(GO) test -count=1 -run '^$$' -bench BenchmarkEndpointChangeToServed -benchtime 20x ./cmd/reload

# The llm engine's benchmark (docs/performance.md, "The llm engine"), not
# part of make test (about 4 minutes): multi-turn sessions with affinity on
# and off over 8 simulated pods, a 2x overload with and without the decode
# SLO, the engine's cost per request against a plain proxy_pass and on a
# 10,000-peer tier. Flags in BENCH_ENGINE_FLAGS (go run ./hack/benchengine -h).
bench-engine: deps
	$(GO) run ./hack/benchengine $(BENCH_ENGINE_FLAGS)

# The cluster testscripts three times in each order, in parallel: every
# script owns its API server, and the harness fails a script whose cluster
# holds anything it did not create (cmd/autoconfig/cluster_script_test.go).
cluster-scripts:
	AUTOCONFIG_SCRIPT_ORDER=name $(GO) test -count=3 -shuffle=on -run '^TestClusterScripts$$' ./cmd/autoconfig
	AUTOCONFIG_SCRIPT_ORDER=reverse $(GO) test -count=3 -shuffle=on -run '^TestClusterScripts$$' ./cmd/autoconfig

test: deps envtest verify vet lua-test unit race cluster-scripts bench-applied fault images ## everything CI runs

property: deps ## the accepted-routes-load property at length: PROPERTY_N routes from PROPERTY_SEED into real nginx
	AUTOCONFIG_PROPERTY_N=$(PROPERTY_N) AUTOCONFIG_PROPERTY_SEED=$(PROPERTY_SEED) $(GO) test -count=1 -timeout 120m -run TestPropertyAcceptedRoutesLoad -v ./compiler

fuzz: deps ## fuzz the route generator against real nginx for FUZZTIME; failing inputs are kept in compiler/testdata/fuzz
	$(GO) test -run '^$$' -fuzz FuzzAcceptedRouteLoads -fuzztime $(FUZZTIME) ./compiler

fuzz-push: deps ## fuzz random peers tables pushed into the real engine for FUZZTIME: each is refused or served, never accepted and then answered 500
	$(GO) test -run '^$$' -fuzz FuzzPushedTable -fuzztime $(FUZZTIME) ./compiler

demo: deps envtest ## the whole loop on a laptop: control plane, controller, routes, scaling
	$(GO) run ./hack/demo

# The fault test: two replicas with the chart's arguments behind TCP
# proxies, 40 routes with an EndpointSlice change every 500 ms, through a
# leader SIGKILL, a 20 s partition of the leader, a graceful handover,
# 10 s without the API server and a handover to a cut-off standby (about
# 90 s; docs/controller.md "Faults"). Part of make test.
fault: envtest ## fault test with endpoint churn (about 90 s): leader kill, partition, handover, API server away, handover to a cut-off standby; docs/controller.md "Faults"
	AUTOCONFIG_FAULT=1 $(GO) test -count=1 -timeout 15m -run '^TestFaultsWithChurn$$' -v ./cmd/autoconfig

# Extra flags of bench-scale go in BENCH_SCALE_FLAGS (go run ./hack/scale -h;
# docs/performance.md), e.g.:
#   make bench-scale BENCH_SCALE_FLAGS='-matrix 100x10 -pods 2000'                      # one small run, under a minute
#   make bench-scale BENCH_SCALE_FLAGS='-matrix 1000x10 -selector-share 0.1'            # 10 % of the routes discover by selector
#   make bench-scale BENCH_SCALE_FLAGS='-matrix 1000x10 -takeover'                      # two replicas, SIGKILL to the leader, the standby takes over
#   make bench-scale BENCH_SCALE_FLAGS='-matrix 1000x10 -rev HEAD~1'                    # the controller of another commit
.PHONY: bench-scale
bench-scale: envtest ## scale benchmark, not part of make test (8-30 min): 10k pods, routes x ConfigMaps matrix, the real controller on a real API server; docs/performance.md; extra flags in BENCH_SCALE_FLAGS
	$(GO) run ./hack/scale $(BENCH_SCALE_FLAGS)

images: ## build the OCI images of the four binaries (linux/amd64, linux/arm64) into $(IMAGES_DIR); no container engine needed
	$(GO) run ./hack/images -out $(IMAGES_DIR) -version $(VERSION) -commit $(COMMIT) -date $(BUILD_DATE) -go $(GO)

install: ## install the ModelRoute CRD (kustomize: deploy/kustomize/crd)
	kubectl apply --server-side -k deploy/kustomize/crd

uninstall: ## delete the ModelRoute CRD, and with it every ModelRoute (make undeploy first)
	kubectl delete -k deploy/kustomize/crd --ignore-not-found

deploy: ## install the controller with kustomize: CRD, RBAC and Deployment in autoconfig-system
	kubectl apply --server-side -k deploy/kustomize/default

undeploy: ## remove what make deploy installed; the routes first, while the controller still cleans them up
	-kubectl delete modelroutes.routing.modelsphere.dev --all --all-namespaces --wait --timeout=4m
	kubectl delete -k deploy/kustomize/default --ignore-not-found

clean:
	rm -rf $(BIN)
