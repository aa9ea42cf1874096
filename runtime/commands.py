"""The runtime's subcommands of the `kubeinfer` CLI (`serve`, `build`, `activator`).

Each command module exposes `register(subparsers)`; this module only lists them, so the
control plane's CLI can mount them without knowing their flags.
"""

from __future__ import annotations

import argparse

from kubeinfer.runtime import activator_command, serve_command
from kubeinfer.runtime.building import build_command


def register(subparsers: argparse._SubParsersAction) -> None:
    """Adds the runtime's subcommands to the `kubeinfer` parser."""
    for register_command in (
        serve_command.register,
        build_command.register,
        activator_command.register,
    ):
        register_command(subparsers)
