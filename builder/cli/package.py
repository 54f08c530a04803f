"""`mbuild package MODEL`: the main job."""

from __future__ import annotations

from pathlib import Path

import click
from huggingface_hub.utils import disable_progress_bars
from rich.table import Table

from builder.build.pipeline import PackageResult
from builder.build.pipeline import package as run_package
from builder.build.plan_package import PackageOptions
from builder.cli.options import draft_option, extras_option, model_impl_option, target_options
from builder.image import CHOICES
from builder.image.oci import LAYOUT_DIR
from builder.progress import Reporter
from runtimes.settings import PORT


def _run_hint(result: PackageResult) -> str:
    """How to start the image from where it now is: only docker and podman hold it under its tag."""
    tag = result.plan.tag
    if result.image is not None and result.image.backend == "oci":  # in an OCI layout, not in any engine yet
        return (f"run it:  mbuild load {result.build_dir} && podman run --rm -p {PORT}:{PORT} {tag}"
                f"\n         (`mbuild load --into docker` for docker; the layout: {result.build_dir / LAYOUT_DIR};"
                f" or push it: mbuild push {result.build_dir} REGISTRY/REPO:TAG)")
    tool = "docker" if result.image is not None and result.image.backend == "docker" else "podman"
    return f"run it:  {tool} run --rm -p {PORT}:{PORT} {tag}"


def _summary(result: PackageResult, reporter: Reporter) -> None:
    table = Table(show_header=False, box=None, pad_edge=False)
    image = result.image
    table.add_row("image", result.plan.tag if image else f"{result.plan.tag} (not built: {result.backend_note})")
    if image:
        table.add_row("image id", f"{image.image_id}" + (" (reused)" if image.reused else ""))
        if image.digest:
            table.add_row("digest", image.digest)
        if image.size_bytes:
            table.add_row("image size", f"{image.size_bytes / 1e6:.0f} MB")
        for made, size in image.layers:
            table.add_row("  layer", f"{size / 1e6:9.1f} MB  {made}")
    if result.pushed:
        table.add_row("pushed", f"{result.pushed.destination}@{result.pushed.digest} ({result.pushed.tool})")
    table.add_row("build dir", str(result.build_dir))
    table.add_row("profile", f"{result.plan.profile.name} ({result.plan.profile.id[:12]})")
    if result.plan.export_path:
        table.add_row("path", result.plan.export_path)
    report = result.report
    if report:
        table.add_row("validation", report.verdict)
    else:
        table.add_row("validation", "not run (--plan-only)")
    table.add_row("time", ", ".join(f"{k} {v:.1f}s" for k, v in result.timings.items())
                  + f" (total {sum(result.timings.values()):.1f}s)")
    reporter.console.print(table)
    if image:
        reporter.console.print(_run_hint(result))
    if report:
        reporter.console.print(f"serve it here:  mbuild serve {result.build_dir}")


@click.command()
@click.argument("model")
@target_options
@click.option("--output", "-o", type=click.Path(path_type=Path, file_okay=False),
              help="Build directory (default: mbuild-builds/<name>-<version>).")
@click.option("--force", is_flag=True, help="Build into a non-empty --output folder mbuild did not make; its files "
              "are kept, and mbuild refuses if one of its own names (model/, work/, ...) is taken there.")
@click.option("--name", help="Image repository name (default: mbuild/<model>).")
@click.option("--version", "version", help="Image version (default: sha-<plan digest>).")
@click.option("--base-image", help="Base image with Python 3.11 (default: the profile's, python:3.11-slim).")
@click.option("--backend", type=click.Choice(CHOICES), default="auto", show_default=True,
              help="Image builder; 'none' stops at the build context.")
@click.option("--format", "image_format", type=click.Choice(["oci", "docker"]), default="oci", show_default=True,
              help="Manifest format the oci backend writes (docker = v2s2, whose HEALTHCHECK podman honours).")
@draft_option
@extras_option
@model_impl_option
@click.option("--push", "push_to", metavar="REGISTRY/REPO[:TAG]", help="Push the image there after building.")
@click.option("--plan-only", is_flag=True, help="Write the build context's Dockerfile, image spec, plan and TensorRT "
              "settings; download, export and build nothing.")
@click.option("--quiet", "-q", is_flag=True, help="No progress output; print only the image tag.")
def package(model: str, gpu: str | None, profile: str | None, precision: str | None, mode: str | None,
            offline: bool, output: Path | None, force: bool, name: str | None, version: str | None,
            base_image: str | None, backend: str, image_format: str, draft: str | None, extras: tuple[str, ...],
            model_impl: str, push_to: str | None, plan_only: bool, quiet: bool) -> None:
    """Package MODEL (alias, org/name[@rev], hf://org/name@rev or ./folder) into a serving image."""
    if quiet:
        disable_progress_bars()
    reporter = Reporter(quiet=quiet)
    options = PackageOptions(model=model, gpu=gpu, output=output, name=name, version=version,
                             base_image=base_image, backend=backend, offline=offline, profile=profile,
                             precision=precision, mode=mode, image_format=image_format,  # type: ignore[arg-type]
                             push=push_to, plan_only=plan_only, force=force, draft=draft,
                             extras=tuple(dict.fromkeys(extras)), model_impl=model_impl)
    result = run_package(options, reporter)
    if quiet:
        click.echo(result.plan.tag if result.image else str(result.build_dir))
    else:
        _summary(result, reporter)
