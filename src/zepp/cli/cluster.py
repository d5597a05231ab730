"""``zepp cluster up|down|status|check|calibrate``: the emulated cluster from the command line.

``up`` leaves the namespaces in place after the command ends (that is its point) and refuses a
prefix that is in use (``--replace`` replaces it); ``down`` removes zepp's namespaces of the
prefix (those carrying its mark), also the leftovers of a crashed run, and names what it left
alone; ``status`` lists what exists and says whether it is a complete cluster. Bad options: one
line ``zepp: error: ...``, exit code 2, before anything is touched. Not root, or no network
namespaces: one line saying so, exit code 1.
"""

from __future__ import annotations

import contextlib
import json

import click

import zepp.emulate.inventory as inventory
import zepp.emulate.ownership as ownership
from zepp.emulate.host_check import availability
from zepp.emulate.links import DEFAULT_NIC_MTU, DEFAULT_NVLINK_MTU, DEFAULT_RATE_MBIT
from zepp.emulate.topology import DEFAULT_PREFIX, EmulatedCluster
from zepp.errors import EmulationError, EmulationUnavailable, RankFailure

_prefix_opt = click.option("--prefix", default=DEFAULT_PREFIX, show_default=True,
                           help="name prefix of the namespaces (1-6 lowercase letters/digits)")


def _need_support() -> None:
    ok, reason = availability()
    if not ok:
        raise click.ClickException(f"emulated cluster unavailable: {reason}")


@contextlib.contextmanager
def _reported():
    """The emulated cluster's failures (refused, unavailable, a rank failed) as one line, exit 1."""
    try:
        yield
    except (EmulationUnavailable, EmulationError, RankFailure) as exc:
        raise click.ClickException(str(exc)) from exc


def _inventory(query, prefix: str, *args):
    """``query(prefix, *args)`` (a ``zepp.emulate.inventory`` function) for a checked prefix."""
    ownership.check_prefix(prefix)
    with _reported():
        return query(prefix, *args)


@click.group("cluster")
def cluster() -> None:
    """An emulated multi-node cluster in network namespaces (needs root)."""


@cluster.command("up")
@click.option("--nodes", type=int, default=2, show_default=True)
@click.option("--gpus-per-node", type=int, default=2, show_default=True)
@click.option("--rate-mbit", type=float, default=DEFAULT_RATE_MBIT, show_default=True,
              help="NIC rate per direction, Mbit/s")
@click.option("--delay-ms", type=float, default=0.0, show_default=True,
              help="added one-way latency per NIC direction (needs the netem qdisc)")
@click.option("--nic-mtu", type=int, default=DEFAULT_NIC_MTU, show_default=True)
@click.option("--nvlink-mtu", type=int, default=DEFAULT_NVLINK_MTU, show_default=True)
@click.option("--replace", is_flag=True, help="replace a cluster that already uses the prefix")
@_prefix_opt
def up(nodes, gpus_per_node, rate_mbit, delay_ms, nic_mtu, nvlink_mtu, replace, prefix) -> None:
    """Create the cluster (refused when the prefix is in use, unless --replace)."""
    cl = EmulatedCluster(nodes, gpus_per_node, rate_mbit=rate_mbit, delay_ms=delay_ms, prefix=prefix,
                         nic_mtu=nic_mtu, nvlink_mtu=nvlink_mtu, keep=True, replace=replace)  # validates
    _need_support()
    try:
        cl.up()
    except (EmulationUnavailable, EmulationError) as exc:
        raise click.ClickException(str(exc) + ("" if replace or "in use" not in str(exc) else
                                               " (or pass --replace)")) from exc
    for note in cl.notes:
        click.echo(f"note: {note}")
    click.echo(f"emulated cluster {prefix!r} up (id {cl.id}): {nodes} nodes x {gpus_per_node} ranks, NIC "
               f"{cl.rate_mbit:g} Mbit/s per direction, delay {cl.delay_ms:g} ms")
    for r in range(cl.ranks):
        click.echo(f"  rank {r}: ip netns exec {cl.netns(r)} ...  (NIC address {cl.addr(r)}, GLOO_SOCKET_IFNAME=nic)")


