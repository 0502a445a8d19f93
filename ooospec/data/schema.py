"""Every upstream schema dialect -> one JSON Schema form for tool parameters.

Downstream code (chat templates with ``tools=``, the schema FSM, the sidecar's slot rows) needs one
dialect. Upstream has at least five: API-Bank's and Seal-Tools' Python type names (``str``,
``list(str)``, ``Union[List[dict], dict]``), ToolRL's mix of JSON Schema and Python typing with
an ``, optional`` suffix, BFCL's own types (``dict``, ``float``, ``tuple``, ``any``) plus
Java/JavaScript types, NESTFUL's RapidAPI words (``String``, ``Number``, ``Enum``), and
ToolAlpaca's prose. The tables here are the single mapping; an unknown type is a
:class:`DataError` naming the file and record, never a silent ``string``.

Mapping choices worth knowing:

* ``any`` (BFCL) and an empty type become a schema with no ``type`` (any JSON value). BFCL's own
  harness maps ``any`` to ``string`` for OpenAI tools; we keep the weaker constraint so that the
  gold values (numbers and lists occur) validate.
* ``tuple`` -> ``array``; ``datetime``/``date`` -> ``string``; ``Callable`` -> ``string``.
* Property-level ``required: true`` / ``optional: true`` (not JSON Schema) are folded into the
  parent's ``required`` list.
* BFCL Java/JavaScript functions take source-code expressions as strings, so every parameter
  becomes ``string`` and its description says which Java/JS type the string must denote (the
  rule BFCL applies before sending such functions to a model).
"""

from __future__ import annotations

import ast
import json
import re
from functools import lru_cache
from typing import Any

from jsonschema import Draft7Validator
from jsonschema.exceptions import SchemaError
from jsonschema.validators import validator_for


class DataError(ValueError):
    """Malformed upstream input; the message names the file and the record."""


# Lower-cased type word -> JSON Schema type (None: no type constraint).
BASE_TYPES: dict[str, str | None] = {
    "str": "string", "string": "string", "text": "string", "char": "string", "character": "string",
    "datetime": "string", "date": "string", "time": "string", "enum": "string", "callable": "string",
    "int": "integer", "integer": "integer", "long": "integer", "short": "integer",
    "float": "number", "double": "number", "number": "number", "decimal": "number",
    "bool": "boolean", "boolean": "boolean",
    "list": "array", "array": "array", "arraylist": "array", "tuple": "array", "set": "array",
    "dict": "object", "object": "object", "map": "object", "hashmap": "object",
    "none": "null", "null": "null", "nonetype": "null",
    "any": None, "": None,
}

_GENERIC = re.compile(r"^\s*([A-Za-z_][\w.]*)\s*[\[(](.*)[\])]\s*$", re.S)


