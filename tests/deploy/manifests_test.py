#!/usr/bin/env python3
"""Checks deploy/k8s/*.yaml without a cluster (none runs here), and runs what can run.

    manifests_test.py TESSERA MODEL.gguf

1. Every document parses (python3-yaml) and validates against the JSON Schema below
   (python3-jsonschema): the fields these manifests rely on, with their types —
   hand-written from the Kubernetes API reference for apps/v1 Deployment, v1
   Service/Secret/ConfigMap and LeaderWorkerSet v1; unknown kinds are refused.
2. Cross-checks a schema cannot express: selectors match the pod labels; every
   probe and targetPort names a declared container port; the serving pod has a
   readiness probe on /health and Prometheus annotations naming its HTTP port and
   /metrics; every `--flag` passed to `tessera serve` exists in `tessera serve
   --help`; the image's user is non-root; the LWS script's rendezvous host is the
   last worker's stable DNS name.
3. Runs the LeaderWorkerSet pods' command (the ConfigMap's run.sh) as two
   processes on this host, as LWS would set their variables, and checks that the
   leader serves /health, a completion, and a live view of the 4 ranks.
Exits 77 (CTest's skip) with the reason when python3-yaml or python3-jsonschema is
missing.
"""
import glob
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request

SKIP = 77
try:
    import jsonschema
    import yaml
except ImportError as e:
    print(f"SKIP: {e.name} is missing (Debian: apt-get install python3-yaml python3-jsonschema)")
    sys.exit(SKIP)

STR = {"type": "string"}
INT = {"type": "integer"}
STR_MAP = {"type": "object", "additionalProperties": STR}
PORT_REF = {"oneOf": [INT, STR]}
META = {"type": "object", "required": ["name"],
        "properties": {"name": STR, "labels": STR_MAP, "annotations": STR_MAP}}
PROBE = {"type": "object", "properties": {
    "httpGet": {"type": "object", "required": ["path", "port"],
                "properties": {"path": STR, "port": PORT_REF}},
    "tcpSocket": {"type": "object", "required": ["port"], "properties": {"port": PORT_REF}},
    "periodSeconds": INT, "failureThreshold": INT, "initialDelaySeconds": INT},
    "additionalProperties": False}
QUANTITIES = {"type": "object", "additionalProperties": STR}
CONTAINER = {"type": "object", "required": ["name", "image"], "additionalProperties": False,
             "properties": {
                 "name": STR, "image": STR,
                 "imagePullPolicy": {"enum": ["Always", "IfNotPresent", "Never"]},
                 "command": {"type": "array", "items": STR},
                 "args": {"type": "array", "items": STR},
                 "env": {"type": "array", "items": {
                     "type": "object", "required": ["name"], "additionalProperties": False,
                     "properties": {"name": STR, "value": STR, "valueFrom": {"type": "object"}}}},
                 "ports": {"type": "array", "items": {
                     "type": "object", "required": ["containerPort"], "additionalProperties": False,
                     "properties": {"name": STR, "containerPort": INT}}},
                 "readinessProbe": PROBE, "livenessProbe": PROBE,
                 "resources": {"type": "object", "additionalProperties": False, "properties": {
                     "requests": QUANTITIES, "limits": QUANTITIES}},
                 "securityContext": {"type": "object", "properties": {
                     "allowPrivilegeEscalation": {"type": "boolean"},
                     "readOnlyRootFilesystem": {"type": "boolean"}}},
                 "volumeMounts": {"type": "array", "items": {
                     "type": "object", "required": ["name", "mountPath"],
                     "properties": {"name": STR, "mountPath": STR}}}}}
POD_TEMPLATE = {"type": "object", "required": ["metadata", "spec"], "properties": {
    "metadata": {"type": "object", "properties": {"labels": STR_MAP, "annotations": STR_MAP}},
    "spec": {"type": "object", "required": ["containers"], "properties": {
        "securityContext": {"type": "object", "properties": {
            "runAsNonRoot": {"type": "boolean"}, "runAsUser": INT, "runAsGroup": INT}},
        "containers": {"type": "array", "minItems": 1, "items": CONTAINER},
        "terminationGracePeriodSeconds": INT,
        "volumes": {"type": "array", "items": {"type": "object", "required": ["name"]}}}}}}
