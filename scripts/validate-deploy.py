#!/usr/bin/env python3
"""Checks the deployment files under deploy/ without a cluster, helm, docker or systemd running.

  scripts/validate-deploy.py --strata build/cli/strata [--root .]

What it checks (each failure is printed; the exit status is 1 if there is any):
  - every YAML file under deploy/ parses (Helm templates excepted: they are Go templates);
  - deploy/k8s: every object has apiVersion, kind, metadata.name; workload selectors match their pod
    template labels; every Service selects a workload and its named target ports exist there;
    the containers' ports, probe ports, Prometheus annotations and STRATA_*_LISTEN overrides agree
    with the ports of the Strata config in the ConfigMap; every STRATA_* variable names a real key;
  - the ConfigMap's config, the systemd example config, the Helm chart's `config` value and the
    `strata up` configs in deploy/local/ are accepted by the real binary
    (`strata config print --config FILE`);
  - every metric the Grafana dashboard queries is registered somewhere in the source tree, and
    each query parses as PromQL (`promtool check rules`, when promtool is present);
  - the Helm chart: Chart.yaml and values.yaml parse, every .Values path used in a template exists
    in values.yaml, every included template is defined, template actions and blocks balance;
  - systemd units: `systemd-analyze verify` (when present) with no unknown keys, and each unit's
    --config file is the example config shipped next to it;
  - the Dockerfile exposes the ports of the k8s config;
  - `kubectl kustomize deploy/k8s` renders (when kubectl is present; it works offline);
  - docs/operations.md names every config key.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import yaml

ERRORS = []
NOTES = []

# Which config keys hold a daemon's listen addresses, per `strata <subcommand>`.
LISTEN_KEYS = {
    "cache": {"grpc": "cache.listen", "http": "cache.http_listen", "transfer": "cache.transfer_listen"},
    "worker": {"grpc": "worker.listen", "http": "worker.http_listen"},
    "scheduler": {"grpc": "scheduler.listen", "http": "scheduler.http_listen"},
}
WORKLOAD_KINDS = {"Deployment", "DaemonSet", "StatefulSet"}


def error(where, msg):
    ERRORS.append(f"{where}: {msg}")


def rel(root, path):
    return os.path.relpath(path, root)


def load_all(path):
    with open(path, encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def flatten(tree, prefix=""):
    """{'cache': {'dram': {'capacity': x}}} -> {'cache.dram.capacity': x}."""
    out = {}
    if isinstance(tree, dict):
        for k, v in tree.items():
            key = f"{prefix}.{k}" if prefix else str(k)
            if isinstance(v, dict):
                out.update(flatten(v, key))
            else:
                out[key] = v
    return out


def port_of(address):
    if not isinstance(address, str) or ":" not in address:
        return None
    tail = address.rsplit(":", 1)[1]
    return int(tail) if tail.isdigit() else None


class Strata:
    def __init__(self, binary):
        self.binary = binary
        self._keys = None

    def check_config(self, where, text):
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
            f.write(text)
            name = f.name
        try:
            env = {k: v for k, v in os.environ.items() if not k.startswith("STRATA_")}
            r = subprocess.run([self.binary, "config", "print", "--config", name], env=env,
                               capture_output=True, text=True, timeout=60)
            if r.returncode != 0:
                error(where, f"`strata config print` refused the config (rc {r.returncode}): "
                      f"{(r.stderr or r.stdout).strip()}")
                return None
            return flatten(yaml.safe_load(
                subprocess.run([self.binary, "config", "print", "--config", name, "--no-comments"],
                               env=env, capture_output=True, text=True, timeout=60).stdout))
        finally:
            os.unlink(name)

    def keys(self):
        """Every config key the binary knows (from the defaults it prints)."""
        if self._keys is None:
            env = {k: v for k, v in os.environ.items() if not k.startswith("STRATA_")}
            out = subprocess.run([self.binary, "config", "print", "--no-comments"], env=env,
                                 capture_output=True, text=True, timeout=60, check=True).stdout
            self._keys = set(flatten(yaml.safe_load(out)))
        return self._keys

    def env_names(self):
        return {"STRATA_" + re.sub(r"[.-]", "_", k).upper(): k for k in self.keys()}


# ---------------------------------------------------------------------------------------------
def check_yaml_parses(root):
    """Every YAML file under deploy/ except Helm templates."""
    docs = {}
    for dirpath, _, files in os.walk(os.path.join(root, "deploy")):
        if os.sep + "templates" in dirpath:
            continue
        for name in sorted(files):
            if not name.endswith((".yaml", ".yml")):
                continue
            path = os.path.join(dirpath, name)
            try:
                docs[path] = load_all(path)
            except yaml.YAMLError as e:
                error(rel(root, path), f"YAML does not parse: {e}")
    return docs


def containers_of(obj):
    spec = obj.get("spec", {}).get("template", {}).get("spec", {})
    return spec.get("containers", []) or [], spec.get("initContainers", []) or []


def check_k8s(root, docs, strata):
    k8s_dir = os.path.join(root, "deploy", "k8s")
    objects = []
    for path, items in docs.items():
        if not path.startswith(k8s_dir + os.sep) or path.endswith("kustomization.yaml"):
            continue
        for obj in items:
            where = rel(root, path)
            if not isinstance(obj, dict):
                error(where, "a document that is not a mapping")
                continue
            ok = True
            for field in ("apiVersion", "kind"):
                if not obj.get(field):
                    error(where, f"an object without {field}")
                    ok = False
            if not isinstance(obj.get("metadata"), dict) or not obj["metadata"].get("name"):
                error(where, f"a {obj.get('kind')} without metadata.name")
                ok = False
            if ok:  # the checks below assume the basic fields
                objects.append((where, obj))
    if not objects:
        error("deploy/k8s", "no Kubernetes objects found")
        return
    kust = os.path.join(k8s_dir, "kustomization.yaml")
    if os.path.exists(kust):
        listed = set(load_all(kust)[0].get("resources", []))
        present = {os.path.basename(w) for w, _ in objects}
        for missing in sorted(present - listed):
            error(rel(root, kust), f"{missing} is not listed in resources")
        for extra in sorted(listed - present):
            error(rel(root, kust), f"lists {extra}, which has no objects")
    check_k8s_objects(objects, strata, "deploy/k8s")


def check_k8s_objects(objects, strata, label):
    """Checks a list of (where, object) that together make one Strata cluster."""
    configs = [(w, o) for w, o in objects if o.get("kind") == "ConfigMap"
               and "strata.yaml" in (o.get("data") or {})]
    if len(configs) != 1:
        error(label, f"want exactly one ConfigMap with a strata.yaml key, found {len(configs)}")
        return
    where, cm = configs[0]
    config = strata.check_config(f"{where} (ConfigMap {cm['metadata']['name']})",
                                 cm["data"]["strata.yaml"])
    if config is None:
        return
    env_names = strata.env_names()
    workloads = [(w, o) for w, o in objects if o.get("kind") in WORKLOAD_KINDS]
    namespaces = {o["metadata"]["name"] for _, o in objects if o.get("kind") == "Namespace"}
    for w, o in objects:
        ns = (o.get("metadata") or {}).get("namespace")
        if o.get("kind") != "Namespace" and namespaces and ns not in namespaces:
            error(w, f"{o.get('kind')} {o['metadata'].get('name')} is in namespace {ns!r}, "
                  f"not one of {sorted(namespaces)}")
    seen_daemons = set()
    for w, o in workloads:
        name = f"{o['kind']} {o['metadata']['name']}"
        sel = ((o.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
        labels = (((o.get("spec") or {}).get("template") or {}).get("metadata") or {}).get(
            "labels") or {}
        if not sel:
            error(w, f"{name}: no spec.selector.matchLabels")
        for k, v in sel.items():
            if labels.get(k) != v:
                error(w, f"{name}: selector {k}={v} does not match the pod template labels {labels}")
        annotations = (o["spec"]["template"].get("metadata") or {}).get("annotations") or {}
        containers, _ = containers_of(o)
        pod_spec = o["spec"]["template"]["spec"]
        volumes = {v.get("name") for v in pod_spec.get("volumes", []) or []}
        cm_names = {v["configMap"]["name"] for v in pod_spec.get("volumes", []) or []
                    if "configMap" in v}
        for c in containers + containers_of(o)[1]:
            for m in c.get("volumeMounts", []) or []:
                if m.get("name") not in volumes:
                    error(w, f"{name}: container {c.get('name')} mounts undefined volume "
                          f"{m.get('name')}")
        for c in containers:
            args = c.get("args") or c.get("command") or []
            daemon = next((a for a in args if a in LISTEN_KEYS), None)
            if daemon is None:
                continue
            seen_daemons.add(daemon)
            cname = f"{name} container {c.get('name')}"
            if "--config" in args:
                cfg_path = args[args.index("--config") + 1]
                mounted = [m for m in c.get("volumeMounts", []) or []
                           if cfg_path.startswith(m.get("mountPath", "//") + "/")]
                if not mounted or cm["metadata"]["name"] not in cm_names:
                    error(w, f"{cname}: --config {cfg_path} is not the mounted ConfigMap "
                          f"{cm['metadata']['name']}")
            else:
                error(w, f"{cname}: runs `strata {daemon}` without --config")
            env = {e["name"]: e.get("value") for e in c.get("env", []) or []}
            # Effective listen addresses: the config, overridden by STRATA_* variables.
            want = {}
            for pname, key in LISTEN_KEYS[daemon].items():
                address = config.get(key)
                var = "STRATA_" + key.replace(".", "_").upper()
                if var in env and env[var] is not None:
                    if port_of(env[var]) != port_of(address):
                        error(w, f"{cname}: {var}={env[var]} has another port than {key}="
                              f"{address} in the ConfigMap")
                    address = env[var]
                if address:
                    want[pname] = port_of(address)
            for var in env:
                if var.startswith("STRATA_") and var not in env_names:
                    error(w, f"{cname}: {var} names no config key")
            got = {p.get("containerPort") for p in c.get("ports", []) or []}
            if got != set(want.values()):
                error(w, f"{cname}: container ports {sorted(got)} are not the config's "
                      f"{daemon} ports {sorted(want.values())} ({LISTEN_KEYS[daemon]})")
            http = want.get("http")
            for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
                p = (c.get(probe) or {}).get("httpGet")
                if p is None:
                    if probe != "startupProbe":
                        error(w, f"{cname}: no {probe} httpGet")
                    continue
                port = p.get("port")
                if isinstance(port, str):
                    port = next((q.get("containerPort") for q in c.get("ports", [])
                                 if q.get("name") == port), None)
                if port != http or p.get("path") != "/healthz":
                    error(w, f"{cname}: {probe} is {p.get('path')} on {port}, want /healthz on "
                          f"the http port {http}")
            if daemon != "scheduler":  # the scheduler serves no /metrics (yet)
                if annotations.get("prometheus.io/scrape") != "true" or \
                        str(annotations.get("prometheus.io/port")) != str(http):
                    error(w, f"{cname}: Prometheus annotations must scrape the http port {http}")
    for daemon in LISTEN_KEYS:
        if daemon not in seen_daemons:
            error(label, f"no workload runs `strata {daemon}`")
    for w, o in objects:
        if o.get("kind") != "Service":
            continue
        sel = (o.get("spec") or {}).get("selector") or {}
        targets = [wo for _, wo in workloads
                   if all(((wo["spec"]["template"].get("metadata") or {}).get("labels") or {})
                          .get(k) == v for k, v in sel.items())]
        if not targets:
            error(w, f"Service {o['metadata']['name']} selects no workload ({sel})")
            continue
        for p in o["spec"].get("ports", []) or []:
            t = p.get("targetPort", p.get("port"))
            ok = any((isinstance(t, int) and q.get("containerPort") == t) or q.get("name") == t
                     for wo in targets for c in containers_of(wo)[0]
                     for q in c.get("ports", []) or [])
            if not ok:
                error(w, f"Service {o['metadata']['name']}: target port {t} is no container "
                      "port of the pods it selects")


# ---------------------------------------------------------------------------------------------
def registered_metrics(root):
    names = set()
    pattern = re.compile(r'"(strata_[a-z0-9_]+)"')
    for top in os.listdir(root):
        if top in ("tests", "deploy", "docs", "node_modules") or top.startswith((".", "build")):
            continue
        base = os.path.join(root, top)
        if not os.path.isdir(base):
            continue
        for dirpath, _, files in os.walk(base):
            for name in files:
                if name.endswith((".cc", ".h", ".cu")):
                    with open(os.path.join(dirpath, name), encoding="utf-8",
                              errors="replace") as f:
                        names.update(pattern.findall(f.read()))
    return names


def check_grafana(root):
    path = os.path.join(root, "deploy", "grafana", "strata.json")
    if not os.path.exists(path):
        error("deploy/grafana", "strata.json is missing")
        return
    try:
        with open(path, encoding="utf-8") as f:
            dash = json.load(f)
    except json.JSONDecodeError as e:
        error(rel(root, path), f"JSON does not parse: {e}")
        return
    exprs = []

    def walk(x):
        if isinstance(x, dict):
            for k, v in x.items():
                if k in ("expr", "query", "definition") and isinstance(v, str):
                    exprs.append(v)
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(dash)
    if not exprs:
        error(rel(root, path), "no queries")
    check_promql(rel(root, path), [e for e in exprs if not e.startswith("label_values(")])
    known = registered_metrics(root)
    used = set()
    for e in exprs:
        for m in re.findall(r"\bstrata_[a-z0-9_]+", e):
            base = re.sub(r"_(bucket|sum|count)$", "", m)
            used.add(m if m in known else base)
    for m in sorted(used - known):
        error(rel(root, path), f"queries {m}, which no source file registers")
    return used


def check_promql(where, exprs):
    """Parses each PromQL query with `promtool check rules` (Grafana's variables filled in)."""
    promtool = shutil.which("promtool")
    if promtool is None:
        NOTES.append("promtool not found: the dashboard's PromQL was not parsed")
        return
    fill = {"$__rate_interval": "5m", "$__range": "1h", "$__interval": "1m", "$instance": ".*"}
    rules = []
    for i, e in enumerate(exprs):
        for var, value in fill.items():
            e = e.replace(var, value)
        rules.append({"record": f"strata:dashboard_query_{i}", "expr": e})
    with tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False) as f:
        yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}, f)
        name = f.name
    try:
        r = subprocess.run([promtool, "check", "rules", name], capture_output=True, text=True,
                           timeout=60)
        if r.returncode != 0:
            error(where, f"PromQL does not parse (promtool check rules): "
                  f"{(r.stderr or r.stdout).strip()}")
    finally:
        os.unlink(name)


