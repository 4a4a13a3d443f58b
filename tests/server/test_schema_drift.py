"""The UI's TypeScript types follow the server's kernel-state schema.

``labextension/src/types.ts`` declares ``IKernelState`` (what ``GET /api/gpucr/kernels/{id}``
returns, ``jupyter_gpucr/server/schemas/kernel-state.json``) and ``IKernelStateEvent`` (the data
of the event bus schema the server builds from the same file). A property added to or removed from
the schema without the types, or the other way round, fails here.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from jupyter_gpucr.server.lifecycle import STATE_SCHEMA_PATH, event_schema

REPO = Path(__file__).resolve().parents[2]
TYPES_TS = REPO / "labextension" / "src" / "types.ts"


def interface_properties(source: str, name: str) -> set[str]:
    """The top-level property names of ``export interface NAME { ... }`` in TypeScript source,
    with those of the interfaces it extends."""
    match = re.search(rf"export interface {name}\s*(?:extends ([^{{]+))?\{{", source)
    if match is None:
        raise AssertionError(f"no 'export interface {name}' in {TYPES_TS}")
    inherited = {prop for base in (match.group(1) or "").split(",") if base.strip()
                 for prop in interface_properties(source, base.strip())}
    depth, start, body = 1, match.end(), None
    for i in range(start, len(source)):
        if source[i] == "{":
            depth += 1
        elif source[i] == "}":
            depth -= 1
            if depth == 0:
                body = source[start:i]
                break
    assert body is not None, f"unbalanced braces in interface {name}"
    # Keep only what is at depth 0 of the body (drop nested object types and comments).
    body = re.sub(r"/\*.*?\*/", "", body, flags=re.S)
    body = re.sub(r"//[^\n]*", "", body)
    flat, depth = [], 0
    for ch in body:
        if ch in "{([<":
            depth += 1
        elif ch in "})]>":
            depth -= 1
        elif depth == 0:
            flat.append(ch)
    own = set(re.findall(r"(?:^|[;\n])\s*(?:readonly\s+)?([A-Za-z_]\w*)\??\s*:", "".join(flat)))
    return own | inherited


@pytest.fixture(scope="module")
def types_source() -> str:
    return TYPES_TS.read_text()


def test_interface_parser() -> None:
    src = """
    export interface IThing {
      /** a comment: with colon */
      a: string;
      b?: { [step: string]: number } | null;
      c: Array<{ inner: number }>;
      readonly d: number;
    }
    export interface IMore extends IThing {
      e: string;
    }
    """
    assert interface_properties(src, "IThing") == {"a", "b", "c", "d"}
    assert interface_properties(src, "IMore") == {"a", "b", "c", "d", "e"}


def test_kernel_state_type_matches_schema(types_source: str) -> None:
    schema = json.loads(STATE_SCHEMA_PATH.read_text())
    in_schema = set(schema["properties"])
    in_types = interface_properties(types_source, "IKernelState")
    assert in_schema - in_types == set(), "properties of kernel-state.json missing in IKernelState (types.ts)"
    assert in_types - in_schema == set(), "properties of IKernelState (types.ts) that kernel-state.json lacks"


def test_required_properties_are_not_optional(types_source: str) -> None:
    schema = json.loads(STATE_SCHEMA_PATH.read_text())
    for name in schema["required"]:
        assert re.search(rf"\n\s*{name}:", types_source), f"IKernelState.{name} must not be optional"


def test_state_names_match(types_source: str) -> None:
    schema = json.loads(STATE_SCHEMA_PATH.read_text())
    match = re.search(r"export type KernelStateName =([^;]*);", types_source)
    assert match is not None
    assert set(re.findall(r"'([^']+)'", match.group(1))) == set(schema["properties"]["state"]["enum"])


def test_event_type_matches_event_schema(types_source: str) -> None:
    schema = event_schema()
    in_schema = set(schema["properties"])
    in_types = interface_properties(types_source, "IKernelStateEvent")
    assert in_schema - in_types == set(), "event schema properties missing in IKernelStateEvent (types.ts)"
    assert in_types - in_schema == set(), "properties of IKernelStateEvent (types.ts) the event schema lacks"
    phases = re.search(r"export type Phase =([^;]*);", types_source)
    assert phases is not None
    assert set(re.findall(r"'([^']+)'", phases.group(1))) == set(schema["properties"]["phase"]["enum"])