SCHEMAS = {
    ("apps/v1", "Deployment"): {"type": "object", "required": ["spec"], "properties": {"spec": {
        "type": "object", "required": ["selector", "template"], "properties": {
            "replicas": INT,
            "selector": {"type": "object", "required": ["matchLabels"],
                         "properties": {"matchLabels": STR_MAP}},
            "template": POD_TEMPLATE}}}},
    ("v1", "Service"): {"type": "object", "required": ["spec"], "properties": {"spec": {
        "type": "object", "required": ["selector", "ports"], "properties": {
            "selector": STR_MAP,
            "ports": {"type": "array", "minItems": 1, "items": {
                "type": "object", "required": ["port"], "additionalProperties": False,
                "properties": {"name": STR, "port": INT, "targetPort": PORT_REF}}}}}}},
    ("v1", "Secret"): {"type": "object", "properties": {"type": STR, "stringData": STR_MAP}},
    ("v1", "ConfigMap"): {"type": "object", "required": ["data"], "properties": {"data": STR_MAP}},
    ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"): {
        "type": "object", "required": ["spec"], "properties": {"spec": {
            "type": "object", "required": ["leaderWorkerTemplate"], "properties": {
                "replicas": INT,
                "startupPolicy": {"enum": ["LeaderCreated", "LeaderReady"]},
                "leaderWorkerTemplate": {
                    "type": "object", "required": ["size", "leaderTemplate", "workerTemplate"],
                    "additionalProperties": False, "properties": {
                        "size": {"type": "integer", "minimum": 2},
                        "restartPolicy": {"enum": ["RecreateGroupOnPodRestart", "None"]},
                        "leaderTemplate": POD_TEMPLATE, "workerTemplate": POD_TEMPLATE}}}}}},
}


def check(cond, message):
    if not cond:
        raise AssertionError(message)


def serve_flags(tessera):
    text = subprocess.run([tessera, "serve", "--help"], capture_output=True, text=True).stdout
    return set(re.findall(r"(--[a-z][a-z0-9-]*)", text))


def check_pod(where, template, flags, script_flags=()):
    """Ports, probes, annotations, user and flags of a pod template; its HTTP port or None."""
    spec = template["spec"]
    check(spec.get("securityContext", {}).get("runAsNonRoot") is True, f"{where}: runAsNonRoot")
    http_port = None
    for c in spec["containers"]:
        ports = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
        for probe_name in ("readinessProbe", "livenessProbe"):
            probe = c.get(probe_name)
            if not probe:
                continue
            ref = (probe.get("httpGet") or probe.get("tcpSocket"))["port"]
            check(ref in ports or ref in ports.values(), f"{where}: {probe_name} port {ref!r} undeclared")
        used = [a for a in c.get("args", []) if a.startswith("--")] + list(script_flags)
        for flag in used:
            check(flag in flags, f"{where}: `tessera serve` has no {flag}")
        if "http" in ports:
            http_port = ports["http"]
            probe = c.get("readinessProbe", {}).get("httpGet", {})
            check(probe.get("path") == "/health", f"{where}: readiness probe is not GET /health")
            notes = template["metadata"].get("annotations", {})
            check(notes.get("prometheus.io/scrape") == "true", f"{where}: no prometheus.io/scrape")
            check(notes.get("prometheus.io/port") == str(http_port), f"{where}: prometheus.io/port")
            check(notes.get("prometheus.io/path") == "/metrics", f"{where}: prometheus.io/path")
    return http_port


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as res:
        return json.loads(res.read())


