"""Graph capture (torch.fx), MASE-style metadata and the passes that analyse and quantize a model.

Every pass is ``pass(graph, pass_args) -> (graph, info)`` and never changes the caller's pass_args.
"""

from lowbit.graph.mase_ops import classify
from lowbit.graph.metadata import (
    MaseMetadata, add_common_metadata_analysis_pass, add_software_metadata_analysis_pass, init_metadata_analysis_pass,
)  # fmt: skip
from lowbit.graph.report import (
    report_node_meta_param_analysis_pass, report_node_shape_analysis_pass, report_node_type_analysis_pass,
)  # fmt: skip
from lowbit.graph.verify import verify_common_metadata_analysis_pass
from lowbit.graph.module_swap import quantize_module_transform_pass
from lowbit.graph.profile import profile_statistics_analysis_pass
from lowbit.graph.qgraph import GraphError, MaseGraph, QGraph
from lowbit.graph.quantize import quantize_transform_pass
from lowbit.graph.save_load import (
    load_graph, load_mase_graph_interface_pass, save_graph, save_mase_graph_interface_pass,
    save_node_meta_param_interface_pass,
)  # fmt: skip
from lowbit.graph.stats_file import load_statistics, save_statistics, stats_to_config, stats_to_config_file
from lowbit.graph.summary import summarize_quantization_analysis_pass

__all__ = [
    "GraphError", "MaseGraph", "MaseMetadata", "add_common_metadata_analysis_pass",
    "add_software_metadata_analysis_pass", "init_metadata_analysis_pass", "QGraph", "classify", "quantize_module_transform_pass", "quantize_transform_pass",
    "report_node_meta_param_analysis_pass", "report_node_shape_analysis_pass", "report_node_type_analysis_pass",
    "summarize_quantization_analysis_pass", "verify_common_metadata_analysis_pass", "load_graph",
    "load_mase_graph_interface_pass", "save_graph", "save_mase_graph_interface_pass",
    "save_node_meta_param_interface_pass", "profile_statistics_analysis_pass", "load_statistics",
    "save_statistics", "stats_to_config", "stats_to_config_file"
]  # fmt: skip

