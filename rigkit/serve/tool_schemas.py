"""Client tool schemas (JSON Schema 2020-12), checked without fetching anything and in bounded time.

A tool's `parameters` come from whoever sends the request, so checking arguments against them runs
the client's program. jsonschema alone fetches a remote `$ref` (the server would send requests for
the client), follows `{"$ref": "#"}` until Python's recursion limit, compares `uniqueItems`
pairwise (6,000 objects: 45 s) and lets `^(a+)+$` backtrack for seconds, holding the GIL. Here:

- nothing is fetched: every `$ref` / `$dynamicRef` must point inside the schema (`#...`) and must
  resolve there; the registry's retrieve refuses, so a base URI set by `$id` cannot reach out either;
- a schema is at most `MAX_SCHEMA_BYTES` of JSON nested `MAX_SCHEMA_DEPTH` levels; arguments at
  most `MAX_ARGUMENT_BYTES` nested `MAX_ARGUMENT_DEPTH` levels, strict JSON (no NaN or Infinity);
- one path follows at most `MAX_REFERENCE_DEPTH` references;
- patterns run on the `regex` module with a timeout per match (`PATTERN_SECONDS`), releasing the
  GIL meanwhile, and `uniqueItems` is one pass over canonical keys;
- one check has `CHECK_SECONDS`: each keyword it evaluates looks at the clock.

Callers run checks off the event loop (a thread). A limit is a `SchemaLimit` that names it.
`unevaluatedProperties` together with `patternProperties` is refused: jsonschema matches those
patterns with Python's `re`, which no timeout can stop.
"""

from __future__ import annotations

import functools
import json
import math
import time
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from typing import Any
from urllib.parse import urljoin

__all__ = ["SchemaLimit", "check_schema", "first_error", "load_arguments", "MAX_SCHEMA_BYTES", "MAX_SCHEMA_DEPTH",
           "MAX_ARGUMENT_BYTES", "MAX_ARGUMENT_DEPTH", "MAX_REFERENCE_DEPTH", "CHECK_SECONDS", "PATTERN_SECONDS"]

MAX_SCHEMA_BYTES = 65_536  # one tool's `parameters` as compact JSON
MAX_SCHEMA_DEPTH = 32  # JSON nesting: 15 levels of nested object properties; 100 levels overflow jsonschema
MAX_ARGUMENT_BYTES = 65_536  # one call's arguments
MAX_ARGUMENT_DEPTH = 32
MAX_REFERENCE_DEPTH = 32  # references followed along one path (a recursive tree schema needs one per level)
CHECK_SECONDS = 1.0  # one schema or arguments check
PATTERN_SECONDS = 0.1  # one pattern against one string
_REFERENCES = ("$ref", "$dynamicRef")


class SchemaLimit(ValueError):
    """A schema or arguments over one of the limits above; the message names it."""


class _Budget:
    """The clock and the reference depth of one check (a ContextVar holds the current one)."""

    def __init__(self, seconds: float):
        self.deadline, self.references = time.monotonic() + seconds, 0

    def tick(self) -> None:
        if time.monotonic() > self.deadline:
            raise SchemaLimit(f"the check took over {CHECK_SECONDS:g} s (the time one check may take); "
                              "simplify the schema")

    def left(self) -> float:
        return max(0.001, self.deadline - time.monotonic())


_BUDGET: ContextVar[_Budget | None] = ContextVar("rigkit_schema_budget", default=None)


def check_schema(parameters: Any) -> None:
    """Refuse (`SchemaLimit`, or jsonschema's `SchemaError`) a `parameters` schema that is not a
    JSON schema, is over the size limits, points outside itself or loops at its root."""
    from jsonschema import Draft202012Validator

    _check_shape(parameters, MAX_SCHEMA_BYTES, MAX_SCHEMA_DEPTH)
    try:
        Draft202012Validator.check_schema(parameters)
    except RecursionError:
        raise SchemaLimit(f"the schema nests deeper than jsonschema can check (limit {MAX_SCHEMA_DEPTH})") from None
    if isinstance(parameters, bool):
        return
    _check_patterns(parameters)
    _check_references(parameters)
    first_error(parameters, {}, every=True)  # a loop at the root (`{"$ref": "#"}`) shows on any value


