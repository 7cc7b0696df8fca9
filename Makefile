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
TEST_DEBS := $(LAB_DEBS) $(MACHINES_DEBS) $(TSDB_DEBS) prometheus-alertmanager

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
define apt_ensure
	@missing=$$(for p in $(1); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:" $$missing; \
	  apt-get -o DPkg::Lock::Timeout=600 update -qq && DEBIAN_FRONTEND=noninteractive \
	    apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi
endef

deps-lab:
	$(call apt_ensure,$(LAB_DEBS))
	@# The packages enable MariaDB (on :3306) and slurmdbd as services; the lab runs its own.
	@systemctl disable --now mariadb slurmdbd >/dev/null 2>&1 || true

deps-machines:
	$(call apt_ensure,$(MACHINES_DEBS))

deps-test:
	$(call apt_ensure,$(TEST_DEBS))
	@# The packages enable services (victoria-metrics on :8428, MariaDB on :3306, slurmdbd) that nothing
	@# here uses; the lab and the tests run their own.
	@systemctl disable --now victoria-metrics mariadb slurmdbd >/dev/null 2>&1 || true

# Every tier (README, "Tests") and the linters; pytest prints each tier's wall time at the end, the
# linters' time included.
# The tiers run as three streams at once, because most of their wall time is waiting (scrapes, SSH,
# systemd), not CPU:
# - the provisioning of the lab machines, with a lab directory of their own, so that no stream sees
#   another's processes;
# - the simulated cluster (the lab tier);
# - the linters, then the component, machines and unit tiers, in that order (the component tier's
#   Prometheus, exporters and Slurm chroots take addresses, ports and chroot indexes apart from the lab's:
#   tests/component/promlab.py, paths.py; the machines tier's machines live in a directory and network
#   of their own, see test_machines.py, and find the image the provisioning stream built by then).
# The lab and provisioning streams take about as long; the third, shorter one carries the machines tier.
# Beside them, from the start, the Slurm chroots of the newer releases are built (debootstrap, mostly
# waiting on the mirror), which the component and lab tiers use a few minutes in: a test then finds its
# chroot built, or waits on the build's lock; a build that fails here fails again, with its message, in
# the first test that needs it.
# The provisioning stream is the longest, so the others yield the CPU to it: they run in a cpu cgroup
# of their own that weighs as much as one session (tests/low_cpu_share.sh says why nice alone does not
# do it), and at nice 5 within it. They wait where all want the CPU, and still end first. A linter's
# failure stops all three. The other streams' output follows the linters' stream's. PYTEST_ARGS, when
# set, runs the linters and then one plain pytest instead.
MACHINES_TIERS := provision
LAB_TIERS := lab
MACHINES_LAB_DIR ?= /var/lib/opsctl-lab-machines-tests
BACKGROUND := tests/low_cpu_share.sh nice -n 5
# Each stream's slowest tests, after its results: where a stream's time goes.
STREAM_PYTEST := $(BIN)/pytest -p no:cacheprovider --durations=15
test: deps-test venv
	@start=$$(date +%s); \
	if [ -n "$(PYTEST_ARGS)" ]; then \
	  $(MAKE) --no-print-directory lint || exit 1; \
	  OPSCTL_LINT_SECONDS=$$(( $$(date +%s) - start )) exec $(BIN)/pytest $(PYTEST_ARGS); \
	fi; \
	log=$$(mktemp); lab_log=$$(mktemp); \
	$(BACKGROUND) $(BIN)/python -m opsctl_lab.slurm_chroot >/dev/null 2>&1 & chroots=$$!; \
	OPSCTL_LAB_DIR=$(MACHINES_LAB_DIR) \
	  $(STREAM_PYTEST) -m "$(MACHINES_TIERS)" tests/integration >$$log 2>&1 & machines=$$!; \
	$(BACKGROUND) $(STREAM_PYTEST) -m "$(LAB_TIERS)" tests/integration >$$lab_log 2>&1 & lab=$$!; \
	if ! $(BACKGROUND) $(MAKE) --no-print-directory lint; then \
	  kill $$machines $$lab $$chroots; wait $$machines $$lab $$chroots; rm -f $$log $$lab_log; exit 1; \
	fi; \
	OPSCTL_LINT_SECONDS=$$(( $$(date +%s) - start )) \
	  $(BACKGROUND) $(STREAM_PYTEST) -m "not ($(MACHINES_TIERS) or $(LAB_TIERS))"; rest=$$?; \
	wait $$chroots; wait $$lab; lab_rc=$$?; \
	echo "==== the lab stream ($(LAB_TIERS)) ===="; cat $$lab_log; rm -f $$lab_log; \
	wait $$machines; machines_rc=$$?; \
	echo "==== the provisioning stream ($(MACHINES_TIERS)) ===="; cat $$log; rm -f $$log; \
	echo "== make test: $$(( $$(date +%s) - start )) s in all"; \
	[ $$rest -eq 0 ] && [ $$lab_rc -eq 0 ] && [ $$machines_rc -eq 0 ]

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
