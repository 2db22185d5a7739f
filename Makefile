# The two commands of the README contract; both set up what is missing first (idempotently).
#   make run   - the main job on the embedded stack (Kafka broker, Spark local[*], Delta, Airflow)
#   make test  - lint, then the test suite (starts and stops its own broker, Spark and Airflow)
.PHONY: run test lint docs setup lock down status bench bench-summary production

PY := .venv/bin/python

run: setup
	$(PY) -m streamstate_cli demo

# The production shape on this machine (3 Kafka brokers, a Spark master and 2 workers, Airflow's processes on
# PostgreSQL, Prometheus) and the main job on it through Airflow, as `make run` does; `make down` stops it too.
production: setup
	$(PY) -m streamstate_cli production

# The suite on TEST_WORKERS workers (pytest-xdist; most of a test's time is waiting for a JVM, a broker or
# Airflow, so two workers keep the two cores busier): one module per worker at a time, the modules that run
# an Airflow standalone as one unit (tests/conftest.py). TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 2

test: setup lint
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# The formatter and linter over the whole tree (pyproject.toml [tool.ruff]): a badly formatted change fails in seconds;
# then the documentation site built with --strict (mkdocs.yml): a broken link, a page missing from the navigation or
# an API reference that no longer resolves fails too. The build goes to site/ (git-ignored).
lint: setup
	.venv/bin/ruff format --check .
	.venv/bin/ruff check .
	NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --site-dir site

# The documentation site, served with live reload at http://127.0.0.1:8000 (docs/, mkdocs.yml).
docs: setup
	NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs serve

setup:
	@bash scripts/bootstrap.sh

# The benchmarks of BENCHMARKS.md against Kafka Streams and plain Spark: both workloads, all sizes (hours; see
# docs/benchmarks/index.md). Their results (bench/results/*.json) reach the summary at the top of BENCHMARKS.md only
# through `make bench-summary` afterwards (a test fails until then).
bench: setup
	$(PY) bench/compare.py

# The summary at the top of BENCHMARKS.md and docs/img/benchmarks.png, rewritten from the newest result per benchmark
# and size in bench/results/*.json: run it after `make bench` or any bench/*.py that saves a result (seconds; no
# benchmark runs). `$(PY) bench/summary.py --check` exits 1 if the summary is stale.
bench-summary: setup
	$(PY) bench/summary.py

down:
	$(PY) -m streamstate_cli down

status:
	$(PY) -m streamstate_cli status

# Regenerate requirements.lock after editing requirements.in (not part of set-up).
lock:
	.venv/bin/uv pip compile requirements.in -o requirements.lock --python .venv/bin/python
