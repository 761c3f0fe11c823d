"""mirage_jax: a multi-level superoptimizer for JAX programs, after Mirage (OSDI'25)."""

__version__ = "0.1.0"
