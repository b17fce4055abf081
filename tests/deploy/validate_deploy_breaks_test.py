#!/usr/bin/env python3
"""Shows that scripts/validate-deploy.py catches broken deployment files: each case copies
deploy/ (and docs/) into a scratch tree, breaks one thing, and expects the validator to fail naming it.

  validate_deploy_breaks_test.py --strata build/cli/strata --root .
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile


def edit(path, old, new, count=1):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if old not in text:
        raise AssertionError(f"test setup: {old!r} not in {path}")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text.replace(old, new, count))


def append(path, text):
    with open(path, "a", encoding="utf-8") as f:
        f.write(text)


# (name, function(tree) that breaks it, substring the validator must print)
CASES = [
    ("container port not in the config",
     lambda t: edit(f"{t}/deploy/k8s/30-prefill.yaml", "containerPort: 7501", "containerPort: 7511"),
     "container ports [7500, 7511] are not the config's worker ports"),
    ("selector does not match the pod labels",
     lambda t: edit(f"{t}/deploy/k8s/31-decode.yaml",
                    "      app.kubernetes.io/component: decode\n  strategy",
                    "      app.kubernetes.io/component: decoder\n  strategy"),
     "selector app.kubernetes.io/component=decoder does not match"),
    ("unknown key in the ConfigMap's Strata config",
     lambda t: edit(f"{t}/deploy/k8s/10-config.yaml", "      write_policy: write_through",
                    "      write_polcy: write_through"),
     "`strata config print` refused the config"),
    ("env override with another port",
     lambda t: edit(f"{t}/deploy/k8s/20-cache.yaml", '"$(HOST_IP):7401"', '"$(HOST_IP):7409"'),
     "STRATA_CACHE_HTTP_LISTEN=$(HOST_IP):7409 has another port"),
    ("STRATA_ variable that names no key",
     lambda t: edit(f"{t}/deploy/k8s/30-prefill.yaml", "name: STRATA_WORKER_HOST_ID",
                    "name: STRATA_WORKER_HOSTID"),
     "STRATA_WORKER_HOSTID names no config key"),
    ("probe on the wrong port",
     lambda t: edit(f"{t}/deploy/k8s/40-scheduler.yaml", "port: 8000\n            periodSeconds: 5",
                    "port: 7300\n            periodSeconds: 5"),
     "readinessProbe is /healthz on 7300"),
    ("YAML that does not parse",
     lambda t: append(f"{t}/deploy/k8s/00-namespace.yaml", "  labels: [unclosed\n"),
     "YAML does not parse"),
    ("object without a name",
     lambda t: edit(f"{t}/deploy/k8s/00-namespace.yaml", "  name: strata\n", "  nam: strata\n"),
     "without metadata.name"),
    ("dashboard metric that does not exist",
     lambda t: edit(f"{t}/deploy/grafana/strata.json", "strata_worker_free_kv_pages",
                    "strata_worker_free_pages"),
     "queries strata_worker_free_pages, which no source file registers"),
    ("dashboard query that is not PromQL",
     lambda t: edit(f"{t}/deploy/grafana/strata.json", "sum by (outcome) (rate(",
                    "sum by (outcome) ((rate("),
     "PromQL does not parse"),
    ("Helm template value missing from values.yaml",
     lambda t: edit(f"{t}/deploy/helm/strata/templates/scheduler.yaml",
                    ".Values.scheduler.service.type", ".Values.scheduler.service.kind"),
     ".Values.scheduler.service.kind is not in values.yaml"),
    ("Helm template with an unclosed block",
     lambda t: append(f"{t}/deploy/helm/strata/templates/scheduler.yaml", "{{- if .Values.image.tag }}\n"),
     "block(s) without"),
    ("Helm values config the binary refuses",
     lambda t: edit(f"{t}/deploy/helm/strata/values.yaml", "    kv_precision: bf16",
                    "    kv_precision: fp16"),
     "(.Values.config): `strata config print` refused"),
    ("systemd example config the binary refuses",
     lambda t: edit(f"{t}/deploy/systemd/strata.yaml", "  policy: strata", "  policy: fastest"),
     "deploy/systemd/strata.yaml: `strata config print` refused"),
    ("systemd unit reading another config",
     lambda t: edit(f"{t}/deploy/systemd/strata-scheduler.service", "/etc/strata/strata.yaml",
                    "/etc/strata/scheduler.yaml"),
     "ExecStart must read --config /etc/strata/strata.yaml"),
    ("config key missing from the docs",
     lambda t: edit(f"{t}/docs/operations.md", "`cache.shm_socket`", "`cache.shm-socket`", count=-1),
     "config key `cache.shm_socket` is not documented"),
    ("Dockerfile exposing another port",
     lambda t: edit(f"{t}/deploy/docker/Dockerfile", "EXPOSE 7300 8000", "EXPOSE 7300 8080"),
     "EXPOSE"),
]
_LOCAL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "deploy", "local",
                      "cluster.yaml")
if os.path.exists(_LOCAL) and "\n  policy: strata" in open(_LOCAL, encoding="utf-8").read():
    CASES.append(("strata up config the binary refuses",
                  lambda t: edit(f"{t}/deploy/local/cluster.yaml", "\n  policy: strata",
                                 "\n  policy: fastest"),
                  "deploy/local/cluster.yaml: `strata config print` refused"))
if shutil.which("systemd-analyze"):
    CASES.append(("systemd unit with an unknown key",
                  lambda t: edit(f"{t}/deploy/systemd/strata-cache.service", "Restart=on-failure",
                                 "Restart=on-failure\nRestartt=always"),
                  "systemd-analyze verify"))


def skip_large(directory, names):
    """Leaves out big files (e.g. a model checkpoint `strata up` wrote under deploy/local/)."""
    return [n for n in names if os.path.isfile(os.path.join(directory, n)) and
            os.path.getsize(os.path.join(directory, n)) > (1 << 20)]


def make_tree(root, scratch):
    """deploy/ copied (it gets broken), the source folders linked (for the metric names)."""
    tree = tempfile.mkdtemp(dir=scratch)
    for name in ("deploy", "docs"):
        shutil.copytree(os.path.join(root, name), os.path.join(tree, name), symlinks=True,
                        ignore=skip_large)
    for name in os.listdir(root):
        full = os.path.join(root, name)
        if name not in ("deploy", "docs", "tests") and not name.startswith(".") and \
                os.path.isdir(full):
            os.symlink(full, os.path.join(tree, name))
    return tree


def run(validator, strata, tree):
    r = subprocess.run([sys.executable, validator, "--strata", strata, "--root", tree,
                        "--no-kubectl"], capture_output=True, text=True, timeout=300)
    return r.returncode, r.stdout + r.stderr


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", required=True)
    ap.add_argument("--root", required=True)
    args = ap.parse_args()
    root = os.path.abspath(args.root)
    validator = os.path.join(root, "scripts", "validate-deploy.py")
    failures = []
    with tempfile.TemporaryDirectory() as scratch:
        rc, out = run(validator, args.strata, make_tree(root, scratch))
        if rc != 0:
            failures.append(f"the unbroken copy does not pass:\n{out}")
        for name, breaks, expect in CASES:
            tree = make_tree(root, scratch)
            breaks(tree)
            rc, out = run(validator, args.strata, tree)
            fails = [l for l in out.splitlines() if l.startswith("FAIL ")]
            if rc != 1 or not any(expect in l for l in fails):
                failures.append(f"{name}: want rc 1 and a FAIL line with {expect!r}, got rc {rc}:"
                                f"\n{out}")
            else:
                print(f"ok   {name}: {next(l for l in fails if expect in l)[:150]}")
    for f in failures:
        print(f"FAILED {f}")
    print(f"{len(CASES) + 1 - len(failures)}/{len(CASES) + 1} cases passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
