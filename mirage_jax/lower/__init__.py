"""Lowering µGraphs to GPU kernels: Pallas (Triton lowering) and jax-triton, one registry."""

from mirage_jax.lower import backends as backends
from mirage_jax.lower import registry as registry
from mirage_jax.lower.kernel_graph import lower as lower
from mirage_jax.lower.kernel_graph import plan as plan
from mirage_jax.lower.pallas import PallasConfig as PallasConfig
from mirage_jax.lower.pallas import export_for_gpu as export_for_gpu
from mirage_jax.lower.plan import KernelPlan as KernelPlan
from mirage_jax.lower.plan import plan_kernel as plan_kernel
from mirage_jax.lower.registry import LoweringError as LoweringError
from mirage_jax.lower.triton import TritonConfig as TritonConfig
from mirage_jax.lower.triton import source_of as source_of