def load_arguments(arguments: Any) -> Any:
    """A call's arguments (JSON text, or a value already parsed) as a value within the limits;
    else a `ValueError` whose message follows "the arguments are": "not JSON: ...", "nested deeper
    than 32 levels, the limit"."""
    if isinstance(arguments, str):
        size = len(arguments.encode("utf-8", "surrogatepass"))
        if size > MAX_ARGUMENT_BYTES:
            raise SchemaLimit(f"{size} bytes, over the limit of {MAX_ARGUMENT_BYTES}")
        try:
            arguments = json.loads(arguments or "{}", parse_constant=_not_json)
        except RecursionError:
            raise SchemaLimit(f"nested deeper than {MAX_ARGUMENT_DEPTH} levels, the limit") from None
        except json.JSONDecodeError as err:
            raise ValueError(f"not JSON: {err.msg}") from None
    _check_shape(arguments, MAX_ARGUMENT_BYTES, MAX_ARGUMENT_DEPTH)
    return arguments


def first_error(schema: Any, instance: Any, every: bool = False) -> Any:
    """The first `ValidationError` of `instance` against `schema` (None: valid), within the
    limits; `every` runs through all of them (the root-loop probe of `check_schema`)."""
    from referencing.exceptions import Unresolvable

    token = _BUDGET.set(_Budget(CHECK_SECONDS))
    try:
        errors = _validator_class()(schema, registry=_registry()).iter_errors(instance)
        if every:
            for _ in errors:
                pass
            return None
        return next(iter(errors), None)
    except RecursionError:
        raise SchemaLimit("the check nests deeper than Python's recursion limit (a reference loop?)") from None
    except Unresolvable as err:
        raise SchemaLimit(f"the reference {_ref_of(err)!r} cannot be resolved inside the schema "
                          "(nothing is fetched)") from None
    finally:
        _BUDGET.reset(token)


# -- the shape of a value ------------------------------------------------------------------------------
def _not_json(name: str) -> Any:
    raise ValueError(f"not strict JSON: {name} is not a JSON number")


