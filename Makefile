# packer: the two quickstart commands (`make demo`, `make test`) each build their own virtualenv.
PYTHON ?= python3
VENV ?= .venv
# CI and this machine use the local CPU build of torch; real users get whatever torch they pick.
TORCH_SPEC ?= torch==2.13.0
# DALI's CPU pipelines run here; set DALI_SPEC= to skip the ~200 MB wheel.
DALI_SPEC ?= nvidia-dali-cuda130
PY := $(VENV)/bin/python
# torchvision does not import beside the local CPU torch 2.13.0 (its C ops are built for another
# torch), so the tests marked `torchvision` run in a venv of their own with a matching pair.
TV_VENV ?= .venv-tv
TV_SPEC ?= torch==2.14.1 torchvision==0.29.1
TV_PY := $(TV_VENV)/bin/python

.PHONY: venv venv-tv demo test test-torchvision bench mutate clean docs docs-serve dist-check browser

$(VENV)/.installed: pyproject.toml setup.py packer/codecs/_jpegtiles.c packer/_rawresample.c Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -e ".[dev,ray,zstd,parquet,docs,release]" $(DALI_SPEC)
	touch $@

venv: $(VENV)/.installed

$(TV_VENV)/.installed: pyproject.toml setup.py packer/codecs/_jpegtiles.c packer/_rawresample.c Makefile
	$(PYTHON) -m venv $(TV_VENV)
	$(TV_PY) -m pip install --quiet --upgrade pip
	$(TV_PY) -m pip install --quiet $(TV_SPEC)
	$(TV_PY) -m pip install --quiet -e ".[torchvision]" "pytest>=8" "pytest-timeout>=2.3" "hypothesis>=6.100" "pytest-cov>=5" pycocotools
	touch $@

venv-tv: $(TV_VENV)/.installed

demo: venv
	$(PY) scripts/demo.py --out demo-out

# PACKER_REQUIRE_EXTENSION: the tiled codec's C extension must have been built here.
# PACKER_REQUIRE_BROWSER: the HTML report's test must find headless Chromium (set it to 0 to let
# that test skip on a machine without it).
# The suite runs under branch coverage with the test that ran each line (pytest-cov contexts);
# then the promise inventory fails on a typed-error raise site no test reaches unless
# scripts/promise_unreached.txt gives the reason, and the coverage figure is printed
# (docs/development.md, "Coverage"). Tests that measure a process's memory run apart, untraced: a
# forked worker inherits the tracer and the whole run's coverage data, which grows its memory.
PACKER_REQUIRE_BROWSER ?= 1
test: venv $(if $(filter 1,$(PACKER_REQUIRE_BROWSER)),browser)
	rm -f .coverage
	PACKER_REQUIRE_EXTENSION=1 PACKER_REQUIRE_BROWSER=$(PACKER_REQUIRE_BROWSER) $(PY) -m pytest -q \
	  -m "not measures_memory" --cov --cov-context=test --cov-report=
	PACKER_REQUIRE_EXTENSION=1 $(PY) -m pytest -q -m measures_memory
	$(MAKE) test-torchvision TV_COV="--cov --cov-context=test --cov-append --cov-report="
	$(PY) scripts/promise_inventory.py --check
	@echo "coverage of packer/ (statements and branches): $$($(PY) -m coverage report --format=total) %"

# Only the tests marked `torchvision` (in the main venv they skip: no torchvision there). Under
# make test their coverage is appended to the main run's (TV_COV), so the promise inventory sees
# the typed errors only these tests reach (packer.tvtensors).
TV_COV ?=
test-torchvision: venv-tv
	PACKER_REQUIRE_EXTENSION=1 $(TV_PY) -m pytest -q -m torchvision $(TV_COV)

# Headless Chromium (Debian's package) for tests/inspect/test_html_report.py; installed when missing
# and this is root with apt-get (CI), else the command to run is printed.
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } || \
	  { echo "make test needs headless Chromium: apt-get install chromium (or make test PACKER_REQUIRE_BROWSER=0)"; exit 1; }

# The documentation site, strictly (a broken link, page or API reference fails): open site/index.html.
docs: venv
	$(PY) -m mkdocs build --strict --site-dir site
	@echo "built the site: open site/index.html"

docs-serve: venv
	$(PY) -m mkdocs serve

# sdist + wheel, twine check, the wheel and the sdist (without a C compiler) each installed in a fresh
# virtualenv and smoke-tested, the cibuildwheel configuration checked (scripts/check_dist.py).
dist-check: venv
	$(PY) scripts/check_dist.py --out dist-check --torch-spec "$(TORCH_SPEC)"

# Mutation testing (mutmut) of the modules that hold the data; not part of `make test` (about 80
# minutes on 2 cores when nothing is cached). MUTATE="order atomic" runs some groups; see README.
MUTATE ?=
mutate: venv
	$(PY) -m pip install --quiet -e ".[mutate]"
	$(PY) scripts/mutate.py $(MUTATE)

# Benchmarks live in benchmarks/ (one shared harness: interleaved rounds, medians, CPU time, ratios);
# the comparison with FFCV and torchvision needs its own virtualenv: see docs/performance.md.
bench: venv
	$(PY) benchmarks/bench_build.py
	$(PY) benchmarks/bench_verify.py
	$(PY) benchmarks/bench_backends.py

clean:
	rm -rf $(VENV) $(TV_VENV) demo-out bench-out .mutate .coverage site dist-check
