#!/usr/bin/env bash
# Validates deploy/ offline, before the tests (scripts/test.sh runs it, so CI does): every
# Kubernetes manifest against the schemas of the oldest Kubernetes the manifests support
# (kubernetes-validate bundles them), the Compose file against the compose-spec schema
# (check-jsonschema vendors it), the AppArmor profile with apparmor_parser, and the Prometheus
# alert rules with promtool (checked, and their unit tests run). The validators
# are pinned, in a virtualenv beside the build (made once, remade when a pin changes); a
# validator that cannot be installed fails this script, it never skips.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[check-deploy] %s\n' "$*" >&2; }
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo -n "$@"; fi; }

# 1.30: the first release with securityContext.appArmorProfile.
k8s_version="1.30.0"
kv_pin="1.37.0"
cj_pin="0.39.0"
venv="${CARGO_TARGET_DIR:-$PWD/target}/deploy-venv"
if ! "$venv/bin/python" - "$kv_pin" "$cj_pin" 2>/dev/null <<'PY'
import importlib.metadata as m, sys
sys.exit(m.version("kubernetes-validate") != sys.argv[1] or m.version("check-jsonschema") != sys.argv[2])
PY
then
  if ! python3 -c 'import ensurepip, venv' 2>/dev/null; then
    log "installing python3-venv"
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq python3 python3-venv >/dev/null
  fi
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check \
    "kubernetes-validate==$kv_pin" "check-jsonschema==$cj_pin"
fi
if ! command -v apparmor_parser >/dev/null; then
  log "installing apparmor (apparmor_parser)"
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq apparmor >/dev/null
fi

# promtool checks and unit-tests the alert rules (deploy/prometheus). Debian's prometheus
# package carries it; its version is pinned by major.minor.
promtool_pin="2.42"
if ! promtool --version 2>/dev/null | grep -q "version $promtool_pin\."; then
  log "installing prometheus (promtool) $promtool_pin"
  as_root apt-get update -qq
  # Only the tool is wanted: the package's daemon is not started (no service manager here).
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  as_root systemctl disable --now prometheus >/dev/null 2>&1 || true
  if ! promtool --version 2>/dev/null | grep -q "version $promtool_pin\."; then
    log "promtool $promtool_pin is not available: $(promtool --version 2>&1 | head -1)"
    exit 1
  fi
fi

manifests=(deploy/k8s/*.yaml)
log "Kubernetes $k8s_version schemas (strict): ${manifests[*]}"
"$venv/bin/kubernetes-validate" --kubernetes-version "$k8s_version" --strict --quiet "${manifests[@]}"

log "compose-spec schema: deploy/docker-compose.yml"
"$venv/bin/check-jsonschema" --builtin-schema vendor.compose-spec deploy/docker-compose.yml

log "AppArmor: deploy/apparmor/sshmode"
# Compiled, not loaded (no kernel interface is needed); the cache notice is noise.
apparmor_parser --skip-kernel-load --skip-cache --quiet deploy/apparmor/sshmode 2> >(grep -v '^Cache read/write disabled' >&2)
log "Prometheus alert rules: deploy/prometheus/alerts.yml (promtool check and unit tests)"
promtool check rules deploy/prometheus/alerts.yml >/dev/null
(cd deploy/prometheus && promtool test rules alerts.test.yml)
log "deploy/ is valid"
