"""Media types of the two manifest formats registries accept, and their mapping."""

from __future__ import annotations

from typing import Literal

Format = Literal["oci", "docker"]

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
OCI_LAYER_TAR = "application/vnd.oci.image.layer.v1.tar"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
DOCKER_LAYER = "application/vnd.docker.image.rootfs.diff.tar.gzip"

MANIFEST = {"oci": OCI_MANIFEST, "docker": DOCKER_MANIFEST}
CONFIG = {"oci": OCI_CONFIG, "docker": DOCKER_CONFIG}
LAYER = {"oci": OCI_LAYER, "docker": DOCKER_LAYER}
INDEXES = (OCI_INDEX, DOCKER_LIST)
MANIFESTS = (OCI_MANIFEST, DOCKER_MANIFEST)
GZIP_LAYERS = (OCI_LAYER, DOCKER_LAYER)
ACCEPT = ", ".join([OCI_MANIFEST, DOCKER_MANIFEST, OCI_INDEX, DOCKER_LIST])
