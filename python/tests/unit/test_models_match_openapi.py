"""The SDK's hand-written models (``threadbox._models``) checked against the committed
OpenAPI document (``api/openapi.json``, itself checked fresh against the daemon's code by
``crates/threadbox-server/tests/openapi.rs``). No daemon: a field the API adds, renames or
retypes fails here, before a user's call does.

How a model maps onto its schema:
- each dataclass field is a schema property of a compatible type, except ``raw`` (the
  undecoded answer) and the fields the SDK derives: ``X_bytes: bytes`` decodes the string
  property ``X`` with the schema's ``encoding``; ``OutputEvent.stream`` is the event's
  ``type``;
- each schema property is a model field (or the source of a derived one);
- a property the schema lets be ``null`` must be optional in the model;
- a ``Literal`` has exactly the schema enum's values.
Known disagreements are listed in ``KNOWN_GAPS`` with their reason; the test also fails
when one of them is fixed, so that the list shrinks with the SDK.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union

import pytest

from threadbox import _models

OPENAPI = Path(__file__).resolve().parents[3] / "api" / "openapi.json"

# model class name -> (schema name, event `type` values when it is an ExecEvent variant)
MODELS: dict[str, tuple[str, tuple[str, ...]]] = {
    "Health": ("Health", ()),
    "Limits": ("Limits", ()),
    "SandboxInfo": ("Sandbox", ()),
    "ExecResult": ("ExecResponse", ()),
    "ProcessInfo": ("ProcessInfo", ()),
    "PreviewInfo": ("Preview", ()),
    "ProcessLogs": ("ProcessLogs", ()),
    "FileEntry": ("FileEntry", ()),
    "SelftestCheck": ("PostureCheck", ()),
    "SelftestReport": ("SelftestReport", ()),
    "StartEvent": ("ExecEvent", ("start",)),
    "OutputEvent": ("ExecEvent", ("stdout", "stderr")),
    "EndEvent": ("ExecEvent", ("end",)),
    "ErrorEvent": ("ExecEvent", ("error",)),
    "ImageInfo": ("Image", ()),
}

# SDK type aliases -> the enum schema they mirror.
ENUMS: dict[str, str] = {
    "SandboxState": "SandboxState",
    "TtlAction": "TtlAction",
    "UserName": "User",
    "FileKind": "FileKind",
    "Encoding": "Encoding",
}

# "Model.field" -> why the SDK and the API disagree for now. Each must still disagree.
KNOWN_GAPS: dict[str, str] = {
    "Limits.disk_bytes": "the SDK does not expose the sandbox's disk size yet",
    "SandboxInfo.isolation_warnings": "added to Sandbox in issue 10; the SDK reads it only through `raw`",
}

SKIPPED_FIELDS = {"raw"}


def load_schemas() -> dict[str, Any]:
    with OPENAPI.open() as f:
        doc = json.load(f)
    schemas: dict[str, Any] = doc["components"]["schemas"]
    return schemas


def resolve(schema: dict[str, Any], schemas: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """The schema behind a ``$ref`` (and its name), or the schema itself."""
    ref = schema.get("$ref")
    if ref is None:
        return schema, None
    name = ref.rsplit("/", 1)[-1]
    return schemas[name], name


def object_schema(schema_name: str, event_types: tuple[str, ...], schemas: dict[str, Any]) -> dict[str, Any]:
    """The object schema of a model: the named one, or the ExecEvent variant(s) whose
    ``type`` is in ``event_types`` (variants of one model must agree)."""
    schema: dict[str, Any] = schemas[schema_name]
    if not event_types:
        return schema
    variants = [v for v in schema["oneOf"] if set(v["properties"]["type"].get("enum", [])) & set(event_types)]
    assert variants, f"no {schema_name} variant of type {event_types}"
    found = {t for v in variants for t in v["properties"]["type"]["enum"]}
    assert found == set(event_types), f"{schema_name} variants {found}, the SDK models {event_types}"
    first: dict[str, Any] = variants[0]
    for other in variants[1:]:
        assert other["properties"].keys() == first["properties"].keys()
    return first


def split_optional(tp: Any) -> tuple[Any, bool]:
    """``X | None`` -> (X, True); anything else -> (tp, False)."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        optional = len(args) < len(typing.get_args(tp))
        inner = args[0] if len(args) == 1 else Union[tuple(args)]  # noqa: UP007
        return inner, optional
    return tp, False


