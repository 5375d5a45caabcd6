"""Cell selectors in the style of cibuildwheel: fnmatch patterns with {a,b} brace expansion.

`cu13*-*-sm12{0,1}` matches every CUDA 13 cell for both Blackwell arches. A selector string may
hold several patterns separated by spaces; a cell matches when any pattern does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Iterable

from braceexpand import braceexpand

from ..errors import UsageError


def expand(selector: str) -> list[str]:
    """All fnmatch patterns a selector string stands for."""
    patterns: list[str] = []
    for word in selector.split():
        try:
            patterns.extend(braceexpand(word))
        except Exception as exc:  # unbalanced braces and the like
            raise UsageError(f"bad selector {word!r}: {exc}") from None
    return patterns


def matches(selector: str, cell_id: str) -> bool:
    return any(fnmatchcase(cell_id, pattern) for pattern in expand(selector))


@dataclass
class Selection:
    """`select` (empty: everything) minus `skip`. Remembers which selectors matched nothing."""

    select: list[str] = field(default_factory=list)
    skip: list[str] = field(default_factory=list)

    def __call__(self, cell_id: str) -> bool:
        if self.select and not any(matches(s, cell_id) for s in self.select):
            return False
        return not any(matches(s, cell_id) for s in self.skip)

    def unmatched(self, cell_ids: Iterable[str]) -> list[str]:
        """Selectors (select and skip) that match none of `cell_ids`: usually a typo."""
        ids = list(cell_ids)
        return [s for s in [*self.select, *self.skip] if not any(matches(s, i) for i in ids)]
