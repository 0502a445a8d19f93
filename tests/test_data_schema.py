"""Every upstream type dialect maps to JSON Schema; unknown types are errors naming the record."""

import pytest

from ooospec.data.schema import (DataError, bfcl_parameters, function_spec, normalize_schema, object_schema,
                                 python_type_schema, schema_violations)


@pytest.mark.parametrize("text, schema, optional", [
    ("str", {"type": "string"}, False),
    ("int", {"type": "integer"}, False),
    ("list(str)", {"type": "array", "items": {"type": "string"}}, False),
    ("List[int]", {"type": "array", "items": {"type": "integer"}}, False),
    ("Union[List[dict], dict]", {"anyOf": [{"type": "array", "items": {"type": "object"}}, {"type": "object"}]}, False),
    ("str, optional", {"type": "string"}, True),
    ("Optional[float]", {"type": "number"}, True),
    ("Tuple[float, float]", {"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 2}, False),
    ("['string', 'null']", {"type": ["string", "null"]}, False),
    ("Callable[[float], float]", {"type": "string"}, False),
    ("datetime", {"type": "string"}, False),
    ("Date (yyyy-mm-dd)", {"type": "string"}, False),
    ("any", {}, False),
    ("String", {"type": "string"}, False),
    ("HashMap", {"type": "object"}, False),
])
def test_python_and_misc_types(text, schema, optional):
    assert python_type_schema(text, "here") == (schema, optional)


def test_unknown_type_names_the_record():
    with pytest.raises(DataError, match=r"file.json record 3 .*quaternion"):
        object_schema({"q": {"type": "quaternion"}}, where="file.json record 3")


def test_bfcl_types_and_required_folding():
    params = {"type": "dict", "properties": {
        "x": {"type": "float", "description": "x"},
        "pt": {"type": "tuple", "items": {"type": "integer"}},
        "v": {"type": "any"},
        "cfg": {"type": "dict", "properties": {"k": {"type": "string", "required": True}, "o": {"type": "boolean", "optional": True}}},
    }, "required": ["x"]}
    schema = bfcl_parameters(params, "here")
    assert schema["type"] == "object" and schema["required"] == ["x"]
    assert schema["properties"]["x"] == {"type": "number", "description": "x"}
    assert schema["properties"]["pt"] == {"type": "array", "items": {"type": "integer"}}
    assert schema["properties"]["v"] == {}
    assert schema["properties"]["cfg"]["required"] == ["k"]
    assert "optional" not in schema["properties"]["cfg"]["properties"]["o"]
    function_spec("f", "", schema, "here")  # valid JSON Schema


def test_bfcl_java_parameters_become_strings():
    params = {"type": "dict", "properties": {"map": {"type": "HashMap", "description": "A map."}, "n": {"type": "long"}},
              "required": ["map"]}
    schema = bfcl_parameters(params, "here", language="java")
    assert schema["properties"]["map"]["type"] == "string"
    assert "Java HashMap" in schema["properties"]["map"]["description"]
    assert schema["required"] == ["map"]


def test_nestful_range_enum_goes_to_description_and_sgd_allowed_values_to_enum():
    schema = object_schema({"page": {"type": "Number", "enum": "1-100", "description": "Page."},
                            "fare": {"description": "Fare.", "allowed_values": ["Economy", "Flexible"], "required": True}})
    assert schema["properties"]["page"] == {"type": "number", "description": "Page. Allowed: 1-100."}
    assert schema["properties"]["fare"]["enum"] == ["Economy", "Flexible"]
    assert schema["required"] == ["fare"]


def test_invalid_schema_is_rejected_and_violations_are_reported():
    with pytest.raises(DataError, match="not valid JSON Schema"):
        function_spec("f", "", {"type": "object", "required": True}, "here")
    tool = function_spec("f", "", normalize_schema({"type": "object", "properties": {"n": {"type": "int"}}, "required": ["n"]}))
    assert schema_violations({"n": 1}, tool) == []
    problems = schema_violations({"n": "one", "extra": 1}, tool)
    assert any("not of type 'integer'" in p for p in problems) and any("extra" in p for p in problems)
