# Set-up contract: `make demo` and `make test` on a fresh machine. Everything lives in .venv.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
STAMP := $(VENV)/.rlinf-installed

# Bundled plugins: separate distributions, registered through entry points like any third-party one.
PLUGINS := plugins/rlinf-algos plugins/rlinf-accelerators plugins/rlinf-executor-local \
           plugins_sims/rlinf-sim-gymnasium plugins_sims/rlinf-sim-metaworld \
           plugins_models/rlinf-model-mlp
PLUGIN_FILES := $(foreach p,$(PLUGINS),$(p)/pyproject.toml)

.PHONY: install demo test test-fast clean

install: $(STAMP)

# torch==2.13.0 first: the CPU build lies on this machine's disk; anything else pulls multi-GB CUDA builds.
# One resolver call for everything else, so pins such as metaworld's mujoco hold together.
$(STAMP): pyproject.toml $(PLUGIN_FILES) Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip
	$(PIP) install torch==2.13.0
	$(PIP) install -e '.[dev,deepspeed]' $(addprefix -e ,$(PLUGINS))
	touch $@

# The whole loop on one Meta-World task: 3 expert demos -> behaviour cloning -> PPO on the sparse
# success reward -> success on 40 held-out seeds, as one table (a few minutes on 2 CPU cores).
DEMO ?= sim=metaworld sim.task=reach-v3 collect.episodes=3 collect.num_envs=3 \
        sft.model.hidden_sizes=[256,256] sft.algo.epochs=600 sft.algo.minibatch_size=64 sft.val_fraction=0 \
        rl.total_steps=40000 eval.episodes=40

demo: install
	$(VENV)/bin/rlinf pipeline $(DEMO)

test: install
	$(PY) -m pytest -n 2 -q

test-fast: install
	$(PY) -m pytest -n 2 -q -m "not slow"

clean:
	rm -rf $(VENV) rlinf_runs
