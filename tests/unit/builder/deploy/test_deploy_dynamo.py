"""`mbuild deploy --format dynamo`: the DynamoGraphDeployment validates with zero errors against the operator's CRD
schema (tests/unit/fixtures/dynamo-graphdeployment-v1alpha1.json, whose .md says where it comes from; its pod parts
checked against Kubernetes' own strict schemas), kubectl reads it, golden files pin it, and its services run the
image's frontend and workers with the k8s format's resources, security and GPUs. An image without Dynamo and an
embedding model are refused with the way out."""

from __future__ import annotations

from pathlib import Path

import jsonschema
import pytest
import yaml
from click.testing import CliRunner

from builder.cli import cli as main_cli
from tests.support.deploy_cases import (
    Deployed,
    assert_each_refused,
    assert_valid,
    cli,
    crd_validator,
    deployed_beside_k8s,
    image_for,
    kubectl_reads,
    schema_errors,
)
from tests.support.golden import assert_golden
from tests.support.hosts import CPU_FLAGS, pin_cpu_host

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "dynamo-graphdeployment-v1alpha1.json"
CASES = {"llama-8b-cpu": ("llama-3.1-8b", "cpu"), "llama-8b-h100x2": ("llama-3.1-8b", "h100x2")}


def plan_with(folder: Path, model: str, gpu: str, *extra: str) -> Path:
    """The plan, made in this process on a pinned host (an AVX-512 VNNI CPU): `--gpu cpu` plans for the host's own
    CPU class, which would make the golden graph the machine's, not the code's."""
    with pytest.MonkeyPatch.context() as patch:
        pin_cpu_host(patch, CPU_FLAGS | {"avx512_vnni"})
        plan = CliRunner().invoke(main_cli, ["plan", model, "--gpu", gpu, *extra, "--json"])
    assert plan.exit_code == 0, plan.output
    path = folder / "plan.json"
    path.write_text(plan.stdout)
    return path


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft202012Validator:
    return crd_validator(FIXTURE)


@pytest.fixture(scope="module", params=list(CASES))
def deployed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
             ) -> Deployed:
    model, gpu = CASES[request.param]
    plan = plan_with(tmp_path_factory.mktemp("dynamo"), model, gpu, "--with", "dynamo")
    image = ("--image", image_for("llama-8b-h100x2"), "--namespace", "models")
    return request.param, *deployed_beside_k8s(plan, "dynamo", "--replicas", "3", *image)


def test_the_graph_validates_against_the_operators_crd(
        validator: jsonschema.Draft202012Validator, deployed: Deployed) -> None:
    assert_valid(validator, deployed[2], "nvidia.com/v1alpha1", "DynamoGraphDeployment")


def test_the_schema_refuses_what_the_operator_would(
        validator: jsonschema.Draft202012Validator, deployed: Deployed) -> None:
    """The check can fail: each of these is refused, down into the pod's Kubernetes types."""
    _, _, graph, _ = deployed
    breakages = {
        "an unknown service field": lambda o: o["spec"]["services"]["MbuildWorker"].update(workers=2),
        "replicas as text": lambda o: o["spec"]["services"]["MbuildWorker"].update(replicas="2"),
        "a GPU count as a number": lambda o: o["spec"]["services"]["MbuildWorker"]["resources"]["limits"].update(
            gpu=1),
        "a probe with a typo": lambda o: o["spec"]["services"]["Frontend"]["readinessProbe"].update(periodSecond=5),
        "a main container with a typo": lambda o: o["spec"]["services"]["Frontend"]["extraPodSpec"][
            "mainContainer"].update(imag="x"),
        "an env without a name": lambda o: o["spec"]["services"]["MbuildWorker"]["envs"].append({"value": "1"}),
        "no spec": lambda o: o.pop("spec"),
    }
    assert_each_refused(validator, graph, breakages)


def test_kubectl_reads_it(deployed: Deployed, tmp_path: Path) -> None:
    _, text, graph, _ = deployed
    assert kubectl_reads(text, tmp_path) == [f"dynamographdeployment.nvidia.com/{graph['metadata']['name']}"]


def test_the_golden_graph(deployed: Deployed) -> None:
    case, text, _, _ = deployed
    assert_golden(f"deploy/{case}.dynamo.yaml", text)


