"""`mbuild inspect BUILD_DIR`: the gate's verdict in words, and each layer named by what made it."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from builder.cli import cli
from builder.image.push import record_image
from builder.oci.layout import Layout, canonical
from builder.oci.media import OCI_CONFIG, OCI_LAYER, OCI_MANIFEST
from runtimes.bundle.codec import write_contract
from tests.support.bundles import encoder_report
from tests.support.oci_images import PYTHON_BIN, gzip_layer, sha, tar_bytes

TAG = "mbuild/tiny:sha-0123456789ab"


def _build_dir(root: Path) -> Path:
    """A build directory whose oci/ image has two base layers without history and one mbuild layer with it."""
    files = [PYTHON_BIN, {"etc/os-release": b"ID=test"}, {"opt/mbuild/app/x.py": b"pass"}]
    gz = [gzip_layer(f) for f in files]
    # Base images often record fewer history entries than layers; mbuild's own come last.
    labels = {"dev.mbuild.engine": "onnxruntime"}
    config = canonical({"architecture": "amd64", "os": "linux", "config": {"Labels": labels},
                        "rootfs": {"type": "layers", "diff_ids": [sha(tar_bytes(f)) for f in files]},
                        "history": [{"created_by": "mbuild 0: COPY app /opt/mbuild/app"}]})
    layout = Layout(root / "oci")
    layers = [layout.put_bytes(g, OCI_LAYER).to_dict() for g in gz]
    manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                "config": layout.put_bytes(config, OCI_CONFIG).to_dict(), "layers": layers}
    layout.write_index(layout.put_bytes(canonical(manifest), OCI_MANIFEST), TAG)
    (root / "plan.json").write_text(json.dumps({"tag": TAG}))
    write_contract(root / "report.json", encoder_report(False, "min cosine 0.41 (tolerance 0.99)"))
    record_image(root, "oci", TAG, "sha256:" + "0" * 64, None)
    return root


def test_inspect_says_the_verdict_and_names_layers_from_the_top(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["inspect", str(_build_dir(tmp_path))])
    assert result.exit_code == 0, result.output
    assert "validation  FAILED: min cosine 0.41 (tolerance 0.99)" in result.output
    assert "{" not in result.output.split("validation", 1)[1].splitlines()[0]  # not a raw dict
    layer_lines = [line for line in result.output.splitlines() if "kB" in line and "total" not in line]
    assert len(layer_lines) == 3
    assert "COPY app /opt/mbuild/app" in layer_lines[2]
    assert all("(no history recorded)" in line for line in layer_lines[:2])