def type_problems(where: str, tp: Any, schema: dict[str, Any], schemas: dict[str, Any]) -> list[str]:
    """Why the Python type ``tp`` cannot hold every value ``schema`` allows (empty: it can)."""
    schema, ref_name = resolve(schema, schemas)
    inner, optional = split_optional(tp)
    json_type = schema.get("type")
    nullable = isinstance(json_type, list) and "null" in json_type
    if isinstance(json_type, list):
        non_null = [t for t in json_type if t != "null"]
        json_type = non_null[0] if len(non_null) == 1 else non_null
    if nullable and not optional:
        return [f"{where}: the API may send null, the model type {tp} does not allow None"]
    if "enum" in schema:
        if typing.get_origin(inner) is Literal:
            if set(typing.get_args(inner)) != set(schema["enum"]):
                return [f"{where}: Literal{list(typing.get_args(inner))} != enum {schema['enum']}"]
            return []
        # A plain str takes any value of an enum (codes the SDK does not know yet).
        return [] if inner is str else [f"{where}: {inner} cannot hold the enum {schema['enum']}"]
    if schema.get("oneOf") or schema.get("anyOf"):
        return []
    if json_type == "integer":
        return [] if inner is int else [f"{where}: the API sends an integer, the model has {inner}"]
    if json_type == "number":
        return [] if inner is float else [f"{where}: the API sends a number, the model has {inner}"]
    if json_type == "string":
        return [] if inner is str else [f"{where}: the API sends a string, the model has {inner}"]
    if json_type == "boolean":
        return [] if inner is bool else [f"{where}: the API sends a boolean, the model has {inner}"]
    if json_type == "array":
        if typing.get_origin(inner) is not list:
            return [f"{where}: the API sends an array, the model has {inner}"]
        (item,) = typing.get_args(inner)
        return type_problems(f"{where}[]", item, schema["items"], schemas)
    if json_type == "object" and "additionalProperties" in schema and not schema.get("properties"):
        if typing.get_origin(inner) is not dict:
            return [f"{where}: the API sends a map, the model has {inner}"]
        key, value = typing.get_args(inner)
        if key is not str:
            return [f"{where}: map keys are strings, the model has {key}"]
        return type_problems(f"{where}{{}}", value, schema["additionalProperties"], schemas)
    if json_type == "object":
        # A nested model: it is checked on its own; here only that it is the right one.
        expected = [m for m, (s, ev) in MODELS.items() if s == ref_name and not ev]
        name = getattr(inner, "__name__", str(inner))
        if name not in expected:
            return [f"{where}: the API sends {ref_name}, the model has {name}"]
        return []
    return [f"{where}: unhandled schema {schema}"]


def model_problems(cls: type, schema_name: str, event_types: tuple[str, ...], schemas: dict[str, Any]) -> list[str]:
    """Every disagreement between the dataclass ``cls`` and its schema."""
    schema = object_schema(schema_name, event_types, schemas)
    props: dict[str, Any] = dict(schema.get("properties", {}))
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)} - SKIPPED_FIELDS
    name = cls.__name__
    problems: list[str] = []
    covered: set[str] = set()
    for field in sorted(fields):
        where = f"{name}.{field}"
        tp = hints[field]
        if field == "type" and event_types:
            problems += type_problems(where, tp, {"type": "string", "enum": list(event_types)}, schemas)
            covered.add("type")
            continue
        if field == "stream" and event_types:
            problems += type_problems(where, tp, {"type": "string", "enum": list(event_types)}, schemas)
            covered.add("type")
            continue
        source = field
        decoded = split_optional(tp)[0] is bytes
        if decoded:
            source = field.removesuffix("_bytes")
            if "encoding" not in props:
                problems.append(f"{where}: decoded bytes, but {schema_name} has no `encoding`")
            covered.add("encoding")
        if source not in props:
            problems.append(f"{where}: no property `{source}` in {schema_name}")
            continue
        covered.add(source)
        if decoded:
            # The wire carries a string, which the SDK decodes; nullability is the field's.
            wire = str | None if split_optional(tp)[1] else str
            problems += type_problems(where, wire, props[source], schemas)
            continue
        problems += type_problems(where, tp, props[source], schemas)
    for prop in sorted(props.keys() - covered):
        problems.append(f"{name}.{prop}: {schema_name} has `{prop}`, the model does not")
    return problems


