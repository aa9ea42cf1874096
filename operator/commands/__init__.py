"""The control plane's subcommands of the `kubeinfer` CLI, one module each, every one
exposing `register(subparsers)`: `crds`, `validate`, `render`, `operator` (`run`: runs the
operator), `promote` and `abort` (`gate`), `rbac`."""

from __future__ import annotations

import argparse

from kubeinfer.operator.commands import crds, gate, rbac, render, run, validate


def register(subparsers: argparse._SubParsersAction) -> None:
    """Adds the control plane's subcommands to the `kubeinfer` parser."""
    for register_command in (
        crds.register,
        validate.register,
        render.register,
        run.register,
        gate.register,
        rbac.register,
    ):
        register_command(subparsers)