def _split_top(text: str) -> list[str]:
    """Split on commas that are not inside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _type_schema(name: str) -> dict[str, Any]:
    json_type = BASE_TYPES[name.lower()]
    return {} if json_type is None else {"type": json_type}


def python_type_schema(type_text: Any, where: str = "") -> tuple[dict[str, Any], bool]:
    """A Python-ish or JSON type string -> (JSON Schema, optional?).

    Handles ``str``, ``List[int]``, ``list(str)``, ``Tuple[float, float]``, ``Optional[X]``,
    ``Union[A, B]``, ``Dict[str, Any]``, the ``"str, optional"`` suffix, a Python list of type
    names (``"['string', 'null']"``) and real JSON type lists. ``where`` names the file and record
    for the error message.
    """
    if isinstance(type_text, list):
        schemas = [python_type_schema(t, where)[0] for t in type_text]
        types = [s["type"] for s in schemas if "type" in s]
        return ({"type": types} if len(types) == len(schemas) else {}), False
    if not isinstance(type_text, str):
        raise DataError(f"{where}: parameter type {type_text!r} is not a string")
    text = type_text.strip()
    optional = False
    if re.search(r",\s*optional\s*$", text, re.I):
        optional, text = True, re.sub(r",\s*optional\s*$", "", text, flags=re.I)
    if text.startswith("[") and text.endswith("]"):
        try:
            names = ast.literal_eval(text)
        except (ValueError, SyntaxError) as err:
            raise DataError(f"{where}: unreadable type list {type_text!r}") from err
        return python_type_schema(list(names), where)[0], optional
    match = _GENERIC.match(text)
    if match:
        head, args = match.group(1).lower().split(".")[-1], _split_top(match.group(2))
        if head == "optional" and len(args) == 1:
            return python_type_schema(args[0], where)[0], True
        if head == "union":
            options = [python_type_schema(a, where)[0] for a in args]
            nulls = [o for o in options if o.get("type") == "null"]
            rest = [o for o in options if o.get("type") != "null"]
            if len(rest) == 1:
                return rest[0], optional or bool(nulls)
            return {"anyOf": options}, optional
        if head in ("list", "set", "sequence", "iterable") and args:
            return {"type": "array", "items": python_type_schema(args[0], where)[0]}, optional
        if head == "tuple" and args:
            items = [python_type_schema(a, where)[0] for a in args if a != "..."]
            same = all(i == items[0] for i in items)
            schema: dict[str, Any] = {"type": "array", "items": items[0] if same else {}}
            if same and "..." not in args:
                schema["minItems"] = schema["maxItems"] = len(items)
            return schema, optional
        if head in ("dict", "mapping", "map"):
            return {"type": "object"}, optional
        if head == "callable":
            return {"type": "string"}, optional
    word = text.lower()
    if word.startswith("date"):  # NESTFUL "Date (yyyy-mm-dd)"
        return {"type": "string"}, optional
    if word not in BASE_TYPES:
        raise DataError(f"{where}: unknown parameter type {type_text!r}")
    return _type_schema(word), optional


def object_schema(
    params: dict[str, dict[str, Any]] | None,
    required: list[str] | None = None,
    where: str = "",
    all_required: bool = False,
) -> dict[str, Any]:
    """``{name: {"type", "description", ...}}`` (Python-ish types) -> a JSON Schema object.

    ``required`` wins when given; else a parameter is required when its spec says
    ``required: true``, or, with ``all_required``, unless its type carries ``optional``.
    """
    if params is not None and not isinstance(params, dict):
        raise DataError(f"{where}: parameters are a {type(params).__name__}, expected an object")
    properties: dict[str, Any] = {}
    needed: list[str] = []
    for name, spec in (params or {}).items():
        if not isinstance(spec, dict):
            raise DataError(f"{where}: parameter {name!r} spec is {type(spec).__name__}, not an object")
        schema, optional = python_type_schema(spec.get("type", ""), f"{where} parameter {name!r}")
        if spec.get("description"):
            schema["description"] = str(spec["description"])
        if "default" in spec:
            schema["default"] = spec["default"]
        if isinstance(spec.get("enum"), list):
            schema["enum"] = spec["enum"]
        elif spec.get("enum"):  # NESTFUL writes ranges as enum: "1-100"
            schema["description"] = f"{schema.get('description', '')} Allowed: {spec['enum']}.".strip()
        if isinstance(spec.get("allowed_values"), list) and spec["allowed_values"]:
            schema["enum"] = list(spec["allowed_values"])
        if "default_value" in spec:
            schema["default"] = spec["default_value"]
        if isinstance(spec.get("items"), dict):
            schema["items"] = normalize_schema(spec["items"], f"{where} parameter {name!r}")
        properties[name] = schema
        flag = spec.get("required")
        if (flag is True) or (flag is None and all_required and not optional and "optional" not in spec):
            needed.append(name)
    if required is not None:
        needed = [r for r in required if r in properties]
    return {"type": "object", "properties": properties, "required": needed}


def normalize_schema(node: Any, where: str = "") -> dict[str, Any]:
    """A JSON-Schema-like dict in any upstream dialect -> JSON Schema (recursively)."""
    if not isinstance(node, dict):
        raise DataError(f"{where}: schema node is {type(node).__name__}, not an object")
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "type":
            out.update(python_type_schema(value, where)[0])
        elif key == "properties" and isinstance(value, dict):
            props, needed = {}, list(node.get("required") or []) if isinstance(node.get("required"), list) else []
            for name, sub in value.items():
                props[name] = normalize_schema(sub, f"{where}.{name}")
                if isinstance(sub, dict) and sub.get("required") is True and name not in needed:
                    needed.append(name)
            out["properties"] = props
            out["required"] = [n for n in needed if n in props]
        elif key == "items":
            if isinstance(value, dict):
                out["items"] = normalize_schema(value, f"{where}[]")
            elif isinstance(value, list):
                out["items"] = [normalize_schema(v, f"{where}[]") for v in value]
        elif key in ("required", "optional"):
            continue  # folded into the parent / properties above
        elif key == "enum" and not isinstance(value, list):
            continue  # a range written as enum ("1-100"): moved into the description below
        elif key in ("anyOf", "oneOf", "allOf") and isinstance(value, list):
            out[key] = [normalize_schema(v, where) for v in value]
        elif key == "additionalProperties" and isinstance(value, dict):
            out[key] = normalize_schema(value, where)
        else:
            out[key] = value
    if "enum" in node and not isinstance(node["enum"], list):
        out["description"] = f"{node.get('description', '')} Allowed: {node['enum']}.".strip()
    if out.get("type") == "object" and "properties" not in out and "properties" in node:
        out["properties"] = {}
    if out.get("type") == "array" and "items" in out and out["items"] == {}:
        del out["items"]
    return out


JAVA_JS_TYPE_WORDS = {"java": "Java", "javascript": "JavaScript"}


def bfcl_parameters(parameters: dict[str, Any], where: str, language: str = "python") -> dict[str, Any]:
    """BFCL ``parameters`` (top-level ``"type": "dict"``) -> JSON Schema object.

    For Java/JavaScript every property becomes a string holding a source expression; the original
    type is kept in the description.
    """
    if language == "python":
        schema = normalize_schema(parameters, where)
        schema.setdefault("properties", {})
        schema.setdefault("required", [])
        return schema
    label = JAVA_JS_TYPE_WORDS[language]
    properties = {}
    for name, spec in (parameters.get("properties") or {}).items():
        original = spec.get("type", "")
        description = (spec.get("description") or "").rstrip()
        hint = f" This parameter must be a {label} {original or 'value'} given in its string representation."
        properties[name] = {"type": "string", "description": (description + hint).strip()}
        if "default" in spec:
            properties[name]["default"] = str(spec["default"])
    required = [r for r in parameters.get("required") or [] if r in properties]
    return {"type": "object", "properties": properties, "required": required}


def function_spec(name: str, description: str, parameters: dict[str, Any], where: str = "") -> dict[str, Any]:
    """An OpenAI-style tool: checked to be a valid JSON Schema so a bad table fails at load time."""
    try:
        Draft7Validator.check_schema(parameters)
    except SchemaError as err:
        raise DataError(f"{where}: tool {name!r} parameters are not valid JSON Schema ({err.message})") from err
    return {"name": name, "description": description or "", "parameters": parameters}


def schema_violations(arguments: dict[str, Any], tool: dict[str, Any]) -> list[str]:
    """Why a call's arguments do not satisfy its tool's parameter schema ([] when they do)."""
    validator = Draft7Validator(tool["parameters"])
    problems = []
    for error in validator.iter_errors(arguments):
        path = ".".join(str(p) for p in error.path) or "(arguments)"
        problems.append(f"{path}: {error.message[:160]}")
    extra = set(arguments) - set(tool["parameters"].get("properties", {}))
    problems.extend(f"{name}: not a parameter of {tool['name']}" for name in sorted(extra))
    return problems


# Tool schemas without ``$schema`` are checked against Draft 7's metaschema: Draft 7 is the dialect
# this module writes and the one `schema_violations` validates arguments with, so a schema that
# passes here is one our own validator reads the way its author meant.
DEFAULT_SCHEMA_DRAFT = Draft7Validator


@lru_cache(maxsize=65536)
def _metaschema_problems(schema_json: str) -> tuple[tuple[str, str], ...]:
    """(field path, message) for every metaschema error of one schema (given as JSON, to cache)."""
    schema = json.loads(schema_json)
    cls = DEFAULT_SCHEMA_DRAFT
    problems: list[tuple[str, str]] = []
    if isinstance(schema, dict) and "$schema" in schema:
        declared = validator_for(schema, default=None)
        if declared is None:
            problems.append(("$schema", f"unknown metaschema {schema['$schema']!r}; checked against Draft 7"))
        else:
            cls = declared
    errors = sorted(cls(cls.META_SCHEMA).iter_errors(schema), key=lambda e: [str(p) for p in e.absolute_path])
    for error in errors:
        problem = (".".join(str(p) for p in error.absolute_path), error.message[:200])
        if problem not in problems:  # Draft 2020-12's dynamic refs report one error several times
            problems.append(problem)
    return tuple(problems)


def tool_schema_warnings(tools: list[Any]) -> list[str]:
    """Why each tool's ``parameters`` is not a valid JSON Schema, one line per problem ([] if none).

    Checked against the metaschema of the schema's ``$schema`` (Draft 7 without one), so a
    property typed ``"strnig"`` or a ``properties`` written as a list is named here, with its tool
    and field, instead of passing silently into templates, the schema FSM and the sidecar:
    ``tool f: parameters.properties.y.type: 'strnig' is not valid under any of the given schemas``.
    Loaders already refuse invalid schemas they convert (`function_spec`); this is the check for
    every request, whatever made it. Results are cached per distinct schema (tools repeat).
    """
    warnings: list[str] = []
    for index, tool in enumerate(tools):
        if not isinstance(tool, dict):
            warnings.append(f"tool {index}: is a {type(tool).__name__}, not an object")
            continue
        label = f"tool {tool.get('name', index)}"
        if "parameters" not in tool:
            warnings.append(f"{label}: has no parameters")
            continue
        try:
            schema_json = json.dumps(tool["parameters"], sort_keys=True)
        except (TypeError, ValueError) as err:
            warnings.append(f"{label}: parameters are not JSON ({err})")
            continue
        for path, message in _metaschema_problems(schema_json):
            warnings.append(f"{label}: parameters{'.' + path if path else ''}: {message}")
    return warnings