# ---------------------------------------------------------------------------------------------
def check_helm(root, strata):
    chart = os.path.join(root, "deploy", "helm", "strata")
    for f in ("Chart.yaml", "values.yaml", "templates/_helpers.tpl", "templates/NOTES.txt"):
        if not os.path.exists(os.path.join(chart, f)):
            error("deploy/helm/strata", f"{f} is missing")
    try:
        meta = load_all(os.path.join(chart, "Chart.yaml"))[0]
        for k in ("apiVersion", "name", "version"):
            if not meta.get(k):
                error("deploy/helm/strata/Chart.yaml", f"no {k}")
        values = load_all(os.path.join(chart, "values.yaml"))[0]
    except (OSError, IndexError, yaml.YAMLError) as e:
        error("deploy/helm/strata", f"Chart.yaml/values.yaml: {e}")
        return
    if "config" in values:
        strata.check_config("deploy/helm/strata/values.yaml (.Values.config)",
                            yaml.safe_dump(values["config"]))
    else:
        error("deploy/helm/strata/values.yaml", "no `config` (the Strata cluster config)")
    tdir = os.path.join(chart, "templates")
    defined, included = set(), set()
    for name in sorted(os.listdir(tdir)):
        path = os.path.join(tdir, name)
        where = rel(root, path)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        actions = re.findall(r"{{-?\s*(.*?)\s*-?}}", text, re.S)
        if text.count("{{") != text.count("}}") or text.count("{{") != len(actions):
            error(where, "unbalanced {{ }}")
        depth = 0
        for a in actions:
            if a.startswith("/*"):
                continue
            word = a.split()[0] if a.split() else ""
            if word in ("if", "range", "with", "define", "block"):
                depth += 1
            elif word == "end":
                depth -= 1
                if depth < 0:
                    error(where, "{{ end }} without an opening block")
                    depth = 0
            m = re.match(r'define\s+"([^"]+)"', a)
            if m:
                defined.add(m.group(1))
            for inc in re.findall(r'(?:include|template)\s+"([^"]+)"', a):
                included.add((where, inc))
            for ref in re.findall(r"\.Values((?:\.[A-Za-z_][A-Za-z0-9_]*)+)", a):
                node = values
                for part in ref.strip(".").split("."):
                    if not isinstance(node, dict) or part not in node:
                        error(where, f".Values{ref} is not in values.yaml")
                        break
                    node = node[part]
        if depth != 0:
            error(where, f"{depth} block(s) without {{{{ end }}}}")
    for where, inc in sorted(included):
        if inc not in defined:
            error(where, f'includes "{inc}", which no template defines')


