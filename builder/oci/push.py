"""Push an OCI layout's image to a registry with the built-in client: the digest stays as built."""

from __future__ import annotations

from pathlib import Path

from builder.oci.layout import Descriptor, Layout
from builder.oci.refs import ImageRef
from builder.oci.registry import Registry


def push_layout(layout_dir: Path, tag: str | None, destination: ImageRef) -> tuple[str, str]:
    """Upload blobs then the manifest, byte for byte; returns (local digest, digest the registry reports)."""
    layout = Layout(layout_dir)
    desc, manifest = layout.manifest(tag)
    with Registry(destination) as registry:
        for blob in [manifest["config"], *manifest["layers"]]:
            digest = Descriptor.from_dict(blob, f"{layout_dir}: manifest").digest
            registry.push_blob(layout.verified_blob(digest), digest)
        data = layout.verified_blob(desc.digest).read_bytes()
        pushed = registry.put_manifest(destination.reference, data, desc.media_type)
    return desc.digest, pushed


def remote_digest(destination: ImageRef) -> str:
    """What the registry now serves under the tag: read back, never trusted from the upload."""
    with Registry(destination) as registry:
        return registry.get_manifest(destination.reference)[2]
