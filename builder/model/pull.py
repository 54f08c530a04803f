"""Resolve a ModelSpec to a commit sha and the files to fetch, then pull them with huggingface_hub.

Errors from the Hub client are turned into mbuild errors that say what to do next.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from huggingface_hub import HfApi, get_token, snapshot_download
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from builder.errors import AccessDenied, HubUnreachable, ModelNotFound, NotInCache
from builder.hashing import sha256_file
from builder.model.catalog import entry_for_repo
from builder.model.files import select_files
from builder.model.hubcache import cached_commit, hub_cache_dir, hub_endpoint, repo_folder
from builder.model.ref import ModelRef
from builder.model.sources import COMMIT_SHA, ModelSpec

try:  # huggingface_hub >= 2 talks through httpx2; older releases through httpx
    import httpx2

    _NETWORK_ERRORS: tuple[type[BaseException], ...] = (
        httpx2.ConnectError, httpx2.TimeoutException, httpx.ConnectError, httpx.TimeoutException,
    )
except ImportError:  # pragma: no cover - depends on the installed hub client
    _NETWORK_ERRORS = (httpx.ConnectError, httpx.TimeoutException)


def _unreachable(spec: ModelSpec, cause: BaseException) -> HubUnreachable:
    return HubUnreachable(
        f"cannot reach the Hugging Face Hub at {hub_endpoint()} to resolve {spec.display()} "
        f"({type(cause).__name__})",
        hint=(
            "use --offline to build from the local cache; on an air-gapped host copy the model folder over and "
            f"run `mbuild cache import DIR --repo {spec.repo}` first"
        ),
    )


def _gated(repo: str) -> AccessDenied:
    page = f"{hub_endpoint()}/{repo}"
    if get_token():
        return AccessDenied(
            f"{repo} is gated and the token in HF_TOKEN has no access to it",
            hint=f"accept the model's license at {page} with the account that owns the token",
        )
    return AccessDenied(
        f"{repo} is a gated model and no Hugging Face token is set",
        hint=f"accept its license at {page}, then export HF_TOKEN=<a read token from huggingface.co/settings/tokens>",
    )


@contextmanager
def hub_errors(spec: ModelSpec) -> Iterator[None]:
    """Translate the Hub client's exceptions into mbuild errors with hints."""
    try:
        yield
    except GatedRepoError as exc:
        raise _gated(spec.repo) from exc
    except RevisionNotFoundError as exc:
        raise ModelNotFound(
            f"{spec.repo} has no revision {spec.revision!r}",
            hint=f"see the branches and commits at {hub_endpoint()}/{spec.repo}/tree/main",
        ) from exc
    except RepositoryNotFoundError as exc:
        hint = "check the spelling (org/name)"
        hint += "; if it is private, the token in HF_TOKEN has no access" if get_token() else (
            "; if it is private or gated, export HF_TOKEN=<token>"
        )
        raise ModelNotFound(f"no model {spec.repo!r} on {hub_endpoint()}", hint=hint) from exc
    except OfflineModeIsEnabled as exc:
        raise _not_cached(spec) from exc
    except _NETWORK_ERRORS as exc:
        raise _unreachable(spec, exc) from exc
    except LocalEntryNotFoundError as exc:
        if isinstance(exc.__cause__, _NETWORK_ERRORS):
            raise _unreachable(spec, exc.__cause__) from exc
        raise _not_cached(spec) from exc
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else "?"
        raise HubUnreachable(
            f"the Hub answered HTTP {status} for {spec.repo}",
            hint="retry later, or build offline from the cache with --offline",
        ) from exc


def _not_cached(spec: ModelSpec) -> NotInCache:
    return NotInCache(
        f"{spec.display()} is not in the local Hugging Face cache ({hub_cache_dir()}) and --offline is set",
        hint=(
            f"download it once with network access (mbuild package {spec.repo}), or copy the model folder here and "
            f"run `mbuild cache import DIR --repo {spec.repo}`"
        ),
    )


def resolve(spec: ModelSpec, offline: bool) -> ModelRef:
    """Pin the spec to a commit and choose its files, touching the network only when online."""
    if spec.local_path is not None:
        files = sorted(str(p.relative_to(spec.local_path)) for p in spec.local_path.rglob("*") if p.is_file())
        chosen = tuple(select_files(files))
        return ModelRef(spec.repo, spec.revision, _folder_digest(spec.local_path, chosen), chosen,
                        local_path=spec.local_path)
    if offline:
        sha = cached_commit(spec.repo, spec.revision)
        if sha is None:
            raise _not_cached(spec)
        snapshot = repo_folder(spec.repo) / "snapshots" / sha
        files = sorted(str(p.relative_to(snapshot)) for p in snapshot.rglob("*") if p.is_file())
        return ModelRef(spec.repo, spec.revision, sha, tuple(select_files(files)), alias=spec.alias)
    with hub_errors(spec):
        info = HfApi(endpoint=hub_endpoint()).model_info(spec.repo, revision=spec.revision)
    assert info.sha is not None and COMMIT_SHA.match(info.sha), "the Hub returned no commit sha"
    names = [s.rfilename for s in info.siblings or []]
    return ModelRef(spec.repo, spec.revision, info.sha, tuple(select_files(names)), alias=spec.alias)


def pull(ref: ModelRef, spec: ModelSpec, offline: bool) -> Path:
    """Fetch exactly ref.files at ref.sha into the standard cache and return the snapshot folder."""
    if ref.local_path is not None:
        return ref.local_path
    if ref.sha is None:
        raise _not_cached(spec)  # only plans leave a ref unpinned; a build never gets here with one
    with hub_errors(spec):
        folder = snapshot_download(
            ref.repo,
            revision=ref.sha,
            allow_patterns=list(ref.files),
            local_files_only=offline,
            cache_dir=hub_cache_dir(),
            endpoint=hub_endpoint(),
        )
    if not offline and ref.revision != ref.sha:
        # Downloading by sha records no branch; write refs/<revision> as the Hub client does for names,
        # so a later --offline build of the same reference finds this commit.
        refs = repo_folder(ref.repo) / "refs" / ref.revision
        refs.parent.mkdir(parents=True, exist_ok=True)
        refs.write_text(ref.sha)
    return Path(folder)


def _folder_digest(root: Path, files: tuple[str, ...]) -> str:
    """A 40-hex content id for a local folder, so local builds are versioned like hub commits."""
    digest = hashlib.sha1()
    for name in files:
        digest.update(f"{name}\0{sha256_file(root / name)}\n".encode())
    return digest.hexdigest()


def resolve_or_defer(spec: ModelSpec, offline: bool) -> ModelRef:
    """For planning only: a catalog model the Hub or cache cannot pin yet is planned unpinned."""
    try:
        return resolve(spec, offline)
    except (HubUnreachable, NotInCache, AccessDenied) as exc:
        if entry_for_repo(spec.repo) is None:
            raise
        return ModelRef(spec.repo, spec.revision, None, (), alias=spec.alias,
                        note=f"not pinned: {exc.message}; `mbuild package` pins it to a commit")
