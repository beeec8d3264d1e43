"""A tool's ``parameters`` checked as the pinned llama-server reads them. Pure.

When a model's chat template calls tools, llama-server builds a parser (and a grammar)
from each tool's ``parameters`` (``common_chat_schema_from_json``, common/json-schema.cpp
at the pin), and throws on a schema it cannot use: with Qwen3-Coder's template (and the
others its automatic parser generator serves) the request is answered 500, which the
watchdog would count against a healthy backend. :func:`check_schema` walks a schema by
the same rules, in the same order, and refuses what that code would throw on; what it
only ignores (``minimum`` above ``maximum``, a ``pattern`` it cannot compile, unknown
keywords) passes. ``null`` and ``{}`` mean "no parameters" to llama-server and are never
walked.
"""

from __future__ import annotations

import re
from typing import Any, NoReturn

from slm_server.errors import InvalidRequest

_LEADING_DIGITS = re.compile(r"\s*\+?(\d+)")


def check_schema(schema: Any, param: str) -> None:
    """Refuse (400, ``param`` named) a tool ``parameters`` schema llama-server cannot
    build a parser from."""
    if schema is None or schema == {}:
        return
    _Walk(schema, param).node(schema, "#")


class _Walk:
    def __init__(self, root: Any, param: str) -> None:
        self.root = root
        self.param = param
        self.refs: set[str] = set()

    def fail(self, path: str, message: str) -> NoReturn:
        raise InvalidRequest(
            f"`{self.param}` is a JSON schema llama-server cannot use: at {path}, {message}",
            param=self.param,
        )

    def node(self, schema: Any, path: str) -> None:
        if not isinstance(schema, dict):
            self.fail(path, "schema must be an object")
        if "$ref" in schema:
            self.ref(schema["$ref"], path)
            return
        if "oneOf" in schema or "anyOf" in schema:
            key = "oneOf" if "oneOf" in schema else "anyOf"
            self.alternatives(schema[key], f"{path}/{key}")
            return
        kind = schema.get("type")
        if isinstance(kind, list):
            if not kind:
                self.fail(path, "type must not be empty")
            for index, one in enumerate(kind):
                self.node({**schema, "type": one}, f"{path}/type/{index}")
            return
        if "const" in schema:
            return
        if "enum" in schema:
            values = schema["enum"]
            if not isinstance(values, list) or not values:
                self.fail(path, "enum must be a non-empty array")
            return
        if kind is not None and not isinstance(kind, str):
            self.fail(path, "type must be a string or an array of strings")
        name = kind or ""
        has_properties = "properties" in schema or (
            "additionalProperties" in schema and schema["additionalProperties"] is not True
        )
        if not name:
            if has_properties:
                self.object(schema, path)
            elif "allOf" in schema:
                self.alternatives(schema["allOf"], f"{path}/allOf")
            elif "items" in schema or "prefixItems" in schema:
                self.array(schema, path)
            elif (
                "pattern" in schema
                or "minLength" in schema
                or "maxLength" in schema
                or self.format(schema, path)
            ):
                self.string(schema, path)
        elif name == "object":
            if not has_properties and "allOf" in schema:
                self.alternatives(schema["allOf"], f"{path}/allOf")
            else:
                self.object(schema, path)
        elif name == "string":
            if "allOf" in schema:
                self.alternatives(schema["allOf"], f"{path}/allOf")
            else:
                self.string(schema, path)
        elif name == "array":
            self.array(schema, path)
        elif name == "integer":
            self.integer(schema, path)
        elif name not in ("number", "boolean", "null"):
            self.fail(path, f"unrecognized type {name}")

    def ref(self, value: Any, path: str) -> None:
        if not isinstance(value, str):
            self.fail(path, "$ref must be a string")
        if not value.startswith("#/"):
            self.fail(
                path,
                f"unsupported $ref {value}: only references into the same document are supported",
            )
        if value in self.refs:  # built once; a cycle back to it stops here
            return
        self.refs.add(value)
        target: Any = self.root
        for part in value[1:].split("/")[1:]:
            if isinstance(target, dict) and part in target:
                target = target[part]
            elif isinstance(target, list):
                digits = _LEADING_DIGITS.match(part)
                index = int(digits.group(1)) if digits else len(target)
                if index >= len(target):
                    self.fail(path, f"cannot resolve $ref {value}: {part} is out of range")
                target = target[index]
            else:
                self.fail(path, f"cannot resolve $ref {value}: {part} not found")
        self.node(target, value)

    def alternatives(self, value: Any, path: str) -> None:
        if not isinstance(value, list):
            self.fail(path, "must be an array of schemas")
        if not value:
            self.fail(path, "must not be empty")
        for index, one in enumerate(value):
            self.node(one, f"{path}/{index}")

    def object(self, schema: dict[str, Any], path: str) -> None:
        if "properties" in schema:
            properties = schema["properties"]
            if not isinstance(properties, dict):
                self.fail(path, "properties must be an object")
            for name, one in properties.items():
                self.node(one, f"{path}/properties/{name}")
        if "additionalProperties" in schema:
            more = schema["additionalProperties"]
            if isinstance(more, dict):
                self.node(more, f"{path}/additionalProperties")
            elif not isinstance(more, bool):
                self.fail(path, "additionalProperties must be a boolean or a schema")

    def array(self, schema: dict[str, Any], path: str) -> None:
        if "items" in schema or "prefixItems" in schema:
            key = "items" if "items" in schema else "prefixItems"
            items = schema[key]
            if isinstance(items, list):
                for index, one in enumerate(items):
                    self.node(one, f"{path}/{key}/{index}")
                return  # a tuple: its counts are not read
            self.node(items, f"{path}/{key}")
        self.count(schema, "minItems", path)
        self.count(schema, "maxItems", path)

    def string(self, schema: dict[str, Any], path: str) -> None:
        if "pattern" in schema and not isinstance(schema["pattern"], str):
            self.fail(path, "pattern must be a string")
        self.format(schema, path)
        self.count(schema, "minLength", path)
        self.count(schema, "maxLength", path)

    def integer(self, schema: dict[str, Any], path: str) -> None:
        for bounds in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
            key = next((k for k in bounds if k in schema), None)
            value = schema[key] if key is not None else 0
            if isinstance(value, bool) or not isinstance(value, int | float):
                self.fail(path, f"{key} must be a number")

    def format(self, schema: dict[str, Any], path: str) -> bool:
        """Whether ``schema`` has a format llama-server knows (it fails on a non-string one)."""
        if "format" not in schema:
            return False
        value = schema["format"]
        if not isinstance(value, str):
            self.fail(path, "format must be a string")
        return value in ("date", "time", "date-time", "uuid") or bool(
            re.fullmatch(r"uuid[1-5]", value)
        )

    def count(self, schema: dict[str, Any], key: str, path: str) -> None:
        if key not in schema:
            return
        value = schema[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            self.fail(path, f"{key} must be a non-negative integer")


__all__ = ["check_schema"]