def run_lws_script(script, tessera, model):
    """The two pods' command on this host; the leader must serve."""
    port, rdzv = free_port(), free_port()
    base_env = dict(os.environ, TESSERA_BIN=tessera, TESSERA_MODEL=model, TESSERA_THREADS="1",
                    LWS_GROUP_SIZE="2", LWS_LEADER_ADDRESS="tessera-0.tessera.default.svc",
                    TESSERA_RDZV_HOST="127.0.0.1", TESSERA_RDZV_PORT=str(rdzv),
                    TESSERA_PORT=str(port), TESSERA_CLUSTER_TOKEN="manifests-test")
    pods = [subprocess.Popen(["sh", "-c", script], env=dict(base_env, LWS_WORKER_INDEX=str(i)),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for i in (1, 0)]
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if get(f"http://127.0.0.1:{port}/health")["status"] == "ok":
                    break
            except OSError:
                pass
            check(time.monotonic() < deadline, "the leader never answered /health")
            check(all(p.poll() is None for p in pods), "a pod's command exited")
            time.sleep(0.2)
        done = get(f"http://127.0.0.1:{port}/v1/completions",
                   {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0})
        check(done["usage"]["completion_tokens"] == 8, done)
        state = get(f"http://127.0.0.1:{port}/ui/state")
        check(len(state["ranks"]) == 4 and state["plan"].startswith("tp2 pp2"), state["plan"])
        print(f"LWS script on one host: leader serves ({state['plan']}): {done['choices'][0]['text']!r}")
    finally:
        for p in pods:  # the leader (the front) first, then the other node
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                print(p.stdout.read())


def main():
    tessera, model = sys.argv[1:3]
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    flags = serve_flags(tessera)
    check("--no-ui" in flags and "--rdzv" in flags, "cannot read `tessera serve --help`")
    files = sorted(glob.glob(os.path.join(root, "deploy", "k8s", "*.yaml")))
    check(files, "no manifests in deploy/k8s")
    lws_script = None
    for path in files:
        name = os.path.basename(path)
        docs = [d for d in yaml.safe_load_all(open(path)) if d is not None]
        pods = {}  # labels of each workload's serving pods
        services = []
        for doc in docs:
            key = (doc.get("apiVersion"), doc.get("kind"))
            check(key in SCHEMAS, f"{name}: unknown kind {key}")
            jsonschema.validate(doc, {"type": "object", "required": ["metadata"],
                                      "properties": {"metadata": META}})
            jsonschema.validate(doc, SCHEMAS[key])
            where = f"{name}: {key[1]} {doc['metadata']['name']}"
            if key[1] == "Deployment":
                template = doc["spec"]["template"]
                sel = doc["spec"]["selector"]["matchLabels"]
                check(sel.items() <= template["metadata"]["labels"].items(),
                      f"{where}: selector does not match the pod labels")
                check(check_pod(where, template, flags) is not None, f"{where}: no http port")
                pods[where] = template["metadata"]["labels"]
            elif key[1] == "LeaderWorkerSet":
                lwt = doc["spec"]["leaderWorkerTemplate"]
                script = next(d for d in docs if d["kind"] == "ConfigMap")["data"]["run.sh"]
                script_flags = re.findall(r"(--[a-z][a-z0-9-]*)", script)
                check(check_pod(where + " leader", lwt["leaderTemplate"], flags, script_flags),
                      f"{where}: the leader serves no http port")
                check_pod(where + " worker", lwt["workerTemplate"], flags, script_flags)
                # What the Service may select: LWS's labels on the leader (index 0).
                pods[where] = dict(lwt["leaderTemplate"]["metadata"]["labels"], **{
                    "leaderworkerset.sigs.k8s.io/name": doc["metadata"]["name"],
                    "leaderworkerset.sigs.k8s.io/worker-index": "0"})
                lws_script = script
                # The rendezvous host: the last worker's DNS name (LWS names pods
                # <name>-<group>-<index> under the leader's subdomain).
                out = subprocess.run(
                    ["sh", "-c", script.replace('exec "${TESSERA_BIN', 'echo "${TESSERA_BIN')],
                    env=dict(os.environ, LWS_GROUP_SIZE="3", LWS_WORKER_INDEX="1",
                             LWS_LEADER_ADDRESS="tessera-4.tessera.ns.svc.cluster.local",
                             TESSERA_MODEL="m", TESSERA_THREADS="1"),
                    capture_output=True, text=True, check=True).stdout
                check("--node-rank 1 " in out and
                      "--rdzv tessera-4-2.tessera.ns.svc.cluster.local:29500" in out, out)
            elif key[1] == "Service":
                services.append((where, doc))
        for where, svc in services:
            matched = [w for w, labels in pods.items()
                       if svc["spec"]["selector"].items() <= labels.items()]
            check(matched, f"{where}: selects no pod of {name}")
            for port in svc["spec"]["ports"]:
                check(port.get("targetPort") in ("http", 8000), f"{where}: targetPort {port}")
        print(f"{name}: {len(docs)} documents valid")
    check(lws_script is not None, "no LeaderWorkerSet manifest")
    if os.path.exists(model):
        run_lws_script(lws_script, tessera, model)
    else:
        print(f"no {model}: the LWS script was not run")
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
