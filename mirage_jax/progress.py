"""Progress bars: `tqdm.auto` (a widget in Jupyter, text on a terminal) whose saved text stays true.

A Jupyter widget's plain-text fallback is the bar as it was when first displayed ("0%"), and
that is what a notebook executed headless (nbclient, nbconvert) and then read without its
widgets shows. Here a notebook bar is displayed under a display id and updated when it
closes, so the saved output's text is the final state ("3/3 regions in 12 s").
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def progress_bar(iterable: Iterable[Any] | None = None, **kwargs: Any) -> Any:
    """A `tqdm.auto.tqdm(iterable, **kwargs)`; in Jupyter, one whose saved text is its final
    state (updated on `close`)."""
    from tqdm.auto import tqdm

    try:
        from tqdm.notebook import tqdm as notebook_tqdm
    except ImportError:
        notebook_tqdm = None
    if notebook_tqdm is None or not issubclass(tqdm, notebook_tqdm) or kwargs.get("disable"):
        return tqdm(iterable, **kwargs)
    return _notebook_bar(tqdm, iterable, kwargs)


def _notebook_bar(tqdm: type, iterable: Iterable[Any] | None, kwargs: dict[str, Any]) -> Any:
    try:
        from IPython.display import display
    except ImportError:
        return tqdm(iterable, **kwargs)

    class Bar(tqdm):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kw: Any) -> None:
            super().__init__(*args, display=False, **kw)
            self._handle = None
            if getattr(self, "container", None) is not None:
                self._handle = display(self.container, display_id=True)
                self.displayed = True

        def close(self) -> None:
            if getattr(self, "_closed_once", False):
                return
            self._closed_once = True
            super().close()
            if self._handle is None:
                return
            if self.leave:
                self._handle.update(self.container)  # the saved text: the final state
            else:  # a bar that goes away leaves no text behind either
                self._handle.update({"text/plain": ""}, raw=True)

    return Bar(iterable, **kwargs)
