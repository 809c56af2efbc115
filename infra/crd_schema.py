"""Custom resources checked offline against the CustomResourceDefinitions their operators publish: each CRD version's
``openAPIV3Schema`` made strict (an object that lists its properties accepts no others, unless the schema says
``x-kubernetes-preserve-unknown-fields``), as a Kubernetes API server prunes or, with ``kubectl --validate=strict``,
refuses unknown fields."""

from __future__ import annotations

import copy
from collections.abc import Iterable
from pathlib import Path

import jsonschema
import yaml

#: The fields every object has beside its spec; a CRD's schema often leaves metadata open.
_METADATA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "namespace": {"type": "string"},
        "generateName": {"type": "string"},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
        "finalizers": {"type": "array", "items": {"type": "string"}},
    },
}


def strict(schema: dict) -> dict:
    """A copy of ``schema`` in which every object schema listing ``properties`` refuses fields it does not list."""
    schema = copy.deepcopy(schema)

    def tighten(node: object) -> None:
        if isinstance(node, dict):
            if (
                "properties" in node
                and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")
            ):
                node["additionalProperties"] = False
            for value in node.values():
                tighten(value)
        elif isinstance(node, list):
            for value in node:
                tighten(value)

    tighten(schema)
    return schema


class CrdValidators:
    """A strict validator per (apiVersion, kind) of the CRDs in some files."""

    def __init__(self, crd_files: Iterable[Path]) -> None:
        self.validators: dict[tuple[str, str], jsonschema.Draft7Validator] = {}
        for path in crd_files:
            # The CRDs are megabytes of YAML: libyaml's loader reads them in a fraction of the pure-Python one's time.
            for crd in yaml.load_all(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
                if not crd or crd.get("kind") != "CustomResourceDefinition":
                    continue
                group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
                for version in crd["spec"]["versions"]:
                    schema = strict(version["schema"]["openAPIV3Schema"])
                    schema.setdefault("properties", {})["metadata"] = strict(_METADATA)
                    schema["properties"] |= {"apiVersion": {"type": "string"}, "kind": {"type": "string"}}
                    self.validators[(f"{group}/{version['name']}", kind)] = jsonschema.Draft7Validator(schema)

    def knows(self, obj: dict) -> bool:
        """Whether a CRD here defines ``obj``'s apiVersion and kind."""
        return (obj.get("apiVersion"), obj.get("kind")) in self.validators

    def errors(self, obj: dict) -> list[str]:
        """What is wrong with ``obj`` against its CRD's strict schema, one line each (empty: valid)."""
        validator = self.validators[(obj["apiVersion"], obj["kind"])]
        return [f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in validator.iter_errors(obj)]
