"""Container entry point: check the model bundle, then run the server (runtimes/server.py) under the supervisor.

`python -m runtimes [--model-dir DIR] [--host H] [--port P]`; flags override MBUILD_* variables.
`python -m runtimes --list-model-profiles` prints the profiles the image carries and whether this host can
run them (NIM's list-model-profiles); MBUILD_MODEL_PROFILE (or NIM_MODEL_PROFILE) picks one at start.
"""

from __future__ import annotations

import argparse
import errno
import os
import socket
import sys
from pathlib import Path

from runtimes.bundle import BundleError, load_engine_config, load_metadata
from runtimes.bundle.metadata import ProfileInfo
from runtimes.exits import Exit
from runtimes.fit import memory_limit_gb, misfits
from runtimes.hardware import detect_gpus, read_cpu_flags
from runtimes.settings import Settings, SettingsError, child_env
from runtimes.supervisor import Supervisor


def preflight(model_dir: Path, site: str | None = None) -> None:
    """Fail before serving when the bundle is plainly broken (readiness would never come)."""
    if not model_dir.is_dir():
        raise BundleError(f"model folder {model_dir} does not exist (set MBUILD_MODEL_DIR)")
    meta = load_metadata(model_dir)
    wanted = meta.requires.python if meta else None
    running = f"{sys.version_info.major}.{sys.version_info.minor}"
    # Only the image's own packages (MBUILD_SITE) are tied to one Python; `mbuild serve` uses the host's.
    if site and wanted and wanted != running:
        raise BundleError(f"the image's packages were installed for Python {wanted}, but the base image runs "
                          f"Python {running}; rebuild with a Python {wanted} base (--base-image)")
    config = load_engine_config(model_dir)
    if not (model_dir / config.model_file).is_file():
        raise BundleError(f"engine file {model_dir / config.model_file} is missing")
    # Present, not parsed: the server parses it as it loads (~80 ms for Llama's), and one it cannot read fails the
    # load, which stops the start with exit 3 too (the failed flag, supervisor.py).
    if not (model_dir / config.tokenizer_file).is_file():
        raise BundleError(f"tokenizer file {model_dir / config.tokenizer_file} is missing")


