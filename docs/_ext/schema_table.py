"""``schema-table``: a JSON schema's properties as a table, from where the schema is defined.

The event schema is built in code (``lifecycle.event_schema()``) from the kernel-state schema, and the
REST answers are defined in the OpenAPI document; the pages show them from there and cannot drift.
"""
from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import yaml
from docutils import nodes
from docutils.parsers.rst import directives
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective


def load(target: str, directory: Path) -> dict[str, Any]:
    """``FILE.yaml#/json/pointer`` (relative to the page), or ``module:function`` called, or ``module:NAME`` read."""
    if "#" in target:
        path, _, pointer = target.partition("#")
        node = yaml.safe_load((directory / path).read_text())
        for key in pointer.strip("/").split("/"):
            node = node[key.replace("~1", "/").replace("~0", "~")]
        return node
    module, _, name = target.partition(":")
    obj = getattr(importlib.import_module(module), name)
    return obj() if callable(obj) else obj


def type_of(prop: dict[str, Any]) -> str:
    if "enum" in prop:
        return " | ".join(f"``{v}``" for v in prop["enum"])
    kind = prop.get("type", "any")
    return " or ".join(kind) if isinstance(kind, list) else str(kind)


def rows(schema: dict[str, Any]) -> list[str]:
    required = set(schema.get("required", []))
    lines = [".. list-table::", "   :header-rows: 1", "", "   * - property", "     - type", "     - meaning"]
    for name, prop in schema["properties"].items():
        flag = " (always)" if name in required else ""
        lines += [f"   * - ``{name}``{flag}", f"     - {type_of(prop)}", f"     - {prop.get('description', '')}".rstrip()]
    return lines


class SchemaTable(SphinxDirective):
    """The properties table, then (``:json:``) the whole schema as JSON."""

    required_arguments = 1
    option_spec = {"json": directives.flag}

    def run(self) -> list[nodes.Node]:
        schema = load(self.arguments[0], Path(self.env.doc2path(self.env.docname)).parent)
        container = nodes.container()
        self.state.nested_parse(StringList(rows(schema), self.get_source_info()[0]), self.content_offset, container)
        out: list[nodes.Node] = list(container.children)
        if "json" in self.options:
            out.append(nodes.literal_block(text=json.dumps(schema, indent=2, ensure_ascii=False), language="json"))
        return out


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("schema-table", SchemaTable)
    return {"parallel_read_safe": True, "version": "1"}
