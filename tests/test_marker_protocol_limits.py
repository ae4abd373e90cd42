"""Marker protocol files that would break a run are refused in one line, before any model loads:
huge tags (slow to compile into parsers), empty `strip` entries (which space out every letter),
tags that repeat each other or hold no letter (a tag of "." matches every sentence end)."""

from __future__ import annotations

import time

import pytest

from rigkit.markers import PRESETS, MarkerProtocolError, openrig_style, resolve_protocol
from rigkit.markers.protocol import MAX_TAG_CHARS


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (f"name: q\nopen: '<{'a' * 10_000}>'\nclose: '</a>'\n", f"at most {MAX_TAG_CHARS}"),
        ("name: q\nopen: '<q>'\nclose: '</q>'\nstrip: ['']\n", "strip[0] is empty"),
        ("name: q\nopen: '<q>'\nclose: '</q>'\nstrip: ['[x]', '  ']\n", "strip[1] is empty"),
        (f"name: q\nopen: '<q>'\nclose: '</q>'\nstrip: ['{'x' * 100}']\n", "strip[0] is 100 characters"),
        ("name: q\nopen: '<q>'\nclose: '</q>'\nanswer_open: '<q>'\nanswer_close: '</a>'\n",
         "open and answer_open tags must differ"),
        ("name: q\nopen: '<q>'\nclose: '</q>'\nresults: inline\nresults_open: '<Q>'\nresults_close: '</i>'\n",
         "open and results_open tags must differ"),  # tags are matched regardless of case
        ("name: q\nopen: '.'\n", "open '.' holds no letter or digit"),
        ("name: q\nopen: '<q>'\nclose: '<>'\n", "close '<>' holds no letter or digit"),
        ("name: q\nopen: '<q>'\nclose: '</q>'\npassage_format: '{text:>100000000}'\n",
         "has a width of 100000000; at most 1000"),
        ("name: q\nopen: '<q>'\nclose: '</q>'\npassage_format: '{text:>{index}}'\n", "from another field"),
        (f"name: q\nopen: '<q>'\nclose: '</q>'\npassage_format: '{'x' * 100_000}{{text}}'\n",
         "100006 characters long; at most 500"),
        ("name: q\nopen: '<q>'\nclose: '</q>'\npassage_format: '{text} {text}'\n", "holds {text} more than once"),
        ("name: q\nopen: '<q>'\nclose: '</q>'\npassage_format: '{title.__class__} {text}'\n",
         "the field {title.__class__} is not one of index, id, title, text"),
        ("name: q\nopen: '<q>'\nclose: '</q>'\npassage_format: '" + "{index}" * 9 + "{text}'\n",
         "it has 10 fields; at most 8"),
        ("name: q\nopen: '<q>'\n  close: '</q>'\n", "bad.yaml:3: not valid YAML"),
        ("name: q\nopen: '<q>'\nstrip: ['a'\n", "bad.yaml:4: not valid YAML"),
    ],
    ids=["huge-tag", "empty-strip", "blank-strip", "long-strip", "answer-is-search", "case-only", "dot", "no-letter",
         "huge-width", "nested-width", "long-format", "text-twice", "attribute", "many-fields", "yaml-indent", "yaml-unclosed"],
)
def test_protocol_files_that_would_break_a_run_are_one_line_errors(tmp_path, content, message):
    path = tmp_path / "bad.yaml"
    path.write_text(content, encoding="utf-8")
    started = time.perf_counter()
    with pytest.raises(MarkerProtocolError) as err:
        resolve_protocol(str(path))
    assert message in str(err.value) and "\n" not in str(err.value) and str(path) in str(err.value)
    assert len(str(err.value)) < 400 + len(str(path))  # the error shows a long format cut short
    assert time.perf_counter() - started < 1.0


def test_a_huge_marker_tag_is_refused_at_once():
    started = time.perf_counter()
    with pytest.raises(MarkerProtocolError, match=f"at most {MAX_TAG_CHARS}"):
        openrig_style("r" * 10_000)
    assert time.perf_counter() - started < 1.0


def test_the_presets_pass_the_checks():
    for preset in PRESETS.values():
        assert all(len(tag) <= MAX_TAG_CHARS for tag in preset.tags + preset.strip)


def test_cli_refuses_an_empty_strip_entry_before_loading_a_model(tmp_path, capsys):
    from rigkit.cli import main

    path = tmp_path / "p.yaml"
    path.write_text("name: q\nopen: '<q>'\nclose: '</q>'\nstrip: ['']\n", encoding="utf-8")
    assert main(["ask", "Who?", "--marker-protocol", str(path)]) == 2
    err = capsys.readouterr().err
    assert "strip[0] is empty" in err and err.count("\n") == 1


def test_a_malformed_json_or_non_utf8_protocol_file_names_the_line(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{"name": "q",\n "open": "<q>",\n}', encoding="utf-8")
    with pytest.raises(MarkerProtocolError, match=r"bad.json:3: not valid JSON"):
        resolve_protocol(str(path))
    binary = tmp_path / "bad.yaml"
    binary.write_bytes(b"name: q\nopen: '\xff'\n")
    with pytest.raises(MarkerProtocolError, match=r"bad.yaml: not UTF-8 text \(byte 15\)"):
        resolve_protocol(str(binary))
