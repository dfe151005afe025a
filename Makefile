# packer: the two quickstart commands (`make demo`, `make test`) each build their own virtualenv.
PYTHON ?= python3
VENV ?= .venv
# CI and this machine use the local CPU build of torch; real users get whatever torch they pick.
TORCH_SPEC ?= torch==2.13.0
# DALI's CPU pipelines run here; set DALI_SPEC= to skip the ~200 MB wheel.
DALI_SPEC ?= nvidia-dali-cuda130
PY := $(VENV)/bin/python

.PHONY: venv demo test bench mutate clean

$(VENV)/.installed: pyproject.toml setup.py packer/codecs/_jpegtiles.c packer/_rawresample.c Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -e ".[dev,ray,zstd,parquet]" $(DALI_SPEC)
	touch $@

venv: $(VENV)/.installed

demo: venv
	$(PY) scripts/demo.py --out demo-out

# PACKER_REQUIRE_EXTENSION: the tiled codec's C extension must have been built here.
# The suite runs under branch coverage with the test that ran each line (pytest-cov contexts);
# then the promise inventory fails on a typed-error raise site no test reaches unless
# scripts/promise_unreached.txt gives the reason, and the coverage figure is printed
# (docs/development.md, "Coverage"). Tests that measure a process's memory run apart, untraced: a
# forked worker inherits the tracer and the whole run's coverage data, which grows its memory.
test: venv
	rm -f .coverage
	PACKER_REQUIRE_EXTENSION=1 $(PY) -m pytest -q -m "not measures_memory" --cov --cov-context=test --cov-report=
	PACKER_REQUIRE_EXTENSION=1 $(PY) -m pytest -q -m measures_memory
	$(PY) scripts/promise_inventory.py --check
	@echo "coverage of packer/ (statements and branches): $$($(PY) -m coverage report --format=total) %"

# Mutation testing (mutmut) of the modules that hold the data; not part of `make test` (about 80
# minutes on 2 cores when nothing is cached). MUTATE="order atomic" runs some groups; see README.
MUTATE ?=
mutate: venv
	$(PY) -m pip install --quiet -e ".[mutate]"
	$(PY) scripts/mutate.py $(MUTATE)

bench: venv
	$(PY) scripts/bench_build.py
	$(PY) scripts/bench_verify.py
	$(PY) scripts/bench_backends.py

clean:
	rm -rf $(VENV) demo-out bench-out .mutate .coverage
