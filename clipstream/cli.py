"""The ``clipstream`` command.

Sub-commands live beside the stage they run and are imported only when called, so that
``clipstream infra status`` does not pay for importing onnxruntime or torch.
"""

from __future__ import annotations

import difflib
import importlib
import os
import sys

import click

from clipstream.infra import PARENT_ENV, die_with
from clipstream.spare import wait_if_spare

# command name -> "module:attribute" of a click command or group
COMMANDS: dict[str, str] = {
    "infra": "clipstream.infra.cli:infra",
    "topics": "topics.cli:topics",
    "deadletters": "topics.deadletters_cli:deadletters",
    "worker": "workers.cli:worker",
    "batcher": "batchers.cli:batcher",
    "selector": "selector.cli:selector",
    "gateway": "frontend.gateway_cli:gateway",
    "apply": "frontend.cli:apply",
    "register-app": "frontend.cli:register_app",
    "deploy-model": "frontend.cli:deploy_model",
    "link": "frontend.cli:link",
    "set-replicas": "frontend.cli:set_replicas",
    "rollback": "frontend.cli:rollback",
    "remove-model": "frontend.cli:remove_model",
    "remove-app": "frontend.cli:remove_app",
    "inspect": "frontend.inspect_cli:inspect_registry",
    "up": "clipstream.up:up",
}


class LazyGroup(click.Group):
    """A group whose commands are imported on first use; missing ones are hidden."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        names = []
        for name, target in COMMANDS.items():
            module = target.split(":")[0]
            if importlib.util.find_spec(module.split(".")[0]) is None:
                continue
            names.append(name)
        return sorted(names)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name, attr = target.split(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and module_name.startswith(exc.name):
                return None
            raise
        return getattr(module, attr, None)

    def resolve_command(self, ctx: click.Context, args: list[str]) -> tuple[str | None, click.Command | None, list[str]]:
        """click's, with the command meant for a misspelt one: click looks among the commands
        it holds, and this group imports them only when asked."""
        name = args[0] if args else ""
        if name and not name.startswith("-") and not ctx.resilient_parsing and self.get_command(ctx, name) is None:
            close = difflib.get_close_matches(name, self.list_commands(ctx))
            meant = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
            raise click.UsageError(f"No such command {name!r}.{meant}", ctx)
        return super().resolve_command(ctx, args)


# commands that start or watch the local Kafka and Redis themselves
OWN_INFRA = frozenset({"up", "infra"})
STAGES = frozenset({"gateway", "selector", "batcher", "worker"})


@click.group(cls=LazyGroup)
@click.version_option(package_name="clipstream")
@click.pass_context
def main(ctx: click.Context) -> None:
    """clipstream: Clipper-style prediction serving on Apache Kafka."""
    if ctx.invoked_subcommand not in OWN_INFRA:
        use_recorded_infra(warn=ctx.invoked_subcommand not in STAGES)


def use_recorded_infra(warn: bool = True) -> None:
    """With neither CLIPSTREAM_KAFKA_BOOTSTRAP nor CLIPSTREAM_REDIS_URL set, point this command
    at the Kafka and Redis that ``infra up`` or ``up`` started and recorded in the state dir,
    as ``up`` itself does: after ``--free-ports`` they are not where the defaults say."""
    from clipstream.infra.launcher import status
    from clipstream.settings import Settings

    try:
        settings = Settings()
    except ValueError:  # the command names the bad value itself
        return
    named = warn and "state_dir" in settings.model_fields_set  # a stage of up gets its settings from up
    if given := settings.model_fields_set & {"kafka_bootstrap", "redis_url"}:
        if named and len(given) == 1:  # not quietly: the state dir was meant to say where the other is
            click.echo("warning: CLIPSTREAM_STATE_DIR is not read for Kafka and Redis, as CLIPSTREAM_KAFKA_BOOTSTRAP "
                       "or CLIPSTREAM_REDIS_URL is set: set both, or neither", err=True)
        return
    found = status(settings)  # each only while it runs
    alive = {"CLIPSTREAM_KAFKA_BOOTSTRAP": any(node.running for node in found.kafka_nodes),
             "CLIPSTREAM_REDIS_URL": found.redis_running}
    if named and not any(alive.values()):
        click.echo(f"warning: no Kafka or Redis recorded in CLIPSTREAM_STATE_DIR={settings.state_dir} runs (see "
                   f"`clipstream infra status`): using {settings.kafka_bootstrap} and the other defaults", err=True)
    os.environ.update({var: value for var, value in found.env().items() if alive[var]})


def run() -> None:
    """``main``; a spare of ``up``'s supervisor first imports its command, then waits to be
    told to go on (``clipstream.spare``). A stage of ``up`` ends when that ``up`` does."""
    parent = os.environ.pop(PARENT_ENV, None)  # not for the processes this one starts
    if parent is not None and parent.isdigit():
        die_with(int(parent))
    if len(sys.argv) > 1:
        wait_if_spare(lambda: main.get_command(click.Context(main), sys.argv[1]))
    main()


if __name__ == "__main__":
    run()
