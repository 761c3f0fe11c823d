"""lax_ir: capture JAX functions as normalised Programs, classify the Lax fragment, partition."""

from lax_ir.algebra import Algebra as Algebra
from lax_ir.capture import capture as capture
from lax_ir.interpret import FloatAlgebra as FloatAlgebra
from lax_ir.interpret import evaluate as evaluate
from lax_ir.interpret import evaluate_reference as evaluate_reference
from lax_ir.interpret import evaluate_reference_on_device as evaluate_reference_on_device
from lax_ir.interpret import interpret as interpret
from lax_ir.ops import OPS as OPS
from lax_ir.partition import Partition as Partition
from lax_ir.partition import Region as Region
from lax_ir.partition import as_function as as_function
from lax_ir.partition import classify as classify
from lax_ir.partition import partition as partition
from lax_ir.partition import rebuild as rebuild
from lax_ir.program import Const as Const
from lax_ir.program import Node as Node
from lax_ir.program import Program as Program
