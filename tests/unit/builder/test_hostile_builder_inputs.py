"""Hostile inputs to the builder: each is a clear mbuild error, and nothing outside its folder is read or written.

Archives and layouts name files by path and digest, registries name token services, model folders hold links;
none of them is trusted. Every case asserts the error the user sees and that the secret beside the input
(a file outside the folder the input may use) never shows up in mbuild's cache.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
from pathlib import Path

import pytest

from builder.errors import BaseImageError, MbuildError, UnsafeInput
from builder.oci.base import load_base
from builder.oci.basepython import check_python
from builder.oci.registry import trusted_realm
from tests.support.oci_images import (
    PYTHON_BIN,
    docker_archive,
    fake_registry,
    gzip_layer,
    image_docs,
    make_layout,
    sha,
    tar_bytes,
)

SECRET = b"the host's private key, which must never become an image layer\n"


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "mbuild-cache"
    monkeypatch.setenv("MBUILD_CACHE", str(folder))
    for name in ("MBUILD_REGISTRY_USERNAME", "MBUILD_REGISTRY_PASSWORD", "MBUILD_REGISTRY_AUTH_HOSTS",
                 "MBUILD_INSECURE_REGISTRIES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "no-docker-config"))
    return folder


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    path = tmp_path / "outside" / "id_rsa"
    path.parent.mkdir()
    path.write_bytes(SECRET)
    return path


def holds_secret(root: Path) -> bool:
    """Does any file under root hold the secret, raw or as a gzip layer?"""
    for path in (p for p in root.rglob("*") if p.is_file() and not p.is_symlink()) if root.exists() else []:
        data = path.read_bytes()
        if SECRET in data or (data[:2] == b"\x1f\x8b" and SECRET in gzip.decompress(data)):
            return True
    return False


def refused(source: str, error: type[MbuildError] = UnsafeInput) -> MbuildError:
    with pytest.raises(error) as caught:
        load_base(source)
    assert caught.value.message and "Traceback" not in str(caught.value)
    return caught.value


# --- docker-archive: manifest.json and members ------------------------------------------------------------------
def _save(tmp_path: Path, config: str, layers: list[str], links: dict[str, str] | None = None) -> str:
    files = {"config.json": b"{}", "layer.tar": tar_bytes(PYTHON_BIN)}
    archive = docker_archive(tmp_path / "base.tar", [{"Config": config, "Layers": layers}], files, links)
    return f"docker-archive:{archive}"


def test_archive_config_named_by_absolute_path_is_refused(tmp_path: Path, secret: Path, cache: Path) -> None:
    error = refused(_save(tmp_path, str(secret), ["layer.tar"]))
    assert "absolute" in error.message
    assert not holds_secret(cache)


def test_archive_config_leaving_by_dotdot_is_refused(tmp_path: Path, secret: Path, cache: Path) -> None:
    depth = "../" * 12
    error = refused(_save(tmp_path, f"{depth}{str(secret).lstrip('/')}", ["layer.tar"]))
    assert "outside" in error.message
    assert not holds_secret(cache)


def test_archive_layer_named_by_absolute_path_is_refused(tmp_path: Path, secret: Path, cache: Path) -> None:
    refused(_save(tmp_path, "config.json", ["layer.tar", str(secret)]))
    assert not holds_secret(cache)


def test_archive_layer_leaving_by_dotdot_is_refused(tmp_path: Path, secret: Path, cache: Path) -> None:
    refused(_save(tmp_path, "config.json", ["../" * 12 + str(secret).lstrip("/")]))
    assert not holds_secret(cache)


def test_archive_layer_that_is_a_link_out_is_refused(tmp_path: Path, secret: Path, cache: Path) -> None:
    error = refused(_save(tmp_path, "config.json", ["evil.tar"], links={"evil.tar": str(secret)}))
    assert "leaves its folder" in error.message
    assert not holds_secret(cache)


def test_archive_layer_that_is_a_relative_link_out_is_refused(tmp_path: Path, secret: Path, cache: Path) -> None:
    refused(_save(tmp_path, "config.json", ["evil.tar"], links={"evil.tar": "../" * 12 + str(secret).lstrip("/")}))
    assert not holds_secret(cache)


def test_archive_member_with_dotdot_writes_nothing_outside(tmp_path: Path, cache: Path) -> None:
    planted = tmp_path / "planted.txt"
    archive = tmp_path / "evil.tar"
    archive.write_bytes(tar_bytes({"../../../../../../../../" + str(planted).lstrip("/"): b"x"}))
    refused(f"docker-archive:{archive}")
    assert not planted.exists()


def test_archive_member_with_absolute_name_writes_nothing_outside(tmp_path: Path) -> None:
    planted = tmp_path / "planted-abs.txt"
    archive = tmp_path / "evil.tar"
    archive.write_bytes(tar_bytes({str(planted): b"x"}))
    refused(f"docker-archive:{archive}", BaseImageError)  # the name is kept inside; then no manifest.json
    assert not planted.exists()


def test_missing_docker_archive_is_a_base_image_error(tmp_path: Path) -> None:
    error = refused(f"docker-archive:{tmp_path / 'nope.tar'}", BaseImageError)
    assert "does not exist" in error.message and error.hint


def test_docker_archive_that_is_not_a_tar_is_a_base_image_error(tmp_path: Path) -> None:
    (tmp_path / "junk.tar").write_bytes(b"not a tar at all" * 10)
    refused(f"docker-archive:{tmp_path / 'junk.tar'}", BaseImageError)


# --- OCI layouts: digests and blobs -------------------------------------------------------------------------------
def _index_entry(layout_dir: Path, digest: str) -> None:
    index = json.loads((layout_dir / "index.json").read_text())
    index["manifests"][0]["digest"] = digest
    (layout_dir / "index.json").write_text(json.dumps(index))


@pytest.mark.parametrize("digest", ["sha256:../../../outside/id_rsa", "sha256:" + "A" * 64, "sha256:abc",
                                    "md5:" + "0" * 32])
def test_layout_with_a_non_canonical_digest_is_refused(tmp_path: Path, secret: Path, cache: Path,
                                                       digest: str) -> None:
    make_layout(tmp_path / "layout")
    _index_entry(tmp_path / "layout", digest)
    error = refused(f"oci:{tmp_path / 'layout'}")
    assert "not a sha256 digest" in error.message
    assert not holds_secret(cache)


def test_layout_layer_with_other_bytes_than_its_digest_is_refused(tmp_path: Path) -> None:
    layout = make_layout(tmp_path / "layout")
    _, manifest = layout.manifest("base")
    layer = layout.blob_path(manifest["layers"][0]["digest"])
    layer.write_bytes(gzip_layer({"usr/bin/evil": b"swapped"}))
    assert "does not match its digest" in refused(f"oci:{tmp_path / 'layout'}:base").message


def test_layout_manifest_with_other_bytes_than_its_digest_is_refused(tmp_path: Path) -> None:
    make_layout(tmp_path / "layout")
    index = json.loads((tmp_path / "layout" / "index.json").read_text())
    manifest_path = tmp_path / "layout" / "blobs" / "sha256" / index["manifests"][0]["digest"].split(":")[1]
    manifest_path.write_bytes(manifest_path.read_bytes().replace(b"schemaVersion\":2", b"schemaVersion\":3"))
    refused(f"oci:{tmp_path / 'layout'}")


def test_layout_blob_that_is_a_link_out_is_refused(tmp_path: Path, secret: Path, cache: Path) -> None:
    layout = make_layout(tmp_path / "layout")
    _, manifest = layout.manifest("base")
    layer = layout.blob_path(manifest["layers"][0]["digest"])
    layer.unlink()
    layer.symlink_to(secret)
    assert "not a plain file" in refused(f"oci:{tmp_path / 'layout'}").message
    assert not holds_secret(cache)


def test_oci_archive_with_a_member_leaving_the_folder_is_refused(tmp_path: Path) -> None:
    planted = tmp_path / "planted-oci.txt"
    archive = tmp_path / "base.oci.tar"
    archive.write_bytes(tar_bytes({"index.json": b"{}"}, links={"blobs": "../" * 12 + str(tmp_path).lstrip("/")}))
    refused(f"oci-archive:{archive}")
    assert not planted.exists()


# --- registries: pinned digests, blobs, token realms ---------------------------------------------------------------
def test_registry_answering_a_pinned_digest_with_other_bytes_is_refused(cache: Path) -> None:
    config, gz, manifest = image_docs([PYTHON_BIN])
    _, _, other = image_docs([{"usr/local/bin/python3": b"evil"}])
    with fake_registry() as registry:
        registry.serve("team/base", config, gz, manifest)
        registry.manifests[sha(manifest)] = other  # asked for the pinned digest, it sends another image
        error = refused(f"{registry.host}/team/base@{sha(manifest)}")
    assert "other bytes" in error.message
    assert not (cache / "bases").exists() or not any((cache / "bases").rglob("*.json"))


def test_registry_blob_with_other_bytes_is_refused_and_not_kept(cache: Path) -> None:
    config, gz, manifest = image_docs([PYTHON_BIN])
    with fake_registry() as registry:
        source = registry.serve("team/base", config, gz, manifest)
        registry.blobs[sha(gz[0])] = gzip_layer({"usr/bin/evil": b"swapped"})
        assert "does not match its digest" in refused(source).message
    assert not any(p.name == sha(gz[0]).split(":")[1] for p in cache.rglob("*"))


def test_registry_manifest_naming_a_traversing_digest_is_refused(cache: Path) -> None:
    config, gz, _ = image_docs([PYTHON_BIN])
    manifest = json.dumps({"schemaVersion": 2, "config": {"mediaType": "x", "digest": "sha256:../../../x", "size": 1},
                           "layers": []}).encode()
    with fake_registry() as registry:
        source = registry.serve("team/base", config, gz, manifest)
        refused(source)
        assert not any("../" in path for path, _ in registry.seen)


@pytest.mark.parametrize("realm", ["https://auth.example.invalid/token", "http://auth.example.invalid/token"])
def test_credentials_are_not_sent_to_a_realm_on_another_host(monkeypatch: pytest.MonkeyPatch, realm: str) -> None:
    monkeypatch.setenv("MBUILD_REGISTRY_USERNAME", "me")
    monkeypatch.setenv("MBUILD_REGISTRY_PASSWORD", "hunter2")
    with fake_registry() as registry:
        registry.realm = realm
        source = registry.serve("team/base", *image_docs([PYTHON_BIN]))
        error = refused(source)
        assert "does not send them" in error.message and "MBUILD_REGISTRY_AUTH_HOSTS" in (error.hint or "")
        assert all(auth is None for _, auth in registry.seen)


def test_realm_policy_wants_https_on_the_registry_host_or_a_named_one(monkeypatch: pytest.MonkeyPatch) -> None:
    assert trusted_realm("registry.example.com", "https://registry.example.com/token")
    assert not trusted_realm("registry.example.com", "http://registry.example.com/token")
    assert not trusted_realm("registry.example.com", "https://evil.example.net/token")
    monkeypatch.setenv("MBUILD_REGISTRY_AUTH_HOSTS", "auth.example.com")
    assert trusted_realm("registry.example.com", "https://auth.example.com/token")
    assert not trusted_realm("registry.example.com", "http://auth.example.com/token")


def test_credentials_go_to_a_realm_on_the_registry_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """The control for the refusals above: the same pull with a trusted realm logs in and succeeds."""
    monkeypatch.setenv("MBUILD_REGISTRY_USERNAME", "me")
    monkeypatch.setenv("MBUILD_REGISTRY_PASSWORD", "hunter2")
    with fake_registry() as registry:
        registry.realm = f"http://{registry.host}/token"
        base = load_base(registry.serve("team/base", *image_docs([PYTHON_BIN])))
        token_requests = [auth for path, auth in registry.seen if path.startswith("/token")]
    assert token_requests and token_requests[0] and token_requests[0].startswith("Basic ")
    check_python(base, "3.11")


# --- a base without Python ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("layers", [[{"etc/os-release": b"ID=scratch"}], [{"usr/bin/python3": b"elf"}],
                                    [PYTHON_BIN, {"usr/local/bin/.wh.python3.11": b""}]],
                         ids=["no-python", "wrong-version", "python-deleted-by-a-later-layer"])
def test_a_base_without_a_usable_python_is_refused(tmp_path: Path, layers: list[dict[str, bytes]]) -> None:
    base = load_base(f"oci:{make_layout(tmp_path / 'layout', layers).root}:base")
    with pytest.raises(BaseImageError) as caught:
        check_python(base, "3.11")
    assert "python" in caught.value.message and "--base-image" in (caught.value.hint or "")
    assert "mbuild base" in (caught.value.hint or "")


# --- cache import: links out of the model folder ---------------------------------------------------------------------
def test_cache_import_refuses_a_link_out_of_the_folder(tmp_path: Path, secret: Path, isolated_hub_env: Path) -> None:
    from builder.model.cache_import import import_folder

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "tokenizer.json").symlink_to(secret)
    with pytest.raises(UnsafeInput) as caught:
        import_folder(model, "org/name")
    assert "outside" in caught.value.message
    assert not holds_secret(isolated_hub_env)


def test_cache_import_keeps_links_inside_and_file_modes(tmp_path: Path, isolated_hub_env: Path) -> None:
    from builder.model.cache_import import import_folder

    model = tmp_path / "model"
    (model / "sub").mkdir(parents=True)
    (model / "config.json").write_text("{}")
    (model / "weights.safetensors").write_bytes(b"w" * 100)
    os.chmod(model / "weights.safetensors", 0o600)
    (model / "sub" / "weights.safetensors").symlink_to("../weights.safetensors")
    result = import_folder(model, "org/name")
    blob = (result.snapshot / "weights.safetensors").resolve()
    assert blob.stat().st_mode & 0o777 == 0o600
    assert (result.snapshot / "sub" / "weights.safetensors").read_bytes() == b"w" * 100
    shutil.rmtree(model)


def test_the_oci_backend_refuses_a_base_without_python_before_writing_an_image(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from builder.cli import cli
    from builder.image.oci import LAYOUT_DIR, OciBackend

    base = make_layout(tmp_path / "scratch", [{"etc/os-release": b"ID=scratch"}])
    out = tmp_path / "build"
    planned = CliRunner().invoke(cli, ["package", "all-minilm-l6-v2", "--backend", "none", "--plan-only",
                                       "--base-image", f"oci:{base.root}:base", "--output", str(out)])
    assert planned.exit_code == 0, planned.output
    with pytest.raises(BaseImageError) as caught:
        OciBackend().build(out, "mbuild/x:1", out / "image-build.log")
    assert "python3" in caught.value.message and "python:3.11-slim" in (caught.value.hint or "")
    assert not (out / LAYOUT_DIR).exists()
