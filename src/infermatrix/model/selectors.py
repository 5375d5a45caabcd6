"""Cell selectors in the style of cibuildwheel: fnmatch patterns with {a,b} brace expansion.

`cu13*-*-sm12{0,1}` matches every CUDA 13 cell for both Blackwell arches. A selector string may
hold several patterns separated by spaces; a cell matches when any pattern does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from functools import lru_cache
from itertools import islice
from typing import Iterable

from braceexpand import braceexpand

from ..errors import UsageError


MAX_SELECTOR_CHARS = 1000
MAX_PATTERNS = 1000  # brace expansion is exponential: `{a,b}` twenty times is a million
MAX_BRACE_GROUPS = 16


def expand(selector: str) -> list[str]:
    """All fnmatch patterns a selector string stands for (at most MAX_PATTERNS)."""
    return list(_expand(selector))


@lru_cache(maxsize=512)
def _expand(selector: str) -> tuple[str, ...]:
    if len(selector) > MAX_SELECTOR_CHARS or selector.count("{") > MAX_BRACE_GROUPS:
        raise UsageError(f"selector {selector[:60]!r}...: at most {MAX_SELECTOR_CHARS} "
                         f"characters and {MAX_BRACE_GROUPS} {{a,b}} groups")
    patterns: list[str] = []
    for word in selector.split():
        try:
            patterns.extend(islice(braceexpand(word), MAX_PATTERNS + 1 - len(patterns)))
        except Exception as exc:  # unbalanced braces and the like
            raise UsageError(f"bad selector {word!r}: {exc}") from None
        if len(patterns) > MAX_PATTERNS:
            raise UsageError(f"selector {selector[:60]!r} expands to more than {MAX_PATTERNS} "
                             "patterns", fix="use fewer {a,b} groups, or fnmatch wildcards (*)")
    return tuple(patterns)


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
