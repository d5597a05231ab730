"""The ``zepp`` command line. Each subcommand lives in the module that does its work and is
imported only when called, so ``zepp plan`` does not pay for importing torch.distributed."""

from __future__ import annotations

import sys

try:
    import importlib

    import click

    from zepp.errors import EmulationError, ZeppInputError
except KeyboardInterrupt:  # Ctrl-C while the command line loads: nothing has started
    sys.stderr.write("zepp: interrupted (Ctrl-C); nothing was started\n")
    raise SystemExit(130) from None

# subcommand name -> (module, attribute holding the click command)
_COMMANDS = {
    "plan": ("zepp.cli.plan", "plan"),
    "bench": ("zepp.cli.bench", "bench"),
    "ablation": ("zepp.cli.ablation", "ablation"),
    "timeline": ("zepp.cli.timeline", "timeline"),
    "run": ("zepp.cli.run", "run"),
    "generate": ("zepp.cli.generate", "generate"),
    "cluster": ("zepp.cli.cluster", "cluster"),
    "place": ("zepp.cli.place", "place"),
    "systems": ("zepp.cli.systems", "systems"),
}


class _LazyGroup(click.Group):
    def list_commands(self, ctx):
        return sorted(_COMMANDS)

    def get_command(self, ctx, name):
        if name not in _COMMANDS:
            return None
        module, attr = _COMMANDS[name]
        return getattr(importlib.import_module(module), attr)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="zepp")
def cli() -> None:
    """Zepp: distributed MoE serving under relaxed balance constraints."""


def usage_line(exc: click.UsageError) -> str:
    """click's usage error (bad value, unknown option or command, missing argument) as zepp's one
    line: ``<what>, in `zepp CMD`; see `zepp CMD --help```."""
    what = " ".join(exc.format_message().split()).rstrip(".")
    where = exc.ctx.command_path if exc.ctx is not None else "zepp"
    return f"{what}, in `{where}`; see `{where} --help`"


def main(argv: list[str] | None = None) -> None:
    """Console entry point: bad input ends with one line naming what is wrong, exit code 2 (also
    when the emulated cluster cannot be built, as ``zepp run --emulate`` reports it, for click's
    own usage errors and for an output that could not be written); Ctrl-C and SIGTERM with one
    line, exit code 130 and 143, after every ``finally`` of the command ran (workers and ranks
    ended, temporary files and folders removed, the outputs' locks released)."""
    from zepp.launch.signals import Terminated, launcher_signals

    args = list(sys.argv[1:] if argv is None else argv)
    try:
        with launcher_signals(), cli.make_context("zepp", args) as ctx:
            cli.invoke(ctx)
    except ZeppInputError as exc:
        _fail(" ".join(str(exc).split()), 2)
    except click.UsageError as exc:
        _fail(usage_line(exc), 2)
    except OSError as exc:  # a file that could be written when checked could not be at the end (disk full)
        where = f", {exc.filename}" if exc.filename else ""
        _fail(f"{exc.strerror or type(exc).__name__}{where}; check the path and free space", 2)
    except EmulationError as exc:  # the emulated cluster refused or failed (a prefix in use, no netns)
        _fail(str(exc), 2)
    except (KeyboardInterrupt, click.exceptions.Abort):
        _fail("interrupted (Ctrl-C); what was reported as written is whole, the rest was not written", 130)
    except Terminated:
        _fail("terminated (SIGTERM); what was reported as written is whole, the rest was not written", 143)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)


def _fail(line: str, code: int) -> None:
    click.echo(f"zepp: error: {line}" if code == 2 else f"zepp: {line}", err=True)
    sys.exit(code)


if __name__ == "__main__":
    main()
