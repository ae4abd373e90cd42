"""Metadata filters (`rigkit.retrieval.filters`) as Milvus filter expressions.

A collection rigkit builds holds each chunk's metadata in the JSON field `metadata`; `doc_id` and
`title` are fields of their own. A condition becomes a Milvus expression only where Milvus
compares exactly as rigkit's filters do, which depends on what the field holds across the index
(`FieldShape`, read from the local chunk list):

| the field holds (every chunk that has it) | conditions sent to Milvus |
| --- | --- |
| text that reads as no number, date or true/false | `=`, any of, `!=` |
| JSON numbers | `=`, any of, `!=`, ranges, with number values |
| booleans | `=`, any of, `!=`, with true/false |
| lists of such text | `=` (an element equals: `json_contains`), any of (`json_contains_any`), `!=` |

`!=` keeps the chunks without the field, as rigkit's filters do (`not exists`). What stays behind
is returned as the rest, for the retriever to apply in Python to Milvus's candidates: dates (Milvus
would compare ISO text as text), numbers written as text (`"1990"` equals `1990` in rigkit),
fields mixing kinds, and values of another kind than the field's. Any of on a JSON key is written
as `a == x or a == y`: Milvus's `in` takes fields, not JSON keys.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from rigkit.retrieval.filters import ChunkFilter, Condition, Filters, compared_as

__all__ = ["FieldShape", "field_shape", "milvus_filter", "JSON_FIELD"]

JSON_FIELD = "metadata"
_OWN_FIELDS = ("doc_id", "title")  # VARCHAR fields of the collection
_OPERATORS = {"eq": "==", "ne": "!=", "gt": ">", "gte": ">=", "lt": "<", "lte": "<="}
_RANGES = ("gt", "gte", "lt", "lte")


@dataclass(frozen=True)
class FieldShape:
    """What one filterable field holds across an index's chunks, as Milvus sees it."""

    path: str  # the Milvus reference: doc_id, title or metadata["key"]
    kind: str  # text | number | bool | text-list | mixed
    complete: bool  # every chunk has the field

    @property
    def in_json(self) -> bool:
        return self.path.startswith(f"{JSON_FIELD}[")


def field_shape(chunk_filter: ChunkFilter, key: str) -> FieldShape | None:
    """The shape of `key` over the chunks `chunk_filter` covers; None: no chunk has it."""
    column = chunk_filter.column(key)
    if column is None:
        return None
    values, codes = column
    kinds = {_kind(v) for v in values}
    kind = kinds.pop() if len(kinds) == 1 else "mixed"
    own = False
    if key in _OWN_FIELDS:  # a chunk whose metadata names doc_id or title is filtered on that
        in_metadata = [key in (c.metadata or {}) for c in chunk_filter.chunks]
        own = not any(in_metadata)
        kind = kind if own or all(in_metadata) else "mixed"
    path = key if own else f"{JSON_FIELD}[{_text(key)}]"
    return FieldShape(path, kind, bool((codes >= 0).all()))


def _kind(value) -> str:
    if isinstance(value, list | tuple):
        return "text-list" if all(compared_as(v) == "text" for v in value) else "mixed"
    seen = compared_as(value)
    if seen == "number" and not isinstance(value, int | float):
        return "mixed"  # a number written as text: Milvus would compare it as text
    if seen == "bool" and not isinstance(value, bool):
        return "mixed"
    return seen if seen in ("text", "number", "bool") else "mixed"


def milvus_filter(filters: Filters, shapes: Mapping[str, FieldShape]) -> tuple[str | None, Filters | None]:
    """(the Milvus expression of the conditions that translate, or None; the rest, or None).
    Both parts must hold: the conditions are ANDed."""
    sent, rest = [], []
    for condition in filters.conditions:
        shape = shapes.get(condition.key)
        expression = _condition(condition, shape) if shape is not None else None
        if expression is None:
            rest.append(condition)
        else:
            sent.append(expression)
    expression = " and ".join(f"({e})" for e in sent) if len(sent) > 1 else (sent[0] if sent else None)
    return expression, Filters(tuple(rest)) or None


def _condition(condition: Condition, shape: FieldShape) -> str | None:
    op, path = condition.op, shape.path
    values = condition.value if op == "in" else (condition.value,)
    literals = _literals(shape.kind, op, values)
    if literals is None:
        return None
    if shape.kind == "text-list":
        if op == "eq":
            return f"json_contains({path}, {literals[0]})"
        if op == "in":
            return f"json_contains_any({path}, [{', '.join(literals)}])"
        return _or_missing(shape, f"not json_contains({path}, {literals[0]})")
    if op == "in":
        if not shape.in_json:
            return f"{path} in [{', '.join(literals)}]"
        return " or ".join(f"{path} == {literal}" for literal in literals)
    expression = f"{path} {_OPERATORS[op]} {literals[0]}"
    return _or_missing(shape, expression) if op == "ne" else expression


def _literals(kind: str, op: str, values: tuple) -> list[str] | None:
    """Milvus literals for `values` compared with a field of `kind`, or None: not exact there."""
    if op in _RANGES and kind != "number":
        return None
    if kind in ("text", "text-list"):
        # text compares as text in rigkit too, whatever the asked value reads as, but a boolean
        # asked for matches true/false text, which these fields do not hold
        return None if any(isinstance(v, bool) for v in values) else [_text(str(v)) for v in values]
    if kind == "number":
        if any(compared_as(v) != "number" for v in values):
            return None
        return [_number(float(v)) for v in values]
    if kind == "bool":
        truths = [v if isinstance(v, bool) else _truth(v) for v in values]
        return None if None in truths else ["true" if t else "false" for t in truths]
    return None


def _or_missing(shape: FieldShape, expression: str) -> str:
    """`!=` passes a chunk without the field; Milvus passes nothing on a missing JSON key."""
    if shape.in_json and not shape.complete:
        return f"not exists {shape.path} or {expression}"
    return expression


def _truth(value) -> bool | None:
    if not isinstance(value, str) or compared_as(value) != "bool":
        return None
    return value.strip().lower() == "true"


def _text(value: str) -> str:
    """A Milvus string literal: double quotes, backslash escapes (JSON's are Milvus's)."""
    return json.dumps(value, ensure_ascii=False)


def _number(value: float) -> str:
    if value.is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(value)
