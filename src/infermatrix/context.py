"""What every stage receives: the validated matrix, the state directory, run options."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, TypeVar

from .config import Matrix, load_matrix
from .names import inside
from .state import DEFAULT_STATE_DIR, StatePaths

T = TypeVar("T")

if TYPE_CHECKING:
    from .model.cell import CellPlan
    from .model.spec import CellSpec


@dataclass
class Context:
    matrix: Matrix
    state: StatePaths
    offline: bool = False
    # cell id -> (the lock file's stamp, the CellSpec resolved from it): `spec(plan)`
    _specs: dict[str, tuple[Any, "CellSpec"]] = field(default_factory=dict, init=False,
                                                      repr=False, compare=False)
    # (what, its inputs) -> the fact: `once(key, compute)`
    _facts: dict[tuple[Any, ...], Any] = field(default_factory=dict, init=False, repr=False,
                                               compare=False)

    def spec(self, plan: "CellPlan") -> "CellSpec":
        """The cell's CellSpec, resolved once per run and handed to every step: its lock is
        read and parsed once. Resolved again only when the lock file changed since (the lock
        step writes it) or the plan did (model/spec.py resolves it)."""
        from .model.spec import lock_path, lock_stamp, resolve_spec

        stamp = lock_stamp(lock_path(self, plan.id))
        cached = self._specs.get(plan.id)
        if cached is not None and cached[0] == stamp and cached[1].plan == plan:
            return cached[1]
        resolved = resolve_spec(self, plan)
        self._specs[plan.id] = (stamp, resolved)
        return resolved

    def specs(self, plans: "Iterable[CellPlan]") -> "list[CellSpec]":
        """The CellSpec of each planned cell of `plans`, in their order (pruned ones have
        none)."""
        return [self.spec(p) for p in plans if p.planned]

    def once(self, key: tuple[Any, ...], compute: Callable[[], T]) -> T:
        """A per-cell fact computed once per run, under a key that names all it depends on
        (e.g. the kernel keys of a cell's Dockerfile text: build's compile plan and its build
        both need them)."""
        if key not in self._facts:
            self._facts[key] = compute()
        return self._facts[key]

    @property
    def root(self) -> Path:
        """The directory of matrix.yaml: images/, templates/ and locks/ live beside it."""
        return self.matrix.root

    @property
    def images_dir(self) -> Path:
        return self.root / "images"

    def cell_dir(self, cell_id: str) -> Path:
        """images/<cell-id>/, proven to stay inside images/."""
        return inside(self.images_dir, cell_id)

    @classmethod
    def load(cls, matrix_path: Path | str = "matrix.yaml", state_dir: Path | str | None = None,
             offline: bool = False) -> "Context":
        matrix = load_matrix(matrix_path)
        state = StatePaths.at(state_dir or matrix.root / DEFAULT_STATE_DIR)
        return cls(matrix=matrix, state=state, offline=offline)


def setup_command_log(state: StatePaths, verbose: bool = False) -> None:
    """Log every external command to <state>/commands.log (and stderr with -v)."""
    state.root.mkdir(parents=True, exist_ok=True)
    logger = logging.getLogger("infermatrix")
    logger.setLevel(logging.DEBUG if verbose else logging.INFO)
    wanted = str(state.commands_log)
    for handler in [h for h in logger.handlers if isinstance(h, logging.FileHandler)]:
        if handler.baseFilename != wanted:  # another state directory: log to this one now
            logger.removeHandler(handler)
            handler.close()
    if not any(isinstance(h, logging.FileHandler) for h in logger.handlers):
        handler = logging.FileHandler(state.commands_log, encoding="utf-8")
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(message)s"))
        logger.addHandler(handler)
    if verbose and not any(type(h) is logging.StreamHandler for h in logger.handlers):
        stream = logging.StreamHandler()
        stream.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(stream)