# ---------------------------------------------------------------------------------------------
def check_systemd(root, strata):
    sdir = os.path.join(root, "deploy", "systemd")
    units = sorted(f for f in os.listdir(sdir) if f.endswith(".service"))
    if not units:
        error("deploy/systemd", "no units")
        return
    example = os.path.join(sdir, "strata.yaml")
    if not os.path.exists(example):
        error("deploy/systemd", "strata.yaml (the example config) is missing")
    else:
        with open(example, encoding="utf-8") as f:
            strata.check_config(rel(root, example), f.read())
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        NOTES.append("systemd-analyze not found: unit files were not verified")
    tmp = tempfile.mkdtemp()
    try:
        for unit in units:
            with open(os.path.join(sdir, unit), encoding="utf-8") as f:
                text = f.read()
            where = f"deploy/systemd/{unit}"
            exec_start = re.findall(r"^ExecStart=(.*)$", text, re.M)
            if len(exec_start) != 1:
                error(where, "want exactly one ExecStart")
                continue
            m = re.search(r"--config\s+(\S+)", exec_start[0])
            if not m or m.group(1) != "/etc/strata/strata.yaml":
                error(where, "ExecStart must read --config /etc/strata/strata.yaml "
                      "(deploy/systemd/strata.yaml installed there)")
            if analyze is None:
                continue
            # verify needs the executable to exist: point ExecStart at the binary under test.
            text = re.sub(r"(^Exec\w+=[-+!@:]*)/usr/local/bin/strata", rf"\1{strata.binary}",
                          text, flags=re.M)
            instance = unit.replace("@.service", "@prefill.service")
            path = os.path.join(tmp, unit)
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
            target = os.path.join(tmp, instance)
            r = subprocess.run([analyze, "verify", "--man=no", target], cwd=tmp,
                               capture_output=True, text=True, timeout=60)
            out = (r.stdout + r.stderr).strip()
            bad = [l for l in out.splitlines() if unit.split("@")[0] in l or "strata" in l]
            if r.returncode != 0 or bad:
                error(where, f"systemd-analyze verify: rc {r.returncode}: {out}")
    finally:
        shutil.rmtree(tmp)