def _check_shape(value: Any, max_bytes: int, max_depth: int) -> None:
    """Nesting first (without recursion), then size; NaN and Infinity are not JSON."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > max_depth:
                raise SchemaLimit(f"nested deeper than {max_depth} levels, the limit")
            stack.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict) else item))
        elif isinstance(item, float) and not math.isfinite(item):
            raise ValueError(f"not strict JSON: {item!r} is not a JSON number")
    size = len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        raise SchemaLimit(f"{size} bytes of JSON, over the limit of {max_bytes}")


def _walk(schema: Any, base: str = "") -> Iterator[tuple[dict, str]]:
    """Every object in `schema` with the base URI its `$id`s give it (depth already bounded)."""
    stack = [(schema, base)]
    while stack:
        item, base = stack.pop()
        if isinstance(item, dict):
            if isinstance(item.get("$id"), str):
                base = urljoin(base, item["$id"])
            yield item, base
            stack.extend((v, base) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, base) for v in item)


def _check_patterns(schema: Any) -> None:
    import regex

    objects = [item for item, _ in _walk(schema)]
    found = [o["pattern"] for o in objects if isinstance(o.get("pattern"), str)]
    found += [p for o in objects if isinstance(o.get("patternProperties"), dict) for p in o["patternProperties"]]
    for pattern in found:
        try:
            _compiled(pattern)
        except regex.error as err:
            raise SchemaLimit(f"the pattern {pattern!r} is not a regular expression: {err}") from None
    if found and any("unevaluatedProperties" in o for o in objects):
        raise SchemaLimit("unevaluatedProperties with patternProperties is not supported: that check would match "
                          "the patterns without a time limit")


def _check_references(schema: dict) -> None:
    from referencing.exceptions import Unresolvable
    from referencing.jsonschema import DRAFT202012

    resolver = _registry().resolver_with_root(DRAFT202012.create_resource(schema))
    for item, base in _walk(schema):
        for keyword in _REFERENCES:
            ref = item.get(keyword)
            if not isinstance(ref, str):
                continue
            if not ref.startswith("#"):
                raise SchemaLimit(f"the reference {ref!r} points outside the schema; only references inside it "
                                  "(#/$defs/...) are resolved, and nothing is fetched")
            try:
                resolver.lookup(urljoin(base, ref))
            except Unresolvable:
                raise SchemaLimit(f"the reference {ref!r} points at nothing in the schema") from None


def _ref_of(err: Exception) -> str:
    return str(getattr(err, "ref", "") or getattr(getattr(err, "_wrapped", None), "ref", "") or err)


# -- the bounded validator -----------------------------------------------------------------------------
def _refuse(uri: str) -> Any:
    from referencing.exceptions import NoSuchResource

    raise NoSuchResource(ref=uri)  # schemas never fetch: a reference outside the schema is unresolvable


@functools.cache
def _registry() -> Any:
    from referencing import Registry

    return Registry(retrieve=_refuse)


@functools.lru_cache(maxsize=512)
def _compiled(pattern: str) -> Any:
    import regex

    return regex.compile(pattern)


def _search(pattern: str, text: str) -> bool:
    """`pattern` found in `text`, within `PATTERN_SECONDS` (and the check's budget)."""
    budget = _BUDGET.get()
    seconds = min(PATTERN_SECONDS, budget.left()) if budget is not None else PATTERN_SECONDS
    try:
        return _compiled(pattern).search(text, timeout=seconds, concurrent=True) is not None
    except TimeoutError:
        raise SchemaLimit(f"the pattern {pattern!r} took over {PATTERN_SECONDS:g} s on one value (it backtracks); "
                          "simplify it") from None


def _pattern(validator, pattern, instance, schema):
    from jsonschema.exceptions import ValidationError

    if validator.is_type(instance, "string") and not _search(pattern, instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(validator, patterns, instance, schema):
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            if _search(pattern, key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional_properties(validator, additional, instance, schema):
    """jsonschema's own keyword, with the patterns matched by `_search`."""
    from jsonschema._utils import extras_msg
    from jsonschema.exceptions import ValidationError

    if not validator.is_type(instance, "object"):
        return
    named, patterns = schema.get("properties", {}), schema.get("patternProperties", {})
    extras = {k for k in instance if k not in named and not any(_search(p, k) for p in patterns)}
    if validator.is_type(additional, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], additional, path=extra)
    elif not additional and extras:
        if patterns:
            verb = "does" if len(extras) == 1 else "do"
            joined = ", ".join(repr(each) for each in sorted(extras))
            listed = ", ".join(repr(each) for each in sorted(patterns))
            yield ValidationError(f"{joined} {verb} not match any of the regexes: {listed}")
        else:
            names, verb = extras_msg(sorted(extras, key=str))
            yield ValidationError(f"Additional properties are not allowed ({names} {verb} unexpected)")


def _canonical(value: Any) -> Any:
    """A hashable key equal for values JSON Schema calls equal (1 == 1.0, true != 1, keys unordered)."""
    if isinstance(value, bool) or value is None:
        return ("literal", value)
    if isinstance(value, dict):
        return ("object", frozenset((k, _canonical(v)) for k, v in value.items()))
    if isinstance(value, list):
        return ("array", tuple(_canonical(v) for v in value))
    return ("string" if isinstance(value, str) else "number", value)


def _unique_items(validator, unique, instance, schema):
    from jsonschema.exceptions import ValidationError

    if not unique or not validator.is_type(instance, "array"):
        return
    seen: set[Any] = set()
    for item in instance:
        key = _canonical(item)
        if key in seen:
            yield ValidationError(f"{instance!r} has non-unique elements")
            return
        seen.add(key)


def _timed(keyword):
    """`keyword`, looking at the check's clock first."""

    def run(validator, value, instance, schema):
        budget = _BUDGET.get()
        if budget is not None:
            budget.tick()
        yield from keyword(validator, value, instance, schema) or ()

    return run


def _followed(keyword):
    """A reference keyword, counting how deep references are followed along the current path."""

    def run(validator, value, instance, schema):
        budget = _BUDGET.get()
        if budget is None:
            yield from keyword(validator, value, instance, schema) or ()
            return
        budget.tick()
        if budget.references >= MAX_REFERENCE_DEPTH:
            raise SchemaLimit(f"references nest deeper than {MAX_REFERENCE_DEPTH} levels ({value!r} loops?)")
        budget.references += 1
        try:
            yield from keyword(validator, value, instance, schema) or ()
        finally:
            budget.references -= 1

    return run


@functools.cache
def _validator_class() -> Any:
    from jsonschema import Draft202012Validator, validators

    own = {"pattern": _pattern, "patternProperties": _pattern_properties,
           "additionalProperties": _additional_properties, "uniqueItems": _unique_items}
    keywords: Mapping[str, Any] = {**Draft202012Validator.VALIDATORS, **own}
    wrapped = {name: (_followed if name in _REFERENCES else _timed)(fn) for name, fn in keywords.items()}
    return validators.extend(Draft202012Validator, validators=wrapped)
