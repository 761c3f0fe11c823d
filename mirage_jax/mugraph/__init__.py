"""µGraphs: the kernel/block/thread-level IR, its one executable semantics, JSON, rendering."""

from mirage_jax.mugraph.evaluate import evaluate as evaluate
from mirage_jax.mugraph.evaluate import evaluate_reference as evaluate_reference
from mirage_jax.mugraph.evaluate import interpret as interpret
from mirage_jax.mugraph.evaluate import run_block_graph as run_block_graph
from mirage_jax.mugraph.graph import GRID_AXES as GRID_AXES
from mirage_jax.mugraph.graph import BlockGraph as BlockGraph
from mirage_jax.mugraph.graph import BlockGraphBuilder as BlockGraphBuilder
from mirage_jax.mugraph.graph import BlockInput as BlockInput
from mirage_jax.mugraph.graph import BlockOp as BlockOp
from mirage_jax.mugraph.graph import BlockOutput as BlockOutput
from mirage_jax.mugraph.graph import KernelOp as KernelOp
from mirage_jax.mugraph.graph import MuGraph as MuGraph
from mirage_jax.mugraph.graph import MuGraphBuilder as MuGraphBuilder
from mirage_jax.mugraph.graph import MuGraphError as MuGraphError
from mirage_jax.mugraph.ops import ACCUMULATORS as ACCUMULATORS
from mirage_jax.mugraph.ops import OPS as OPS
from mirage_jax.mugraph.validate import TARGETS as TARGETS
from mirage_jax.mugraph.validate import BlockInfo as BlockInfo
from mirage_jax.mugraph.validate import Target as Target
from mirage_jax.mugraph.validate import block_info as block_info
from mirage_jax.mugraph.validate import kernel_shapes as kernel_shapes
from mirage_jax.mugraph.validate import validate as validate