def check_dockerfile(root, docs):
    path = os.path.join(root, "deploy", "docker", "Dockerfile")
    if not os.path.exists(path):
        error("deploy/docker", "Dockerfile is missing")
        return
    with open(path, encoding="utf-8") as f:
        text = f.read()
    exposed = {int(p.split("/")[0]) for line in re.findall(r"^EXPOSE\s+(.*)$", text, re.M)
               for p in line.split()}
    cm = next((o for p, items in docs.items() if os.sep + "k8s" + os.sep in p for o in items
               if isinstance(o, dict) and o.get("kind") == "ConfigMap"), None)
    if cm:
        cfg = flatten(yaml.safe_load(cm["data"]["strata.yaml"]))
        want = {port_of(cfg[k]) for keys in LISTEN_KEYS.values() for k in keys.values()
                if cfg.get(k)}
        if exposed != want:
            error(rel(root, path), f"EXPOSE {sorted(exposed)} is not the config's ports "
                  f"{sorted(want)}")
    if not re.search(r"^USER\s+(?!root\b|0\b)\S+", text, re.M):
        error(rel(root, path), "the runtime stage must run as a non-root USER")
    if not re.search(r'^ENTRYPOINT\s+\[\s*"[^"]*strata"', text, re.M):
        error(rel(root, path), "ENTRYPOINT must be the strata binary")


