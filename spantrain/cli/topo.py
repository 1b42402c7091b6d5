"""`spantrain topo generate|show`: synthetic cluster specs and a readable view of any spec."""

from __future__ import annotations

import argparse
import sys

from spantrain._spec import plural
from spantrain.cli._common import add_json_arg, check_output_file, load_cluster, print_json, stdout_console
from spantrain.cli._figure import FIGURE_FORMATS, check_figure_path
from spantrain.errors import SpecError

__all__ = ["register"]


def register(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="topo_command", metavar="SUBCOMMAND", parser_class=type(p))
    g = sub.add_parser("generate", help="write a realistic synthetic cluster spec",
                       description="Write a realistic cluster spec, deterministic by seed.")
    g.add_argument("--devices", "-n", type=int, required=True, help="number of devices (2-4096)")
    g.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    g.add_argument("--profile", choices=("cee", "geo", "datacenter"), default="cee",
                   help="cloud/edge/end tiers, geo-distributed cities, or one data centre (default cee)")
    g.add_argument("--name", help="cluster name (default PROFILE-N-sSEED)")
    g.add_argument("-o", "--output", metavar="FILE", help="spec file to write: JSON if FILE ends in .json, else YAML "
                                                               "(stdout if absent)")
    g.set_defaults(func=_generate)

    s = sub.add_parser("show", help="print a cluster spec as tables, optionally plot it",
                       description="Print regions, devices and links of a cluster spec; optionally plot it.")
    # positional as DESIGN.md gives it; --cluster as plan, simulate and compare take it
    s.add_argument("spec", metavar="FILE", nargs="?", help="cluster spec (YAML or JSON), or give it as --cluster")
    s.add_argument("--cluster", "-c", metavar="FILE", help="cluster spec, as the other commands take it")
    s.add_argument("--plot", metavar="PNG",
                   help=f"also draw the topology to this file ({', '.join(FIGURE_FORMATS)})")
    add_json_arg(s)
    s.set_defaults(func=lambda args: _show(args, s))
    p.set_defaults(func=lambda args: (p.print_help(sys.stderr), 2)[1])


def _generate(args: argparse.Namespace) -> int:
    import yaml

    from spantrain.profiler.topology import generate

    if args.name is not None and not args.name.strip():  # "" fell back to the default name, "  " was written
        raise SpecError(f"--name {args.name!r} is empty: give the cluster a name, or leave --name out for "
                        "PROFILE-N-sSEED")
    if args.output:
        check_output_file(args.output, "-o")
    cluster = generate(args.devices, seed=args.seed, profile=args.profile, name=args.name)
    if args.output:
        cluster.save(args.output)
        print(f"wrote {args.output}: {plural(len(cluster), 'device')} in {plural(len(cluster.regions), 'region')} "
              f"({args.profile}, seed {args.seed})", file=sys.stderr)
    else:
        sys.stdout.write(yaml.safe_dump(cluster.to_spec(), sort_keys=False, default_flow_style=None, width=100))
    return 0


def _show(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from spantrain.profiler.regionstats import region_stats
    from spantrain.profiler.topoview import plot_topology, region_links, region_summary, tables

    if args.spec is not None and args.cluster is not None:
        parser.error(f"the cluster spec given twice ({args.spec} and --cluster {args.cluster}): give FILE or "
                     "--cluster FILE, not both")
    if args.spec is None and args.cluster is None:
        parser.error("the cluster spec is missing: give FILE or --cluster FILE")
    if args.plot:
        check_figure_path(args.plot, "--plot")
    cluster = load_cluster(args.spec if args.spec is not None else args.cluster)
    stats = region_stats(cluster)  # every view below reads the same medians
    if args.plot:
        plot_topology(cluster, args.plot, stats=stats)
    if args.json:
        print_json({"name": cluster.name, "devices": len(cluster), "regions": region_summary(cluster, stats=stats),
                    "links": region_links(cluster, stats=stats), "plot": args.plot})
        return 0
    console = stdout_console()
    for t in tables(cluster, stats=stats):
        console.print(t)
    if args.plot:
        console.print(f"plot written to {args.plot}")
    return 0
