"""What every stage receives: the validated matrix, the state directory, run options."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from .config import Matrix, load_matrix
from .names import inside
from .state import DEFAULT_STATE_DIR, StatePaths


@dataclass
class Context:
    matrix: Matrix
    state: StatePaths
    offline: bool = False

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
