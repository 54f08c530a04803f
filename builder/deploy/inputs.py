"""The names and numbers `mbuild deploy` takes, checked as the Kubernetes API server checks what they become
(apimachinery's IsDNS1123Label, IsDNS1123Subdomain and IsDNS1035Label; the autoscaler's range), so a bad one is
an error here, naming the option, rather than YAML that is quoted safely and then refused by `kubectl apply`."""

from __future__ import annotations

import re

from builder.errors import InputError

_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
LABEL = re.compile(_LABEL)  # RFC 1123 label: a namespace
SUBDOMAIN = re.compile(rf"{_LABEL}(\.{_LABEL})*")  # RFC 1123 subdomain: a Secret, a Deployment
SERVICE = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")  # RFC 1035 label: a Service (and KServe's InferenceService)
LABEL_MAX, SUBDOMAIN_MAX = 63, 253


def _check(what: str, value: str, pattern: re.Pattern[str], limit: int, rule: str, hint: str) -> str:
    if len(value) > limit:
        raise InputError(f"{what} {value[:80]!r}... has {len(value)} characters; Kubernetes takes at most {limit}",
                         hint=hint)
    if not pattern.fullmatch(value):
        raise InputError(f"{what} {value!r} is not a name Kubernetes takes: {rule}", hint=hint)
    return value


def namespace_name(value: str) -> str:
    return _check("--namespace", value, LABEL, LABEL_MAX, "lower-case letters, digits and '-', starting and "
                  "ending with a letter or digit", "give one such as models")


def secret_name(value: str) -> str:
    return _check("--api-key-secret", value, SUBDOMAIN, SUBDOMAIN_MAX, "lower-case letters, digits, '-' and '.', "
                  "each part between dots starting and ending with a letter or digit",
                  "give one such as model-api-key")


def object_name(value: str, given: bool = True) -> str:
    """Every object is named this, the Service too: a letter first (RFC 1035), and a label's length, since
    the name is also the app.kubernetes.io/name label. given: --name, else the name made from the image's."""
    what, hint = ("--name", "give one such as embedder") if given else (
        "the name made from the image's tag", "give the objects a name with --name NAME")
    return _check(what, value, SERVICE, LABEL_MAX, "lower-case letters, digits and '-', starting with a letter "
                  "and ending with a letter or digit", hint)


def check_options(name: str | None, namespace: str | None, api_key_secret: str | None, replicas: int | None,
                  minimum: int, maximum: int) -> None:
    """The options as given (the name made from the image is checked once it is made: object_name)."""
    if minimum > maximum:
        raise InputError(f"--min-replicas {minimum} is above --max-replicas {maximum}",
                         hint="give a --min-replicas no larger than --max-replicas")
    # The autoscaler would at once scale a Deployment outside its range back into it.
    if replicas is not None and not minimum <= replicas <= maximum:
        side = f"below --min-replicas {minimum}" if replicas < minimum else f"above --max-replicas {maximum}"
        raise InputError(f"--replicas {replicas} is {side}",
                         hint="give --replicas within --min-replicas..--max-replicas, or leave it out")
    for value, check in ((name, object_name), (namespace, namespace_name), (api_key_secret, secret_name)):
        if value is not None:
            check(value)