@cluster.command("down")
@_prefix_opt
@click.option("--id", "cluster_id", default=None, help="remove only the cluster with this id")
def down_cmd(prefix, cluster_id) -> None:
    """Remove zepp's namespaces of the prefix (also leftovers of a crashed run); others stay."""
    res = _inventory(inventory.down, prefix, cluster_id)
    click.echo(f"removed {len(res.removed)} namespaces" + (f": {' '.join(res.removed)}" if res.removed else ""))
    if res.skipped:
        click.echo(f"skipped {len(res.skipped)} namespaces with the prefix that zepp did not make"
                   f"{' (or of another cluster)' if cluster_id else ''}: {' '.join(res.skipped)}")


@cluster.command("status")
@_prefix_opt
@click.option("--json", "as_json", is_flag=True, help="print the status as JSON")
def status_cmd(prefix, as_json) -> None:
    """List the namespaces, NIC addresses, shaping and byte counters, and whether it is complete."""
    st = _inventory(inventory.status, prefix)
    if as_json:
        click.echo(json.dumps(st, indent=2))
        return
    skipped = f"; skipped (not zepp's): {' '.join(st['skipped'])}" if st["skipped"] else ""
    if not st["namespaces"] and st["record"] is None:
        click.echo(f"no emulated cluster with prefix {prefix!r}{skipped}")
        return
    rec = st["record"] or {}
    verdict = "complete" if st["complete"] else "INCOMPLETE: " + "; ".join(st["problems"])
    click.echo(f"emulated cluster {prefix!r} (id {rec.get('id', '?')}): {rec.get('nodes', '?')} nodes x "
               f"{rec.get('gpus_per_node', '?')} ranks, {len(st['ranks'])} rank namespaces, switch "
               f"{'present' if st['switch'] else 'MISSING'}; {verdict}{skipped}")
    for e in st["ranks"]:
        click.echo(f"  {e['netns']:<12} {e['addr'] or '-':<16} nic {e['state'] or 'missing':<5} "
                   f"tx {e['tx_bytes']} rx {e['rx_bytes']} B  nvlinks {','.join(e['nvlinks']) or '-'}  "
                   f"{e['qdisc'] or 'no shaping'}")


@cluster.command("check")
@_prefix_opt
@click.option("--timeout", type=float, default=90.0, show_default=True)
def check_cmd(prefix, timeout) -> None:
    """Run a checked gloo all-to-all over a running cluster and show which links carried it."""
    from zepp.launch.checks import check_number

    ownership.check_prefix(prefix)
    check_number("--timeout", timeout, 0, 10**6, lo_open=True)
    _need_support()
    with _reported():
        cl = inventory.attach(prefix)
        before = cl.counters()
        cl.call("zepp.emulate.a2a_jobs:a2a_check", {"same_node_bytes": 1 << 20, "remote_bytes": 1 << 18},
                timeout=timeout)
        moved = cl.counters() - before
    click.echo(f"all-to-all over {cl.nodes}x{cl.gpus_per_node} ranks correct (1 MB to each same-node peer, "
               "256 KB to each remote peer)")
    for r in range(cl.ranks):
        click.echo(f"  rank {r}: NIC tx {moved.nic_tx[r]} rx {moved.nic_rx[r]} B, NVLink tx {int(moved.nvlink_tx[r].sum())} B")


@cluster.command("calibrate")
@_prefix_opt
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="write the figures to this file")
def calibrate_cmd(prefix, json_path) -> None:
    """Measure latency and bandwidth of the NVLink and NIC links of a running cluster."""
    from zepp.emulate.linkcal import calibrate_links
    from zepp.outputs import Place, claim_outputs, write_json

    ownership.check_prefix(prefix)
    claim_outputs([Place("--json", json_path)])
    _need_support()
    with _reported():
        cal = calibrate_links(inventory.attach(prefix))
    f = cal.cluster_fields()
    click.echo(f"nvlink_bw {f['nvlink_bw'] / 1e6:.1f} MB/s  nic_bw {f['nic_bw'] / 1e6:.1f} MB/s  "
               f"nvlink_msg_cost {f['nvlink_msg_cost'] * 1e6:.0f} us  nic_msg_cost {f['nic_msg_cost'] * 1e6:.0f} us")
    if json_path:
        write_json(json_path, cal.as_dict(), "--json")
