#!/usr/bin/env bash
# CTest "deploy.artifacts": the deployment artifacts of deploy/ (docs/operations.md,
# "Deploying") are checked against the programs they start, so that a renamed flag or a typo in
# a unit fails here and not on an operator's machine:
# - every systemd unit passes `systemd-analyze verify` with no warning (its ExecStart pointed at
#   the build's binaries);
# - every Kubernetes manifest parses, each workload's selector matches its pod labels, each
#   volume a container mounts is declared;
# - every --flag and SPACE_* variable a unit or manifest gives a program is one that program's
#   --help lists;
# - the example nats-server configuration passes `nats-server -t` (its sync_interval line is
#   dropped for servers older than 2.10, which refuse it: docs/operations.md, Durability).
# Usage: check.sh BIN_DIR
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
bin=${1:?usage: check.sh BIN_DIR}
tmp=$(mktemp -d /tmp/space-deploy.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

for u in "$repo"/deploy/systemd/*.service; do
  sed "s|/usr/local/bin/|$bin/|g" "$u" >"$tmp/$(basename "$u")"
done
out=$(systemd-analyze verify "$tmp"/*.service 2>&1) || { echo "$out"; exit 1; }
if [ -n "$out" ]; then
  echo "deploy: systemd-analyze verify is not clean:"
  echo "$out"
  exit 1
fi
echo "deploy: $(ls "$tmp"/*.service | wc -l) systemd units verify"

python3 - "$repo" "$bin" <<'EOF'
import glob, os, re, shlex, subprocess, sys
import yaml

repo, bin_dir = sys.argv[1], sys.argv[2]
helps = {}
def known(prog):
    """The flags and SPACE_* variables prog's --help lists."""
    if prog not in helps:
        out = subprocess.run([os.path.join(bin_dir, prog), "--help"], capture_output=True,
                             text=True, timeout=30).stdout
        flags = set(re.findall(r"^\s+(--[a-z0-9-]+)", out, re.M))
        envs = set(re.findall(r"\[(SPACE_[A-Z0-9_]+)\]", out))
        if not flags:
            sys.exit(f"deploy: {prog} --help lists no options")
        helps[prog] = (flags, envs)
    return helps[prog]

errors = []
def check_args(where, prog, args, envs):
    flags, names = known(prog)
    for a in args:
        if a.startswith("--") and a.split("=", 1)[0] not in flags:
            errors.append(f"{where}: {prog} has no option {a.split('=', 1)[0]}")
    for e in envs:
        if e.startswith("SPACE_") and e not in names:
            errors.append(f"{where}: {prog} reads no {e}")

units = sorted(glob.glob(os.path.join(repo, "deploy/systemd/*.service")))
for u in units:
    text = open(u).read()
    m = re.search(r"^ExecStart=(.*)$", text, re.M)
    if not m:
        errors.append(f"{u}: no ExecStart")
        continue
    argv = shlex.split(m.group(1))
    envs = []
    for line in re.findall(r"^Environment=(.*)$", text, re.M):
        envs += [kv.split("=", 1)[0] for kv in shlex.split(line)]
    check_args(os.path.basename(u), os.path.basename(argv[0]), argv[1:], envs)

config = {}
docs = 0
for f in sorted(glob.glob(os.path.join(repo, "deploy/k8s/*.yaml"))):
    for d in yaml.safe_load_all(open(f)):
        if d is None:
            continue
        docs += 1
        name = f"{os.path.basename(f)}:{d.get('kind')}/{d.get('metadata', {}).get('name')}"
        for k in ("apiVersion", "kind", "metadata"):
            if k not in d:
                errors.append(f"{name}: no {k}")
        if d.get("kind") == "ConfigMap":
            config[d["metadata"]["name"]] = d.get("data", {})
for f in sorted(glob.glob(os.path.join(repo, "deploy/k8s/*.yaml"))):
    for d in yaml.safe_load_all(open(f)):
        if not d or d.get("kind") not in ("Deployment", "DaemonSet", "StatefulSet"):
            continue
        name = f"{os.path.basename(f)}:{d['kind']}/{d['metadata']['name']}"
        spec = d["spec"]
        labels = spec["template"]["metadata"].get("labels", {})
        for k, v in spec["selector"]["matchLabels"].items():
            if labels.get(k) != v:
                errors.append(f"{name}: selector {k}={v} matches no pod label")
        pod = spec["template"]["spec"]
        volumes = {v["name"] for v in pod.get("volumes", [])}
        for c in pod["containers"]:
            prog = os.path.basename(c["command"][0])
            envs = [e["name"] for e in c.get("env", [])]
            check_args(f"{name}/{c['name']}", prog, c["command"][1:], envs)
            for ef in c.get("envFrom", []):
                cm = ef.get("configMapRef", {}).get("name")
                if cm not in config:
                    errors.append(f"{name}/{c['name']}: no ConfigMap {cm}")
            for vm in c.get("volumeMounts", []):
                if vm["name"] not in volumes:
                    errors.append(f"{name}/{c['name']}: mounts undeclared volume {vm['name']}")
# The shared ConfigMap's variables: each read by at least one program that loads it.
for cm, data in config.items():
    for k in data:
        if k.startswith("SPACE_") and not any(k in e for _, e in helps.values()):
            errors.append(f"ConfigMap {cm}: no program reads {k}")
if errors:
    print("\n".join("deploy: " + e for e in errors))
    sys.exit(1)
print(f"deploy: {len(units)} units and {docs} Kubernetes documents name only existing options")
EOF

ver=$(nats-server --version 2>&1 | sed -n 's/.* v\([0-9]*\)\.\([0-9]*\).*/\1 \2/p')
sed 's/@ROUTE_PASSWORD@/deploy-check-password/g' "$repo/deploy/nats/n1.conf" >"$tmp/n1.conf"
read -r major minor <<<"${ver:-0 0}"
if [ "$major" -lt 2 ] || { [ "$major" -eq 2 ] && [ "$minor" -lt 10 ]; }; then
  sed -i '/sync_interval/d' "$tmp/n1.conf"
fi
nats-server -t -c "$tmp/n1.conf"
echo
echo "deploy: all artifacts check"