def check_listen(host: str, port: int) -> None:
    """A taken port fails here with one line, not later as the process manager's traceback when it binds."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as exc:
        raise SettingsError(f"MBUILD_HOST={host!r} does not resolve ({exc.strerror}): set an address of this "
                            "host, or 0.0.0.0 for all") from None
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds: TIME_WAIT is no clash
        try:
            sock.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise SettingsError(f"port {port} on {host} is already in use by another process: stop it, or "
                                    "serve on another port (MBUILD_PORT or --port)") from None
            raise SettingsError(f"cannot listen on {host}:{port} ({exc.strerror}): set MBUILD_HOST and "
                                "MBUILD_PORT to an address and port this process may bind") from None


def carried_profiles(model_dir: Path) -> list[ProfileInfo]:
    """The profiles in the bundle: one per image today (a build is one profile's engine)."""
    meta = load_metadata(model_dir)
    return [meta.profile] if meta else []


def choose_profile(model_dir: Path, wanted: str | None) -> None:
    """MBUILD_MODEL_PROFILE / NIM_MODEL_PROFILE, by name, id or an id prefix of 12+ characters."""
    if not wanted:
        return
    profiles = carried_profiles(model_dir)
    if not any(wanted in (p.name, p.id) or (len(wanted) >= 12 and p.id.startswith(wanted)) for p in profiles):
        carried = ", ".join(f"{p.name} ({p.id[:12]})" for p in profiles) or "none"
        raise BundleError(f"the model profile {wanted!r} (MBUILD_MODEL_PROFILE / NIM_MODEL_PROFILE) is not in this "
                          f"image; it carries: {carried}")


def list_profiles(model_dir: Path) -> int:
    problems = hardware_problems(model_dir)
    for profile in carried_profiles(model_dir):
        fit = "runnable here" if not problems else "not runnable here: " + "; ".join(problems)
        print(f"{profile.id[:12]}  {profile.name}  ({fit})")
    return 0


def hardware_problems(model_dir: Path) -> list[str]:
    meta = load_metadata(model_dir)
    if meta is None:  # a bundle without metadata.json (not an image's) asks nothing of the host
        return []
    gpus = detect_gpus() if meta.requires.device == "gpu" else ()
    return misfits(meta.requires, read_cpu_flags(), gpus, memory_limit_gb())


def bentoml_server(settings: Settings, env: dict[str, str]) -> list[str]:
    """BentoML's server around the same app, for its OpenTelemetry spans (MBUILD_TRACING=1): two more processes
    than runtimes/server.py's, which start it 2.5 s later (docs/benchmarks/start_ready.md)."""
    env.setdefault("BENTOML_HOME", "/tmp/bentoml")  # writable even on a read-only root filesystem
    command = [sys.executable, "-m", "bentoml", "serve", "runtimes.service:ModelService", "--working-dir",
               str(Path(__file__).resolve().parent.parent), "--host", settings.host, "--port", str(settings.port),
               "--timeout-keep-alive", str(settings.keepalive_seconds)]
    if settings.ssl_certfile and settings.ssl_keyfile:
        command += ["--ssl-certfile", settings.ssl_certfile, "--ssl-keyfile", settings.ssl_keyfile]
    return command


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runtimes", description=__doc__)
    parser.add_argument("--model-dir")
    parser.add_argument("--host")
    parser.add_argument("--port", type=int)
    parser.add_argument("--list-model-profiles", action="store_true", help="print the image's profiles and exit")
    args = parser.parse_args(argv)
    overrides = {variable: str(getattr(args, option)) for option, variable in (
        ("model_dir", "MBUILD_MODEL_DIR"), ("host", "MBUILD_HOST"), ("port", "MBUILD_PORT"))
        if getattr(args, option) is not None}
    try:
        settings = Settings.from_env(child_env(**overrides))
        overrides["MBUILD_MODEL_DIR"] = str(settings.model_dir.resolve())
        preflight(settings.model_dir, settings.site)
        if args.list_model_profiles:
            return list_profiles(settings.model_dir)
        choose_profile(settings.model_dir, settings.model_profile)
        problems = hardware_problems(settings.model_dir)
        check_listen(settings.host, settings.port)
    except (SettingsError, BundleError) as exc:
        print(f"mbuild runtime: {exc}", file=sys.stderr)
        return Exit.BROKEN_BUNDLE
    if problems and not settings.skip_hardware_check:
        for problem in problems:
            print(f"mbuild runtime: refusing to start: {problem}", file=sys.stderr)
        print("mbuild runtime: set MBUILD_SKIP_HARDWARE_CHECK=1 to start anyway (unsupported)", file=sys.stderr)
        return Exit.WRONG_HARDWARE
    for problem in problems:
        print(f"mbuild runtime: WARNING, hardware check skipped: {problem}", file=sys.stderr)
    flag = settings.drain_flag or Path(f"/tmp/mbuild-{os.getpid()}/draining")
    failed = settings.failed_flag or flag.parent / "failed"
    env = child_env(**overrides, BENTOML_DO_NOT_TRACK="true", MBUILD_DRAIN_FLAG=str(flag),
                    MBUILD_FAILED_FLAG=str(failed))
    if settings.ssl_certfile or settings.ssl_keyfile:
        tls = [Path(p) for p in (settings.ssl_certfile, settings.ssl_keyfile) if p]
        if len(tls) != 2 or not all(p.is_file() for p in tls):
            print("mbuild runtime: TLS needs both MBUILD_SSL_CERTFILE and MBUILD_SSL_KEYFILE, as readable files",
                  file=sys.stderr)
            return Exit.BROKEN_BUNDLE
    command = bentoml_server(settings, env) if settings.tracing else [sys.executable, "-m", "runtimes.server"]
    if settings.auth_notice:
        print(f"mbuild runtime: {settings.auth_notice}", file=sys.stderr)
    return Supervisor(command, env, flag, settings.drain_seconds, settings.grace_seconds, failed).run()


if __name__ == "__main__":
    sys.exit(main())
