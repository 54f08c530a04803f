"""Write the KServe InferenceService schema fixture (tests/unit/fixtures/kserve-inferenceservice-v1beta1.json)
from the KServe Python SDK's models: `python -m tests.support.kserve_schema KSERVE_PACKAGE_DIR`.

The SDK (PyPI `kserve`) is generated from KServe's OpenAPI spec, which is generated from the same Go types as
the InferenceService CRD. Each model class lists its fields (`openapi_types`, `attribute_map`), and its setters
say which are required and which values are allowed. The SDK's files are read as text (ast), not imported:
importing kserve pulls in its whole server. Kubernetes types (V1Container, ...) become references into the
Kubernetes schemas kubernetes-validate ships, so the pod parts are checked as strictly as a Deployment's.
Unknown fields are refused (additionalProperties: false), as kubectl's default strict field validation does.
"""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path
from typing import Any

FIXTURE = Path(__file__).resolve().parents[1] / "unit" / "fixtures" / "kserve-inferenceservice-v1beta1.json"
K8S = "https://kubernetes.io/api/_definitions.json#/$defs/"  # kubernetes-validate's definitions document
SCALARS = {"str": {"type": "string"}, "int": {"type": "integer"}, "float": {"type": "number"},
           "bool": {"type": "boolean"}, "datetime": {"type": "string"}, "object": {}}
K8S_NAMES = {"ResourceQuantity": "io.k8s.apimachinery.pkg.api.resource.Quantity",
             "V1ObjectMeta": "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta",
             "V1LabelSelector": "io.k8s.apimachinery.pkg.apis.meta.v1.LabelSelector",
             "V1Condition": "io.k8s.apimachinery.pkg.apis.meta.v1.Condition",
             "V1beta1MetricQuantity": "io.k8s.apimachinery.pkg.api.resource.Quantity"}  # KServe's name for one


def _k8s_name(type_name: str) -> str | None:
    """The Kubernetes definition a client class stands for: V1Container -> io.k8s.api.core.v1.Container,
    K8sIoApiAppsV1DeploymentStrategy -> io.k8s.api.apps.v1.DeploymentStrategy."""
    if type_name in K8S_NAMES:
        return K8S_NAMES[type_name]
    if match := re.fullmatch(r"K8sIoApi([A-Z][a-z]+)(V\d+(?:(?:alpha|beta)\d+)?)(\w+)", type_name):
        return f"io.k8s.api.{match[1].lower()}.{match[2].lower()}.{match[3]}"
    if match := re.fullmatch(r"(V\d+(?:(?:alpha|beta)\d+)?)(\w+)", type_name):
        return f"io.k8s.api.core.{match[1].lower()}.{match[2]}"
    return None


class Sdk:
    def __init__(self, models: Path) -> None:
        self.classes: dict[str, ast.ClassDef] = {}
        for path in sorted(models.glob("*.py")):
            for node in ast.parse(path.read_text()).body:
                if isinstance(node, ast.ClassDef):
                    self.classes[node.name] = node
        self.defs: dict[str, Any] = {}

    def type_schema(self, text: str) -> dict[str, Any]:
        if text in SCALARS:
            return dict(SCALARS[text])
        if match := re.fullmatch(r"list\[(.+)\]", text):
            return {"type": "array", "items": self.type_schema(match[1])}
        if match := re.fullmatch(r"dict\(str, (.+)\)", text):
            return {"type": "object", "additionalProperties": self.type_schema(match[1])}
        if text in self.classes and text.startswith(("V1alpha1", "V1beta1")):
            self.define(text)
            return {"$ref": f"#/$defs/{text}"}
        name = _k8s_name(text)
        if name is None:
            raise SystemExit(f"kserve_schema: no schema for the SDK type {text!r}")
        return {"$ref": K8S + name}

    def define(self, name: str) -> None:
        if name in self.defs:
            return
        self.defs[name] = {}  # placeholder: recursive types stop here
        node = self.classes[name]
        types = attribute_map = None
        for stmt in node.body:
            if isinstance(stmt, ast.Assign) and isinstance(stmt.targets[0], ast.Name):
                if stmt.targets[0].id == "openapi_types":
                    types = ast.literal_eval(stmt.value)
                elif stmt.targets[0].id == "attribute_map":
                    attribute_map = ast.literal_eval(stmt.value)
        if types is None or attribute_map is None:
            raise SystemExit(f"kserve_schema: {name} lists no fields")
        source = ast.unparse(node)
        properties: dict[str, Any] = {}
        required: list[str] = []
        for attr, type_text in types.items():
            if attr == "status":  # the controller's to write (its types are Knative's): never in a manifest
                properties["status"] = False
                continue
            schema = self.type_schema(type_text)
            if allowed := re.search(rf"def {attr}\(self, {attr}\):(?:(?!\n    def ).)*?allowed_values = (\[[^\]]*\])",
                                    source, re.S):
                schema["enum"] = ast.literal_eval(allowed[1])
            properties[attribute_map[attr]] = schema
            if f"Invalid value for `{attr}`, must not be `None`" in source:
                required.append(attribute_map[attr])
        self.defs[name] = {"type": "object", "properties": properties, "additionalProperties": False,
                           **({"required": required} if required else {})}


def build(models: Path) -> dict[str, Any]:
    sdk = Sdk(models)
    sdk.define("V1beta1InferenceService")
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": "https://mbuild.invalid/fixtures/kserve-inferenceservice-v1beta1.json",
            "description": "KServe InferenceService serving.kserve.io/v1beta1, from the KServe Python SDK's models "
                           "by tests/support/kserve_schema.py",
            "$ref": "#/$defs/V1beta1InferenceService", "$defs": dict(sorted(sdk.defs.items()))}


if __name__ == "__main__":
    package = Path(sys.argv[1])
    FIXTURE.parent.mkdir(parents=True, exist_ok=True)
    FIXTURE.write_text(json.dumps(build(package / "models"), indent=1, sort_keys=False) + "\n")
    print(f"wrote {FIXTURE} ({FIXTURE.stat().st_size} bytes)")
