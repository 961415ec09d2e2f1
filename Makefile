# baton — common tasks. `make help` lists them.
SHELL := /bin/bash
CARGO ?= cargo
CP := hack/control-plane.sh

.DEFAULT_GOAL := help

.PHONY: help
help: ## List the targets
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk -F':.*?## ' '{printf "  \033[36m%-22s\033[0m %s\n", $$1, $$2}'

.PHONY: build
build: ## Build the baton binary (debug)
	$(CARGO) build

.PHONY: generate
generate: ## Regenerate crds/ (and the chart's copy) from the Rust types
	$(CARGO) run -q -- crd --dir crds
	$(CARGO) run -q -- crd --dir charts/baton/crds

.PHONY: check-generated
check-generated: ## Fail if crds/ or the chart's copy is stale
	$(CARGO) run -q -- crd --dir crds --check
	$(CARGO) run -q -- crd --dir charts/baton/crds --check

.PHONY: fmt
fmt: ## Format the code
	$(CARGO) fmt

.PHONY: lint
lint: ## rustfmt check, clippy with warnings as errors, versions that agree (crates, chart, CHANGELOG.md), no import circle in src/, no fence compared outside src/fence/, no rise in the public fields of API-client structs, the files over 500 lines or the README's lines, every path, name, link and section the docs cite resolves, shellcheck on hack/
	$(CARGO) fmt --check
	$(CARGO) clippy --all-targets -- -D warnings
	python3 hack/code-figures.py --check
	python3 hack/check-docs.py
	bash hack/lint-fence.sh
	bash hack/lint-shell.sh
	bash hack/release.sh check

.PHONY: code-figures
code-figures: ## The shape of the code: import circles, functions over 50 lines, the protocol's reading set, fence comparisons outside src/fence/, public fields of structs holding an API client, source files over 500 lines (src/, tests/, examples/, benches/), the README's lines, docs references that do not resolve, listeners not served by the one serving layer, #[path] in tests, benchmarks and examples
	python3 hack/code-figures.py

.PHONY: release
release: ## The image and chart of release VERSION (0.y.z) in dist/, from a clean tree at that version: make release VERSION=0.1.0
	@test -n "$(VERSION)" || { echo "usage: make release VERSION=0.y.z"; exit 2; }
	bash hack/release.sh $(VERSION)

.PHONY: unit
unit: ## Pure unit tests only (no API server)
	$(CARGO) test --lib

.PHONY: demo
demo: ## The one-command demo: a run whose worker is killed mid-run resumes and succeeds
	bash hack/demo.sh

.PHONY: test
test: ## All tests: unit, then integration against a local kube-apiserver + etcd it starts and stops
	bash hack/test.sh

.PHONY: bench-worker
bench-worker: ## Figures: a 1,000-step run's API round trips per step, ledger bytes, worker memory and CPU, traces off and on (to a real Phoenix)
	bash hack/with-control-plane.sh $(CARGO) run --release --example worker_bench

.PHONY: bench-byo
bench-byo: ## Figures: an own agent's model calls through the worker's gateway: added latency p50/p99 live and replayed, replay speed, kill to the first live call, awaited round trips per call, streamed calls, tool calls through the tool gateway; per framework and model API, the recorded calls a resumed agent asked again exactly
	$(CARGO) build --release --bin baton
	$(CARGO) build --release -p baton-exec
	bash hack/with-control-plane.sh $(CARGO) run --release --example byo_bench
	bash hack/with-control-plane.sh $(CARGO) run --release --example byo_match_bench

.PHONY: bench-thread
bench-thread: ## Figures: a turn's history build at 1, 10, 100 and 1,000 earlier turns (p50/max ms, API requests per build), each turn read alone vs one list of the thread; the first seal's history bytes
	bash hack/with-control-plane.sh $(CARGO) run --release --example thread_bench

.PHONY: bench-webhook
bench-webhook: ## Figures: latency the admission webhook adds to a segment append and an AgentRun create (p50/p99)
	bash hack/with-control-plane.sh $(CARGO) run --release --example webhook_bench

.PHONY: bench-ledger
bench-ledger: ## Figures: the same transcripts in LedgerSegments and in PostgreSQL: appends/s, awaited requests per append, etcd bytes and API-server memory per transcript byte
	bash hack/with-control-plane.sh $(CARGO) run --release --example ledger_bench