def sdk_problems(schemas: dict[str, Any]) -> list[str]:
    problems: list[str] = []
    for cls_name, (schema_name, event_types) in MODELS.items():
        problems += model_problems(getattr(_models, cls_name), schema_name, event_types, schemas)
    for alias, schema_name in ENUMS.items():
        problems += type_problems(f"{alias}", getattr(_models, alias), schemas[schema_name], schemas)
    return problems


def gap_key(problem: str) -> str:
    return problem.split(":", 1)[0]


def test_every_sdk_model_matches_its_openapi_schema() -> None:
    schemas = load_schemas()
    problems = sdk_problems(schemas)
    unexpected = [p for p in problems if gap_key(p) not in KNOWN_GAPS]
    assert not unexpected, "the SDK's models disagree with api/openapi.json:\n" + "\n".join(unexpected)
    fixed = sorted(KNOWN_GAPS.keys() - {gap_key(p) for p in problems})
    assert not fixed, f"fixed, so remove them from KNOWN_GAPS: {fixed}"


def test_every_public_model_is_checked() -> None:
    dataclasses_exported = {n for n in _models.__all__ if dataclasses.is_dataclass(getattr(_models, n, None))}
    assert dataclasses_exported <= MODELS.keys(), dataclasses_exported - MODELS.keys()


# ---- the check can fail --------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class FileEntryMissingAField:
    name: str
    path: str
    kind: _models.FileKind
    size: int
    mode: int
    uid: int
    gid: int
    modified_at: str
    # symlink_target is missing
    name_b64: str | None = None
    path_b64: str | None = None


@dataclasses.dataclass(frozen=True)
class FileEntryMistyped:
    name: str
    path: str
    kind: _models.FileKind
    size: str  # the API sends an integer
    mode: int
    uid: int
    gid: int
    modified_at: str
    symlink_target: str  # the API may send null
    name_b64: str | None = None
    path_b64: str | None = None


@dataclasses.dataclass(frozen=True)
class LimitsWithAFieldTheApiLacks:
    memory_bytes: int
    cpus: float
    pids: int
    disk_bytes: int
    swap_bytes: int


@pytest.mark.parametrize(
    ("cls", "schema", "expected"),
    [
        (FileEntryMissingAField, "FileEntry", ["FileEntryMissingAField.symlink_target: FileEntry has"]),
        (
            FileEntryMistyped,
            "FileEntry",
            [
                "FileEntryMistyped.size: the API sends an integer",
                "FileEntryMistyped.symlink_target: the API may send null",
            ],
        ),
        (LimitsWithAFieldTheApiLacks, "Limits", ["LimitsWithAFieldTheApiLacks.swap_bytes: no property"]),
    ],
)
def test_a_missing_or_mistyped_field_is_reported(cls: type, schema: str, expected: list[str]) -> None:
    problems = model_problems(cls, schema, (), load_schemas())
    for e in expected:
        assert any(p.startswith(e) for p in problems), (e, problems)
    assert len(problems) == len(expected), problems


def test_a_changed_enum_is_reported() -> None:
    schemas = load_schemas()
    state = dict(schemas["SandboxState"])
    state["enum"] = [*state["enum"], "sleeping"]
    problems = type_problems("SandboxState", _models.SandboxState, state, schemas)
    assert problems and "sleeping" in problems[0], problems
