"""Retrieval markers: tags a model writes to ask for retrieval itself (Toolformer / Self-RAG
style "ask when you need it"), and the protocols that name them.

`parsing` finds, strips and neutralises markers for a word tag or a whole protocol; `protocol`
holds `MarkerProtocol`, the presets (`openrig` by default, `search-r1`, `r1-searcher`,
`self-rag`) and the protocol file format.
"""

from rigkit.markers.parsing import (
    SUBQUERY_SEPARATOR,
    Marker,
    find_markers,
    neutralize_markers,
    split_subqueries,
    strip_markers,
)
from rigkit.markers.protocol import (
    DEFAULT_PROTOCOL,
    PRESETS,
    MarkerProtocol,
    MarkerProtocolError,
    clean_answer,
    format_passages,
    load_protocol,
    marker_evidence,
    marker_spec,
    openrig_style,
    render_results,
    resolve_protocol,
)

__all__ = [
    "Marker",
    "find_markers",
    "strip_markers",
    "neutralize_markers",
    "SUBQUERY_SEPARATOR",
    "split_subqueries",
    "MarkerProtocol",
    "MarkerProtocolError",
    "PRESETS",
    "DEFAULT_PROTOCOL",
    "openrig_style",
    "load_protocol",
    "marker_evidence",
    "marker_spec",
    "resolve_protocol",
    "clean_answer",
    "format_passages",
    "render_results",
]