def test_it_runs_the_images_frontend_and_workers_as_the_k8s_format_runs_its_pod(
        deployed: Deployed) -> None:
    case, _, graph, deployment = deployed
    services = graph["spec"]["services"]
    front, worker = services["Frontend"], services["MbuildWorker"]
    assert (front["componentType"], worker["componentType"], worker["replicas"]) == ("frontend", "worker", 3)
    (theirs,) = deployment["spec"]["template"]["spec"]["containers"]
    pod = deployment["spec"]["template"]["spec"]
    for service, module in ((front, "runtimes.dynamo.frontend"), (worker, "runtimes.dynamo")):
        main = service["extraPodSpec"]["mainContainer"]
        assert main["image"] == theirs["image"] and main["command"] == ["python3"]
        assert main["args"][:2] == ["-m", module]
        # discovery by the operator's Kubernetes backend, in the graph's own Dynamo namespace; no etcd, no NATS
        assert "--discovery-backend kubernetes" in " ".join(main["args"])
        assert "--namespace $(DYN_NAMESPACE)" in " ".join(main["args"]) and "nats" not in main["args"]
        assert main["securityContext"] == theirs["securityContext"] and main["volumeMounts"] == theirs["volumeMounts"]
        for key in ("securityContext", "volumes"):
            assert service["extraPodSpec"][key] == pod[key], key
    for key in ("nodeSelector", "tolerations"):  # the workers go where the k8s format's pods go; the frontend anywhere
        assert worker["extraPodSpec"].get(key) == pod.get(key) and key not in front["extraPodSpec"], key
    assert "--router-mode kv" in " ".join(front["extraPodSpec"]["mainContainer"]["args"])
    # the worker's memory and GPUs are the k8s format's (the CRD writes quantities as strings)
    limits = theirs["resources"]["limits"]
    assert worker["resources"]["limits"]["memory"] == limits["memory"]
    assert worker["resources"]["limits"].get("gpu") == (str(limits["nvidia.com/gpu"]) if case.endswith("x2") else None)
    # health from the worker's status server, as the image's HEALTHCHECK asks it (DYN_SYSTEM_PORT)
    assert {"name": "DYN_SYSTEM_PORT", "value": "9090"} in worker["envs"]
    assert worker["readinessProbe"]["httpGet"] == {"path": "/health", "port": "system"}


def test_round_robin_is_a_choice(tmp_path: Path) -> None:
    plan = plan_with(tmp_path, "llama-3.1-8b", "cpu", "--with", "dynamo")
    result = cli("deploy", str(plan), "--format", "dynamo", "--router", "round-robin")
    assert result.returncode == 0, result.stderr
    args = yaml.safe_load(result.stdout)["spec"]["services"]["Frontend"]["extraPodSpec"]["mainContainer"]["args"]
    assert "--router-mode round-robin" in " ".join(args)


@pytest.mark.parametrize(("model", "extra", "said"), [
    ("llama-3.1-8b", (), "does not carry NVIDIA Dynamo"),
    ("all-minilm-l6-v2", (), "--format dynamo serves language models"),
])
def test_what_dynamo_cannot_run_is_refused_with_the_way_out(tmp_path: Path, model: str, extra: tuple[str, ...],
                                                            said: str) -> None:
    result = cli("deploy", str(plan_with(tmp_path, model, "cpu", *extra)), "--format", "dynamo")
    assert result.returncode == 2 and said in result.stderr and "Traceback" not in result.stderr
    assert result.stdout == ""


def test_prefill_workers_make_a_disaggregated_graph(validator: jsonschema.Draft202012Validator, tmp_path: Path
                                                    ) -> None:
    """--prefill-workers 2 --replicas 3: a prefill service of two and a decode service of three, the prefill pods
    serving their KV on the fixed kv port at their pod IP (expanded by Kubernetes from the downward API)."""
    plan = plan_with(tmp_path, "llama-3.1-8b", "cpu", "--with", "dynamo")
    result = cli("deploy", str(plan), "--format", "dynamo", "--replicas", "3", "--prefill-workers", "2")
    assert result.returncode == 0, result.stderr
    graph = yaml.safe_load(result.stdout)
    assert_valid(validator, graph, "nvidia.com/v1alpha1", "DynamoGraphDeployment")
    services = graph["spec"]["services"]
    prefill, decode = services["MbuildPrefill"], services["MbuildWorker"]
    assert (prefill["componentType"], prefill["replicas"], decode["componentType"], decode["replicas"]) == (
        "prefill", 2, "decode", 3)
    prefill_args = " ".join(prefill["extraPodSpec"]["mainContainer"]["args"])
    assert "--disaggregation-mode prefill --kv-host $(POD_IP) --kv-port 9091" in prefill_args
    assert "--disaggregation-mode decode" in " ".join(decode["extraPodSpec"]["mainContainer"]["args"])
    assert {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}} in prefill["envs"]
    assert {"name": "kv", "containerPort": 9091, "protocol": "TCP"} in prefill["extraPodSpec"]["mainContainer"][
        "ports"]
    other = cli("deploy", str(plan), "--format", "k8s", "--prefill-workers", "1")
    assert other.returncode == 2 and "--prefill-workers splits a Dynamo graph" in other.stderr


def test_the_schema_accepts_the_graphs_nvidia_ships_with_dynamo(validator: jsonschema.Draft202012Validator) -> None:
    """The fixture is a transcription of the operator's Go types (its .md): NVIDIA's own v1alpha1 graphs, shipped in
    the ai-dynamo wheel, must pass it, so it is not stricter than the operator (the refusals above: not laxer)."""
    dynamo = pytest.importorskip("dynamo", reason="the dynamo extra is not installed (tests/run.sh installs it)")
    graphs = [doc for path in sorted(Path(next(iter(dynamo.__path__))).rglob("*.yaml"))
              for doc in yaml.safe_load_all(path.read_text())
              if isinstance(doc, dict) and doc.get("kind") == "DynamoGraphDeployment"
              and doc.get("apiVersion") == "nvidia.com/v1alpha1"]
    assert len(graphs) >= 5  # ai-dynamo 1.6.1 ships 8 (its planner's test and profiling configurations)
    for graph in graphs:
        assert schema_errors(validator, graph) == [], graph["metadata"]["name"]
