# opsctl: `make provision` provisions a cluster (the lab machines by default), `make test` runs the tests.
# Both set themselves up on a fresh Debian 12 machine, as root: the Debian packages a target needs are
# installed when missing, and the virtualenv lives in .venv.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
INVENTORY ?=
PYTEST_ARGS ?=
PLAYBOOK_ARGS ?=

# Debian packages per purpose. The lab runs Debian's real Slurm (with slurmdbd and MariaDB for its
# accounting), munge, Prometheus and node_exporter.
LAB_DEBS := slurmctld slurmd slurm-client slurmdbd mariadb-server munge prometheus prometheus-node-exporter
MACHINES_DEBS := debootstrap systemd-container apt-cacher-ng iproute2 openssh-client bridge-utils
# The health tests read metrics from VictoriaMetrics too, started by the tests themselves; amtool and
# the real Alertmanager serve the alertmanager role's tests.
TSDB_DEBS := victoria-metrics
# The fabric test's picture: a real headless browser opens its HTML page, and cairosvg (the extra
# opsctl[picture]) renders its PNG with the cairo library.
PICTURE_DEBS := chromium libcairo2
TEST_DEBS := $(LAB_DEBS) $(MACHINES_DEBS) $(TSDB_DEBS) $(PICTURE_DEBS) prometheus-alertmanager

.PHONY: all venv deps-lab deps-machines deps-test test test-unit provision lint bench clean

all: test

# The product (opsctl) and the lab (opsctl-lab, in lab/) are two distributions; the extra [lab] names
# the second, which -e ./lab provides from this checkout.
$(BIN)/opsctl: pyproject.toml lab/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[lab,test,lint]' -e ./lab
	@touch $@

venv: $(BIN)/opsctl

# Installs only what is missing, so a warm machine pays nothing.
# The install starts no service (MariaDB, slurmdbd, VictoriaMetrics, Prometheus, apt-cacher-ng would):
# the lab and the tests run their own, and a service running here is not ours to stop. A
# /usr/sbin/policy-rc.d that exits 101 (invoke-rc.d(8): action forbidden) is in place for the install only,
# and only where there is none: an existing one is never replaced, and ours is removed after, even on
# Ctrl-C. It is made aside and linked into place, which fails if one appeared meanwhile.
define apt_ensure
	@missing=$$(for p in $(1); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:" $$missing; \
	  policy=/usr/sbin/policy-rc.d; ours=; \
	  if [ ! -e $$policy ] && printf '#!/bin/sh\nexit 101\n' >$$policy.opsctl && chmod 755 $$policy.opsctl \
	     && ln $$policy.opsctl $$policy 2>/dev/null; then ours=1; fi; rm -f $$policy.opsctl; \
	  trap '[ -z "$$ours" ] || rm -f $$policy' EXIT; trap 'exit 130' INT; trap 'exit 143' TERM; \
	  apt-get -o DPkg::Lock::Timeout=600 update -qq && DEBIAN_FRONTEND=noninteractive \
	    apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi
endef

deps-lab:
	$(call apt_ensure,$(LAB_DEBS))

deps-machines:
	$(call apt_ensure,$(MACHINES_DEBS))

deps-test:
	$(call apt_ensure,$(TEST_DEBS))

# Every tier (README, "Tests") and the linters, as three streams named after their tiers, with each
# stream's log, slowest tests and wall time and one exit code: tests/run.py says how. PYTEST_ARGS, when
# set, runs the linters and then one plain pytest with them instead.
test: deps-test venv
	$(BIN)/python tests/run.py -- $(PYTEST_ARGS)

# Pure Python only: no root, no process, no socket; well under 30 s.
test-unit: venv
	$(BIN)/pytest tests/unit $(PYTEST_ARGS)

# ruff and mypy (strict for the core packages, see pyproject.toml) over the Python; ansible-lint
# (production profile, config in .ansible-lint) from playbooks/ so that playbooks/ansible.cfg resolves
# the roles, library and filter plugins; yamllint covers the inventories too.
lint: venv
	$(BIN)/ruff check opsctl lab tests bench playbooks
	$(BIN)/mypy
	cd playbooks && ANSIBLE_CONFIG=ansible.cfg ../$(BIN)/ansible-lint --offline --profile production
	$(BIN)/yamllint -s playbooks inventory .ansible-lint .yamllint

# `make provision`: the lab machines (started when not running), or INVENTORY=DIR for a real cluster.
# Never touches `opsctl lab up` (the host-level simulated cluster). Prints each phase's wall time.
# Facts are cached per inventory in <inventory>/.facts, so that PLAYBOOK_ARGS='--limit HOST' works.
PLAYBOOK_ENV := ANSIBLE_CONFIG=playbooks/ansible.cfg ANSIBLE_FORCE_COLOR=0
# The time per role at the end: ansible-core's own junit callback times each task on each host, and
# playbooks/role_times.py sums them per role (the profile_roles callback is in ansible.posix, which
# ansible-core lacks). Task arguments stay out of the file, which lives in a private temporary
# directory (mktemp -d, mode 0700) only while the summary is made.
PROFILE_ENV := ANSIBLE_CALLBACKS_ENABLED=ansible.builtin.junit,opsctl_unreachable JUNIT_HIDE_TASK_ARGUMENTS=true \
  JUNIT_TASK_RELATIVE_PATH=$(CURDIR)/playbooks JUNIT_INCLUDE_SETUP_TASKS_IN_REPORT=true
provision: venv
	@set -e; \
	phase() { echo "== provision: $$1: $$(( $$(date +%s) - $$2 )) s"; }; \
	if [ -n "$(INVENTORY)" ]; then \
	  inv="$(INVENTORY)"; \
	else \
	  inv=inventory/lab; t0=$$(date +%s); \
	  if [ -f $$inv/hosts.yml ] && $(PLAYBOOK_ENV) $(BIN)/ansible -i $$inv all -m ansible.builtin.ping -o >/dev/null 2>&1; then \
	    echo "== provision: lab machines are running"; \
	  else \
	    $(MAKE) --no-print-directory deps-machines; \
	    $(BIN)/opsctl lab machines up; \
	  fi; \
	  phase "lab machines" $$t0; \
	fi; \
	t0=$$(date +%s); junit=$$(mktemp -d); rc=0; \
	$(PLAYBOOK_ENV) $(PROFILE_ENV) JUNIT_OUTPUT_DIR=$$junit/junit OPSCTL_UNREACHABLE_FILE=$$junit/unreachable \
	  ANSIBLE_CACHE_PLUGIN_CONNECTION="$$(realpath $$inv)/.facts" \
	  $(BIN)/ansible-playbook -i $$inv playbooks/site.yml $(PLAYBOOK_ARGS) || rc=$$?; \
	$(BIN)/python playbooks/role_times.py $$junit/junit; \
	if [ -s $$junit/unreachable ]; then echo "== provision: $$(cat $$junit/unreachable)"; fi; rm -rf $$junit; \
	phase "playbooks/site.yml on $$inv" $$t0; exit $$rc

bench: deps-lab deps-machines venv
	$(BIN)/python bench/health_scale.py
	$(BIN)/python bench/fabric_isolation.py
	$(BIN)/python bench/provision_scale.py

clean:
	rm -rf $(VENV) build *.egg-info lab/build lab/*.egg-info
