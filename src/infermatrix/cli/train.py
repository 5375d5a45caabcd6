"""`infermatrix train`: the training images of the selected cells (issue 47), after their
serving images: the pipeline's own train step."""

from __future__ import annotations

import argparse

from . import common_options, load_run, run_options, selection_options


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "train", help="build the training images (kernels with profile: train) on top of the "
        "built serving images")
    common_options(parser)
    selection_options(parser)
    run_options(parser, "fail_fast", "timeout_min", "max_jobs", "nvcc_threads", "wait", "force",
                "ca_bundle")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..stages import run_steps, steps_named

    train_run = load_run(args)
    [record] = run_steps(train_run, steps_named("train"))  # the main job's own train step
    return 1 if record.failed else 0
