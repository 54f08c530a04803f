"""`mbuild deploy`: Kubernetes manifests for a build, written from its plan and image."""

from __future__ import annotations

from pathlib import Path

import click
import yaml

from builder.benchmark.sizing import sizing_from_options
from builder.cli.options import sizing_options
from builder.deploy import inputs
from builder.deploy.dynamo import graph_deployment
from builder.deploy.helm import write_chart
from builder.deploy.k8s import manifests
from builder.deploy.kserve import inference_service
from builder.deploy.spec import load_spec
from builder.errors import InputError, OutputUnusable
from builder.serving import ROUTERS


@click.command()
@click.argument("source")
@click.option("--format", "fmt", type=click.Choice(["k8s", "helm", "kserve", "dynamo"]), default="k8s",
              show_default=True,
              help="k8s: Deployment, Service, PodDisruptionBudget, HorizontalPodAutoscaler, ServiceMonitor. "
                   "helm: a chart of those (and an optional Ingress and Secret) with values.yaml, in a folder. "
                   "kserve: an InferenceService (RawDeployment, a custom predictor running the image). "
                   "dynamo: a DynamoGraphDeployment for NVIDIA Dynamo's operator: its frontend and router before "
                   "--replicas workers (an image packaged --with dynamo; language models).")
@click.option("--image", help="The image as the cluster pulls it (default: the build's, by digest).")
@click.option("--name", help="The objects' name (default: the image's name).")
@click.option("--namespace", help="The namespace to write into the objects (default: none, kubectl's).")
@click.option("--replicas", type=click.IntRange(1, 1000), default=None,
              help="Replicas at first (default: --min-replicas).")
@click.option("--min-replicas", type=click.IntRange(1, 1000), default=None,
              help="The autoscaler's floor (default 1, or what --bench sizing says).")
@click.option("--max-replicas", type=click.IntRange(1, 1000), default=None,
              help="The autoscaler's ceiling (default 4, or what --bench sizing says).")
@click.option("--api-key-secret", default=None,
              help="The Secret whose 'api-key' becomes MBUILD_API_KEY (default: NAME-api-key; optional).")
@click.option("--router", type=click.Choice(ROUTERS), default="kv", show_default=True,
              help="dynamo: how the frontend picks a worker (kv: the one whose cache holds most of the prompt).")
@click.option("--prefill-workers", type=click.IntRange(0, 1000), default=0, show_default=True,
              help="dynamo: this many workers only prefill, handing the KV to the --replicas others, which only "
                   "decode.")
@click.option("--output", "-o", type=click.Path(path_type=Path),
              help="k8s, kserve, dynamo: a file (default: standard output). helm: the chart's folder "
                   "(default: ./NAME).")
@sizing_options
def deploy(source: str, fmt: str, image: str | None, name: str | None, namespace: str | None,
           replicas: int | None, min_replicas: int | None, max_replicas: int | None, api_key_secret: str | None,
           router: str, prefill_workers: int, output: Path | None, bench_result: Path | None,
           tokens_per_day: int | None, slo: str | None, slo_percentile: str, peak_factor: float) -> None:
    """Write Kubernetes manifests, a Helm chart or a KServe InferenceService for SOURCE: a build directory, a
    plan saved from `mbuild plan --json`, or an image mbuild built (REGISTRY/NAME[:TAG|@DIGEST], a docker or
    podman image, oci:DIR[:TAG]).

    The image goes by digest; memory, GPUs and the GPU's compute capability come from the profile; the probes,
    the drain and the autoscaling metrics from the runtime's routes. With --bench, --tokens-per-day and --slo the
    replica range is sized from a measured sweep, the arithmetic printed.
    """
    sized = any(value is not None for value in (bench_result, tokens_per_day, slo))
    if not sized:  # the cheap checks before reading anything
        min_replicas, max_replicas = min_replicas or 1, max_replicas or 4
        inputs.check_options(name, namespace, api_key_secret, replicas, min_replicas, max_replicas)
    if output is not None and fmt != "helm" and output.is_dir():
        raise InputError(f"-o {output} is a folder; --format {fmt} writes one file",
                         hint=f"give the file to write, e.g. -o {output / (fmt + '.yaml')}")
    if prefill_workers and fmt != "dynamo":
        raise InputError("--prefill-workers splits a Dynamo graph; the other formats run whole replicas",
                         hint="add --format dynamo, or leave --prefill-workers out")
    spec = load_spec(source, image, name, namespace)
    sizing = sizing_from_options(bench_result, tokens_per_day, slo, int(slo_percentile), peak_factor,
                                 spec.profile_id)
    if sizing is not None:
        if min_replicas is not None or max_replicas is not None:
            raise InputError("--min-replicas/--max-replicas and --bench sizing both set the replicas",
                             hint="give one or the other")
        min_replicas, max_replicas = sizing.min_replicas, sizing.max_replicas
        inputs.check_options(name, namespace, api_key_secret, replicas, min_replicas, max_replicas)
        for line in sizing.lines():
            click.echo(f"sizing: {line}", err=True)
    assert min_replicas is not None and max_replicas is not None
    if name is None:
        inputs.object_name(spec.name, given=False)  # the image's name may start with a digit
    scale = (replicas or min_replicas, min_replicas, max_replicas, api_key_secret or f"{spec.name}-api-key")
    if fmt == "helm":
        folder = output or Path(spec.name)
        files = write_chart(spec, folder, *scale)
        click.echo(f"wrote a chart of {len(files)} files for {spec.image} to {folder}/\n"
                   f"  helm install {spec.name} {folder} --namespace NAMESPACE", err=True)
        return
    replicas_, _, _, secret = scale
    objects = [inference_service(spec, *scale[1:])] if fmt == "kserve" else \
        [graph_deployment(spec, replicas_, router, secret, prefill_workers)] if fmt == "dynamo" else \
        manifests(spec, *scale)
    text = yaml.safe_dump_all(objects, sort_keys=False, default_flow_style=False)
    if output is None:
        click.echo(text, nl=False)
        return
    try:
        output.write_text(text)
    except OSError as exc:
        raise OutputUnusable(f"cannot write {output}: {exc.strerror or exc}",
                             hint="give -o a file in a folder you can write") from exc
    click.echo(f"wrote {len(objects)} objects for {spec.image} to {output}", err=True)
