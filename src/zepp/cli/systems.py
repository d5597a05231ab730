"""``zepp systems``: the one table of systems and stage choices (``zepp.registry``)."""

from __future__ import annotations

import click

from zepp import registry


@click.command("systems")
@click.option("--json", "as_json", is_flag=True, help="Print the table as JSON.")
@click.option("--markdown", is_flag=True, help="Print the system table as Markdown (the README's).")
def systems(as_json: bool, markdown: bool) -> None:
    """List every system: what it is, what it stands for, its choice per stage, where it runs."""
    if as_json:
        click.echo(registry.to_json())
    elif markdown:
        click.echo(registry.markdown_table())
    else:
        click.echo(registry.format_systems())
