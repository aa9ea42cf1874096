"""The control plane's subcommands of the `kubeinfer` CLI (`crds`, `validate`, `render`,
`operator`, `promote`, `abort`, `rbac`). Each lives in its own module and exposes
`register(subparsers)`."""

from __future__ import annotations

import argparse

from kubeinfer.operator import (
    crds_command,
    gate_command,
    operator_command,
    rbac,
    render_command,
    validate_command,
)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Adds the control plane's subcommands to the `kubeinfer` parser."""
    for register_command in (
        crds_command.register,
        validate_command.register,
        render_command.register,
        operator_command.register,
        gate_command.register,
        rbac.register,
    ):
        register_command(subparsers)
