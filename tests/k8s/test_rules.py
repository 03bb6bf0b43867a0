"""The semantic rules an API server enforces beyond the JSON schema (thicket.k8s.rules): every
rendered and kustomized object passes them, and each rule catches the mistake it is for."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.manifests import SWEEPS, kustomize_objects, rollout, spec_with, variant_specs
from thicket.k8s.render import render
from thicket.k8s.rules import check_object, check_objects, security_problems
from thicket.spec import load_spec



def all_rendered():
    objects = [o for path in SWEEPS for o in render(load_spec(path))]
    return objects + [o for s in variant_specs().values() for o in render(s)]


def test_rendered_and_kustomized_objects_break_no_rule():
    assert check_objects(all_rendered()) == []
    assert check_objects(kustomize_objects() + kustomize_objects("k8s/examples")) == []


def test_rendered_jobs_follow_thickets_security_policy():
    for obj in all_rendered():
        assert security_problems(obj) == [], obj["metadata"]["name"]


@pytest.fixture()
def job() -> dict:
    return copy.deepcopy(rollout(render(spec_with())))


def pod(job: dict) -> dict:
    return job["spec"]["template"]["spec"]


def container(job: dict, name: str) -> dict:
    return next(c for c in pod(job).get("initContainers", []) + pod(job)["containers"] if c["name"] == name)


def set_(path: str, value) -> Callable[[dict], None]:
    def apply(obj: dict) -> None:
        *parents, last = path.split(".")
        node = obj
        for key in parents:
            node = node[int(key)] if key.isdigit() else node[key]
        if value is DELETE:
            del node[last]
        else:
            node[last] = value
    return apply


DELETE = object()


MUTATIONS: dict[str, tuple[Callable[[dict], None], str]] = {
    "job restartPolicy Always": (set_("spec.template.spec.restartPolicy", "Always"), "a Job's pods need Never or OnFailure"),
    "Indexed without completions": (set_("spec.completions", DELETE), "spec.completions: required when completionMode is Indexed"),
    "per-index backoff with OnFailure": (set_("spec.template.spec.restartPolicy", "OnFailure"), "backoffLimitPerIndex: requires the pod template's restartPolicy Never"),
    "per-index backoff, NonIndexed": (set_("spec.completionMode", "NonIndexed"), "backoffLimitPerIndex: requires completionMode Indexed"),
    "completionMode enum": (set_("spec.completionMode", "Parallel"), "unsupported value 'Parallel'"),
    "maxFailedIndexes above completions": (set_("spec.maxFailedIndexes", 1000), "maxFailedIndexes: must be <= completions"),
    "maxFailedIndexes without per-index backoff": (
        lambda j: (j["spec"].update(maxFailedIndexes=1), j["spec"].pop("backoffLimitPerIndex")), "maxFailedIndexes: requires backoffLimitPerIndex"),
    "FailIndex without per-index backoff": (set_("spec.backoffLimitPerIndex", DELETE), "FailIndex requires backoffLimitPerIndex"),
    "exit-code rule on an unknown container": (set_("spec.podFailurePolicy.rules.1.onExitCodes.containerName", "main"), "'main' is not a container"),
    "exit code 0 with In": (set_("spec.podFailurePolicy.rules.1.onExitCodes.values", [0, 2]), "0 is not allowed with operator In"),
    "unsorted exit codes": (set_("spec.podFailurePolicy.rules.1.onExitCodes.values", [3, 2]), "must be unique and sorted"),
    "failure action enum": (set_("spec.podFailurePolicy.rules.0.action", "Retry"), "unsupported value 'Retry'"),
    "podReplacementPolicy with a failure policy": (set_("spec.podReplacementPolicy", "TerminatingOrFailed"), "must be Failed when podFailurePolicy is set"),
    "Indexed Job name too long for pod hostnames": (set_("metadata.name", "j" * 62), "pod hostname"),
    "Job name not a DNS label": (set_("metadata.name", "Rollout_1"), "must be a DNS-1123 label"),
    "duplicate container names": (lambda j: container(j, "env-textcraft").update(name="worker"), "duplicate container name 'worker'"),
    "restartPolicy on a main container": (lambda j: container(j, "worker").update(restartPolicy="Always"), "only init containers (native sidecars) may set restartPolicy"),
    "init restartPolicy other than Always": (lambda j: container(j, "vllm").update(restartPolicy="OnFailure"), "may only be Always"),
    "probes on a plain init container": (lambda j: container(j, "vllm").pop("restartPolicy"), "only native sidecars"),
    "GPU request differs from limit": (lambda j: container(j, "vllm")["resources"]["requests"].update({"nvidia.com/gpu": "2"}), "request must equal its limit"),
    "fractional GPU": (lambda j: [container(j, "vllm")["resources"][s].update({"nvidia.com/gpu": "0.5"}) for s in ("limits", "requests")], "must be a whole number"),
    "GPU only in requests": (lambda j: container(j, "vllm")["resources"]["limits"].pop("nvidia.com/gpu"), "must be set in limits"),
    "memory request above limit": (lambda j: container(j, "worker")["resources"]["requests"].update(memory="64Gi"), "must be <= the limit"),
    "bad quantity": (lambda j: container(j, "worker")["resources"]["requests"].update(cpu="two"), "is not a Kubernetes quantity"),
    "imagePullPolicy enum": (lambda j: container(j, "worker").update(imagePullPolicy="Sometimes"), "unsupported value 'Sometimes'"),
    "protocol enum": (lambda j: container(j, "worker")["ports"][0].update(protocol="HTTP"), "unsupported value 'HTTP'"),
    "duplicate port names across containers": (lambda j: container(j, "env-textcraft").update(ports=[{"name": "metrics", "containerPort": 8100, "protocol": "TCP"}]), "port name 'metrics' is already used"),
    "duplicate port numbers in the pod": (lambda j: container(j, "env-textcraft").update(ports=[{"name": "env", "containerPort": 9090, "protocol": "TCP"}]), "port 9090/TCP is already used"),
    "port name too long": (lambda j: container(j, "worker")["ports"][0].update(name="metrics-prometheus"), "must be an IANA service name"),
    "probe on an unknown named port": (lambda j: container(j, "worker").update(readinessProbe={"httpGet": {"path": "/metrics", "port": "http"}}), "named port 'http' is not a port of this container"),
    "startup probe successThreshold": (lambda j: container(j, "vllm").update(startupProbe={"exec": {"command": ["true"]}, "successThreshold": 2}), "must be 1 for liveness and startup probes"),
    "two probe handlers": (lambda j: container(j, "vllm")["readinessProbe"].update(tcpSocket={"port": 8000}), "exactly one handler"),
    "invalid env var name": (lambda j: container(j, "worker")["env"].append({"name": "1BAD=", "value": "x"}), "is not a valid environment variable name"),
    "duplicate env var": (lambda j: container(j, "worker")["env"].append({"name": "HOME", "value": "/"}), "duplicate environment variable 'HOME'"),
    "value and valueFrom": (lambda j: container(j, "worker")["env"][-1].update(value="x"), "value and valueFrom are exclusive"),
    "secretKeyRef without key": (lambda j: container(j, "worker")["env"][-1]["valueFrom"]["secretKeyRef"].pop("key"), "name and key are required"),
    "mount of an undefined volume": (lambda j: container(j, "worker")["volumeMounts"].append({"name": "cache", "mountPath": "/cache"}), "volume 'cache' is not defined"),
    "same path mounted twice": (lambda j: container(j, "worker")["volumeMounts"].append({"name": "tmp", "mountPath": "/tmp"}), "is mounted twice"),
    "duplicate volumes": (lambda j: pod(j)["volumes"].append({"name": "tmp", "emptyDir": {}}), "duplicate volume 'tmp'"),
    "volume with two sources": (lambda j: pod(j)["volumes"][1].update(configMap={"name": "x"}), "exactly one volume source"),
    "emptyDir medium enum": (lambda j: pod(j)["volumes"][1]["emptyDir"].update(medium="Disk"), "unsupported value 'Disk'"),
    "label value too long": (lambda j: j["metadata"]["labels"].update({"thicket.dev/sweep": "x" * 64}), "invalid label value"),
    "label key invalid": (lambda j: j["metadata"]["labels"].update({"bad key": "x"}), "invalid label key"),
    "toleration Exists with a value": (lambda j: pod(j).update(tolerations=[{"key": "a", "operator": "Exists", "value": "b"}]), "must be empty when operator is Exists"),
    "toleration seconds without NoExecute": (lambda j: pod(j).update(tolerations=[{"key": "a", "operator": "Exists", "effect": "NoSchedule", "tolerationSeconds": 5}]), "must be NoExecute"),
    "toleration without key": (lambda j: pod(j).update(tolerations=[{"operator": "Equal", "value": "b"}]), "must be Exists when key is empty"),
    "seccomp Localhost without a profile": (lambda j: pod(j)["securityContext"].update(seccompProfile={"type": "Localhost"}), "localhostProfile is required"),
    "no privilege escalation but privileged": (lambda j: container(j, "worker")["securityContext"].update(privileged=True), "cannot set allowPrivilegeEscalation false and privileged true"),
    "runAsNonRoot as root": (lambda j: pod(j)["securityContext"].update(runAsUser=0), "runAsNonRoot with runAsUser 0"),
    "nodeSelector value invalid": (lambda j: pod(j).update(nodeSelector={"pool": "gpu pool"}), "invalid label key or value"),
    "namespace not a DNS label": (set_("metadata.namespace", "Roll.outs"), "must be a DNS-1123 label"),
}


@pytest.mark.parametrize("name", MUTATIONS)
def test_each_rule_catches_its_mistake(job, name):
    mutate, expected = MUTATIONS[name]
    assert check_object(job) == []
    mutate(job)
    problems = check_object(job)
    assert any(expected in p for p in problems), problems


def test_rules_for_rbac_configmaps_and_pvcs():
    objects = {o["kind"]: copy.deepcopy(o) for o in render(spec_with())}
    binding = objects["RoleBinding"]
    binding["roleRef"]["kind"] = "Group"
    binding["subjects"][0]["kind"] = "Robot"
    problems = check_object(binding)
    assert any("roleRef.kind" in p for p in problems) and any("subjects[0].kind" in p for p in problems)
    config = objects["ConfigMap"]
    config["data"]["bad key/"] = "x"
    assert any("keys may hold only" in p for p in check_object(config))
    config["data"] = {"big": "x" * (1024 * 1024 + 1)}
    assert any("at most 1 MiB" in p for p in check_object(config))
    pvc = next(o for o in kustomize_objects("k8s/examples") if o["kind"] == "PersistentVolumeClaim")
    pvc["spec"]["accessModes"] = ["ReadWriteSometimes"]
    del pvc["spec"]["resources"]
    problems = check_object(pvc)
    assert any("accessModes[0]" in p for p in problems) and any("storage: required" in p for p in problems)
    assert check_objects([objects["Role"], objects["Role"]]) == ["Role/tc-aggregate: duplicate object"]


def test_security_policy_flags_a_writable_root_or_escalation(job):
    container(job, "worker")["securityContext"]["readOnlyRootFilesystem"] = False
    container(job, "env-textcraft")["securityContext"]["allowPrivilegeEscalation"] = True
    pod(job)["securityContext"]["runAsNonRoot"] = False
    for c in pod(job)["initContainers"] + pod(job)["containers"]:
        c["securityContext"].pop("runAsNonRoot", None)
    problems = "\n".join(security_problems(job))
    assert "worker: readOnlyRootFilesystem must be true" in problems
    assert "env-textcraft: allowPrivilegeEscalation must be false" in problems
    assert "runAsNonRoot must be true" in problems


def test_the_rules_module_is_pure_python(tmp_path: Path):
    """render() runs the rules on every call: they must stay cheap, loading no schema (that is
    kubernetes-validate's, which the tests run on rendered objects)."""
    import subprocess
    import sys

    probe = ("import sys; from tests.support.manifests import spec_with; from thicket.k8s.render import render; "
             "from thicket.k8s.rules import check_objects; check_objects(render(spec_with(), check=False)); "
             "print(sorted(m for m in sys.modules if m.split('.')[0] in ('kubernetes_validate', 'jsonschema')))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
