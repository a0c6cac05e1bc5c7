"""Export for the command line: the platform's exporter, with the warnings it raises kept as notes."""

from __future__ import annotations

import warnings

from ..core.ir import Graph
from ..export.platform import export_for_platform


def export_quantized(graph: Graph, platform, model_path: str, config_path: str) -> dict:
    """Write the QDQ model, the JSON config and the platform's extras beside the model.

    Returns ``{'exporter': name, 'notes': [...]}``; the notes are the export's warnings (for example a
    rounding that differs from the simulation on exact ties).
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        export_for_platform(graph, platform, model_path, config_path)
    return {"exporter": "ppqlike.export_ppq_graph", "notes": [" ".join(str(w.message).split()) for w in caught]}


def exported_states(graph: Graph) -> dict[str, int]:
    """How many configs are in each state (for summaries)."""
    counts: dict[str, int] = {}
    for operation in graph.operations.values():
        if operation.config is not None:
            for _, _, tqc in operation.config.iter_configs():
                counts[tqc.state.name] = counts.get(tqc.state.name, 0) + 1
    return dict(sorted(counts.items()))


__all__ = ["export_quantized", "exported_states"]
