"""Feature sets of the retrieval-trigger classifier: `rigkit.deciders.trigger_features`.

The classifier decider computes them at answer time, so they live beside it; training imports
the same names from here.
"""

from rigkit.deciders.trigger_features import (
    FEATURE_SETS,
    FeatureExtractor,
    FeatureInput,
    FeatureSpec,
    content_mask,
    parse_feature_sets,
    probability_features,
)

__all__ = [
    "FEATURE_SETS",
    "FeatureSpec",
    "FeatureInput",
    "FeatureExtractor",
    "probability_features",
    "content_mask",
    "parse_feature_sets",
]
