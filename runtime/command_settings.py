"""The settings of the runtime's commands (`kubeinfer serve`, `kubeinfer activator`): each
a pydantic-settings model read from its flags (the argparse parser's own source) and then
from its `KUBEINFER_<COMMAND>_*` variables, a flag winning over its variable; no .env or
secrets files. A bad flag or variable is one ValueError naming each, flag and variable."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import ValidationError
from pydantic_settings import BaseSettings, CliSettingsSource, PydanticBaseSettingsSource

SETTINGS_SOURCE = "command_settings_source"
"""Where `attach` leaves the parser's CliSettingsSource in the parsed arguments."""

CommandSettings = TypeVar("CommandSettings", bound="FlagsThenEnvironment")


class FlagsThenEnvironment(BaseSettings):
    """A command's settings: its flags (put first by pydantic-settings), then the
    environment."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return init_settings, env_settings


def attach(
    parser: argparse.ArgumentParser,
    settings: type[FlagsThenEnvironment],
    handler: Callable[[argparse.Namespace], int],
) -> None:
    """Adds `settings`' flags to `parser`, and `handler` as what runs them."""
    source = CliSettingsSource[argparse.ArgumentParser](settings, root_parser=parser)
    parser.set_defaults(handler=handler, **{SETTINGS_SOURCE: source})


def from_args(settings: type[CommandSettings], args: argparse.Namespace) -> CommandSettings:
    """`settings` from the flags `attach`'s parser parsed, over the environment; raises
    ValueError naming each bad flag and its variable."""
    source: CliSettingsSource[Any] = getattr(args, SETTINGS_SOURCE)
    prefix = settings.model_config.get("env_prefix", "")
    try:
        return settings(_cli_settings_source=source(parsed_args=args))
    except ValidationError as error:
        problems = []
        for e in error.errors(include_url=False):
            name = str(e["loc"][0]) if e["loc"] else ""
            flag = f"--{name.replace('_', '-')} ({prefix}{name.upper()})"
            problems.append(f"{flag}: {e['msg']}")
        raise ValueError("\n".join(problems)) from None
