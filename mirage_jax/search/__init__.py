"""mirage_jax.search: expression-guided enumeration of verified µGraphs for one Lax region."""

from mirage_jax.search.cost import Cost as Cost
from mirage_jax.search.cost import Device as Device
from mirage_jax.search.cost import estimate as estimate
from mirage_jax.search.dims import analyse as analyse
from mirage_jax.search.dims import shrink as shrink
from mirage_jax.search.driver import Budget as Budget
from mirage_jax.search.driver import SearchError as SearchError
from mirage_jax.search.driver import SearchResult as SearchResult
from mirage_jax.search.driver import search as search
from mirage_jax.search.select import Selection as Selection
from mirage_jax.search.select import select as select
