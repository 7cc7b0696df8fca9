# opsctl: `make provision` provisions a cluster (the lab machines by default), `make test` runs the tests.
# Both set themselves up on a fresh Debian 12 machine, as root: the Debian packages a target needs are
# installed when missing, and the virtualenv lives in .venv.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
INVENTORY ?=
PYTEST_ARGS ?=

# Debian packages per purpose. The lab runs Debian's real Slurm, munge, Prometheus and node_exporter.
LAB_DEBS := slurmctld slurmd slurm-client munge prometheus prometheus-node-exporter
MACHINES_DEBS := debootstrap systemd-container apt-cacher-ng iproute2 openssh-client bridge-utils
TEST_DEBS := $(LAB_DEBS) $(MACHINES_DEBS)

.PHONY: all venv deps-lab deps-machines deps-test test test-unit provision lint bench clean

all: test

$(BIN)/opsctl: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test,lint]'
	@touch $@

venv: $(BIN)/opsctl

# Installs only what is missing, so a warm machine pays nothing.
define apt_ensure
	@missing=$$(for p in $(1); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:" $$missing; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi
endef

deps-lab:
	$(call apt_ensure,$(LAB_DEBS))

deps-machines:
	$(call apt_ensure,$(MACHINES_DEBS))

deps-test:
	$(call apt_ensure,$(TEST_DEBS))

test: deps-test venv
	$(BIN)/pytest $(PYTEST_ARGS)

test-unit: venv
	$(BIN)/pytest -m "not lab and not machines and not provision" $(PYTEST_ARGS)

lint: venv
	$(BIN)/ruff check opsctl tests bench
	cd playbooks && ../$(BIN)/ansible-lint --offline --profile production

bench: deps-lab venv
	$(BIN)/python bench/health_scale.py

clean:
	rm -rf $(VENV) build *.egg-info
