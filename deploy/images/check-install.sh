#!/usr/bin/env bash
# Proves the images' install steps without a container runtime or a base image (none can be
# pulled in CI): for each Containerfile, run its COPY lines into a scratch /src and its
# `RUN python -m pip ...` lines in a fresh venv (python3 -m venv, packages from the registry),
# check the install is lean (no torch, vllm, matplotlib, nixl), then start the image's
# entrypoint with the arguments the sim-cpu manifests give it:
#   coordinator: `pdorch serve --help`, and `pdorch engine sim` (the sim-cpu overlay's engines
#                run this image) with the rendered prefill Deployment's args until /health answers;
#   sim-engine:  the same engine args.
# What is not emulated: FROM (the host's python3 stands for python:3.11-slim), ENV, the user
# (groupadd/useradd need root), `rm -rf /src`.
#   deploy/images/check-install.sh [CONTAINERFILE ...]   (default: both)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
patch="$repo/deploy/kubernetes/overlays/sim-cpu/engine-prefill.patch.yaml"
python=${PYTHON:-python3}
health_timeout_s=${HEALTH_TIMEOUT_S:-60}
if [ $# -eq 0 ]; then
  set -- "$here/coordinator.Containerfile" "$here/sim-engine.Containerfile"
fi
unset PYTHONPATH  # only the venv's installed package, never the checkout

scratch=$(mktemp -d)
engine_pid=""
cleanup() {
  if [ -n "$engine_pid" ]; then kill "$engine_pid" 2>/dev/null || true; wait "$engine_pid" 2>/dev/null || true; fi
  rm -rf "$scratch"
}
trap cleanup EXIT

step() { printf '== %s (%ss)\n' "$*" "$SECONDS"; }

# The engine's args from the rendered sim-cpu Deployment (a generated patch, equal to the
# render: tests/deploy/test_kubernetes_manifests.py), with the pod's fixed ports made free
# loopback ones and $(POD_IP) the loopback address. Printed one per line.
engine_args() {
  "$1" - "$patch" <<'PY'
import socket, sys
import yaml

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

doc = yaml.safe_load(open(sys.argv[1]))
command = doc["spec"]["template"]["spec"]["containers"][0]["command"]
assert command[:3] == ["pdorch", "engine", "sim"], command
args = command[3:]
fixed = {"--port", "--side-channel-port"}
endpoints = {"--kv-events-endpoint", "--kv-events-replay-endpoint"}
out = []
for i, a in enumerate(args):
    flag = args[i - 1] if i else ""
    if flag in fixed:
        a = str(free_port())
    elif flag in endpoints:
        a = f"tcp://127.0.0.1:{free_port()}"
    elif flag == "--host":
        a = "127.0.0.1"
    a = a.replace("$(POD_IP)", "127.0.0.1")
    out.append(a)
print("\n".join(out))
PY
}

check_one() {
  local containerfile=$1 name root venv line dest srcs
  name=$(basename "$containerfile" .Containerfile)
  root="$scratch/$name"
  venv="$root/venv"
  mkdir -p "$root/src"
  step "$name: COPY"
  while read -r line; do
    read -ra words <<<"${line#COPY }"
    dest=${words[-1]}
    srcs=("${words[@]:0:${#words[@]}-1}")
    case "$dest" in /src/*|/src) ;; *) echo "COPY destination outside /src: $line" >&2; return 1;; esac
    mkdir -p "$root$(dirname "$dest")"
    # `COPY a b /src/` copies into /src/; `COPY dir /src/dir` makes /src/dir (a fresh path).
    for s in "${srcs[@]}"; do cp -r "$repo/$s" "$root$dest"; done
  done < <(grep -E '^COPY ' "$containerfile")
  step "$name: python -m venv"
  "$python" -m venv "$venv"
  step "$name: RUN python -m pip ..."
  local runs=0
  while read -r line; do
    line=${line#RUN }
    line=${line//\/src/$root/src}
    (cd "$root" && PATH="$venv/bin:$PATH" bash -euo pipefail -c "$line")
    runs=$((runs + 1))
  done < <(grep -E '^RUN python -m pip ' "$containerfile")
  [ "$runs" -gt 0 ] || { echo "$containerfile: no 'RUN python -m pip' line" >&2; return 1; }
  step "$name: lean"
  "$venv/bin/python" -c '
import importlib.util, sys
heavy = [m for m in ("torch", "vllm", "matplotlib", "nixl", "nixl_cu12") if importlib.util.find_spec(m)]
sys.exit(f"the image would contain {heavy}" if heavy else 0)'
  if grep -q '^ENTRYPOINT \["pdorch"\]' "$containerfile"; then
    step "$name: pdorch serve --help"
    (cd "$root" && "$venv/bin/pdorch" serve --help >/dev/null)
  fi
  step "$name: pdorch engine sim <the sim-cpu prefill args>"
  local args port="" i
  mapfile -t args < <(engine_args "$venv/bin/python")
  for i in "${!args[@]}"; do
    if [ "${args[$i]}" = --port ]; then port=${args[$((i + 1))]}; fi
  done
  [ -n "$port" ] || { echo "no --port in the manifest's args" >&2; return 1; }
  (cd "$root" && exec "$venv/bin/pdorch" engine sim "${args[@]}" >"$root/engine.log" 2>&1) &
  engine_pid=$!
  local deadline=$((SECONDS + health_timeout_s))
  until curl -fsS "http://127.0.0.1:$port/health" >/dev/null 2>&1; do
    if ! kill -0 "$engine_pid" 2>/dev/null; then
      echo "pdorch engine sim exited:" >&2; cat "$root/engine.log" >&2; return 1
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "no /health on port $port in ${health_timeout_s}s:" >&2; cat "$root/engine.log" >&2; return 1
    fi
    sleep 0.5
  done
  kill "$engine_pid"; wait "$engine_pid" 2>/dev/null || true; engine_pid=""
  step "$name: ok"
}

for containerfile in "$@"; do
  check_one "$containerfile"
done
echo "check-install: ok (${SECONDS}s)"
