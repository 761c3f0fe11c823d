"""mirage_jax: a multi-level superoptimizer for JAX programs, after Mirage (OSDI'25)."""

from mirage_jax._version import __version__ as __version__
from mirage_jax.api import BACKENDS as BACKENDS
from mirage_jax.api import SEARCH_MODES as SEARCH_MODES
from mirage_jax.api import FallbackError as FallbackError
from mirage_jax.api import JitStats as JitStats
from mirage_jax.api import MirageJit as MirageJit
from mirage_jax.api import MirageWarning as MirageWarning
from mirage_jax.api import RegionDecision as RegionDecision
from mirage_jax.api import TraceRecord as TraceRecord
from mirage_jax.api import jit as jit
from mirage_jax.api import superoptimize as superoptimize
from mirage_jax.cache import Cache as Cache
from mirage_jax.cache import CacheEntry as CacheEntry
from mirage_jax.cache import CacheWarning as CacheWarning
from mirage_jax.explain import Explanation as Explanation
from mirage_jax.explain import explain as explain
from mirage_jax.filter_jit import FilterJit as FilterJit
from mirage_jax.filter_jit import filter_jit as filter_jit
from mirage_jax.log import configure_from_env as _configure_log
from mirage_jax.log import logger as logger
from mirage_jax.zoo import Job as Job
from mirage_jax.zoo import optimize_many as optimize_many

_configure_log()