.PHONY: bench-ledger-load
bench-ledger-load: ## Figures at scale: 10,000 runs, 1 GiB of transcript per backend (7 appends of 15,339 B each), on a bed of its own with an 8 GiB etcd quota: etcd size and API-server memory
	BATON_CP_DIR=$${TMPDIR:-/tmp}/baton-load-bed BATON_PG_DIR=$${TMPDIR:-/tmp}/baton-load-pg \
	BATON_CP_ETCD_QUOTA_BYTES=8589934592 \
	bash hack/with-control-plane.sh $(CARGO) run --release --example ledger_bench -- 10000 7 15339

.PHONY: bench-format
bench-format: ## Figures: reading a ledger event through the wrapper that keeps unknown kinds, vs the derived reader alone (ns per event, ratio)
	$(CARGO) run --release --example format_bench

.PHONY: bench-executor
bench-executor: ## Figures: latency a tool step gets from the tools container's executor, vs running the command directly
	$(CARGO) build --release -p baton-exec
	$(CARGO) run --release --example executor_bench -- --exec target/release/baton-exec

.PHONY: bench-stream
bench-stream: ## Figures: append-to-SSE-receipt latency (p50/p99) with 10 and 1,000 followers; the server's memory, CPU and API watches
	$(CARGO) build --release --bin baton
	bash hack/with-control-plane.sh $(CARGO) run --release --example stream_bench

.PHONY: bench-replay
bench-replay: ## Figures: baton server's memory and CPU with 1,000 followers replaying 10 runs of 20 MB ledgers, and with 1,000 that read nothing
	$(CARGO) build --release --bin baton
	bash hack/with-control-plane.sh $(CARGO) run --release --example replay_bench

.PHONY: bench-burst
bench-burst: ## Figures: a real request's p50/p99 while 200 clients with no valid credential send baton server large and withheld bodies; its memory and CPU
	$(CARGO) build --release --bin baton
	bash hack/with-control-plane.sh $(CARGO) run --release --example burst_bench

.PHONY: bench-controller
bench-controller: ## Figures: takeover lateness, controller memory and writes with 1,000 and 5,000 runs
	$(CARGO) build --release --bin baton
	bash hack/with-control-plane.sh $(CARGO) bench --bench controller -- --runs 1000 --window 100 --passes 2
	bash hack/with-control-plane.sh $(CARGO) bench --bench controller -- --runs 5000 --window 100 --passes 2

.PHONY: bench-node
bench-node: ## Figures on the real node: faults to resumed work, work lost, vs a Job-style restart; pod start, controller rollout, image size, warm node start; turns with and without a pod started ahead (BATON_FIGURES=warm alone)
	bash hack/bench-node.sh

.PHONY: bench-upgrade
bench-upgrade: ## Figures on the real node: an upgrade from the previous release with BATON_UPGRADE_RUNS (200) runs in flight: lost, effects twice, handoff lateness p50/p99, helm upgrade -> last old worker gone, claims after the upgrade by reason, the webhooks' and LedgerSegment creates' latency as the API server timed them, each new controller's claim and reconcile timings
	bash hack/bench-upgrade.sh

.PHONY: control-plane-up
control-plane-up: ## Start the local kube-apiserver + etcd (builds kube-apiserver once, cached)
	bash $(CP) up

.PHONY: control-plane-down
control-plane-down: ## Stop the local control plane
	bash $(CP) down

.PHONY: control-plane-env
control-plane-env: ## Print `export KUBECONFIG=...` for the local control plane
	@bash $(CP) env

.PHONY: node-up
node-up: ## Start the real single-node Kubernetes (builds its binaries once, cached)
	bash hack/node.sh up

.PHONY: node-down
node-down: ## Stop the node and remove everything it left
	bash hack/node.sh down

.PHONY: node-env
node-env: ## Print `export KUBECONFIG=...` for the node
	@bash hack/node.sh env

.PHONY: images
images: ## The node's images: pause, a Debian base, baton from the Dockerfile, a bare busybox, the Python agents (tests/agents)
	bash hack/images.sh all