def check_kustomize(root):
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        NOTES.append("kubectl not found: `kubectl kustomize deploy/k8s` was not run")
        return
    r = subprocess.run([kubectl, "kustomize", os.path.join(root, "deploy", "k8s")],
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        error("deploy/k8s", f"kubectl kustomize failed: {r.stderr.strip()}")


def check_local(root, strata):
    """deploy/local/*.yaml (the `strata up` clusters) are Strata configs the binary accepts."""
    ldir = os.path.join(root, "deploy", "local")
    if not os.path.isdir(ldir):
        return
    for name in sorted(os.listdir(ldir)):
        if name.endswith((".yaml", ".yml")):
            with open(os.path.join(ldir, name), encoding="utf-8") as f:
                strata.check_config(f"deploy/local/{name}", f.read())


def check_docs(root, strata):
    """docs/operations.md names every config key the binary knows (its reference tables)."""
    path = os.path.join(root, "docs", "operations.md")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    for key in sorted(strata.keys()):
        if f"`{key}`" not in text:
            error("docs/operations.md", f"config key `{key}` is not documented")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--strata", required=True, help="the strata binary")
    ap.add_argument("--root", default=os.path.join(os.path.dirname(__file__), ".."))
    ap.add_argument("--no-kubectl", action="store_true", help="skip `kubectl kustomize`")
    args = ap.parse_args()
    root = os.path.abspath(args.root)
    strata = Strata(os.path.abspath(args.strata))
    docs = check_yaml_parses(root)
    used = set()
    checks = [lambda: check_k8s(root, docs, strata), lambda: check_helm(root, strata),
              lambda: check_systemd(root, strata), lambda: check_dockerfile(root, docs),
              lambda: used.update(check_grafana(root) or ()), lambda: check_docs(root, strata),
              lambda: check_local(root, strata)]
    if not args.no_kubectl:
        checks.append(lambda: check_kustomize(root))
    for check in checks:
        try:
            check()
        except Exception as e:  # a file too broken for a check: report it, go on with the rest
            error("validate-deploy", f"{type(e).__name__}: {e}")
    for n in NOTES:
        print(f"note: {n}")
    for e in ERRORS:
        print(f"FAIL {e}")
    print(f"validate-deploy: {len(docs)} YAML files, {len(used)} dashboard metrics, "
          f"{len(ERRORS)} problem(s)")
    return 1 if ERRORS else 0


if __name__ == "__main__":
    sys.exit(main())
