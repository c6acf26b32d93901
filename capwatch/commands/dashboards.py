"""``capwatch dashboards export DIR``: what the package ships for Grafana, Prometheus and Kubernetes, written to a
folder a pip user can reach (in a wheel they lie inside site-packages): the dashboards' JSON, the rules and their
promtool tests, Grafana provisioning, a sample prometheus.yml, and the Kubernetes manifests (docs/kubernetes.md).

Copies the shipped files as they are (no generator runs, so the base install suffices); an existing file is left
alone unless --force.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from capwatch.usage_errors import CommandError

# What is exported, relative to the package capwatch.dashboards (pyproject's package-data ships them).
SHIPPED = ("grafana/*.json", "rules/*.yml", "rules/tests/*.yml", "provisioning/*.yaml", "prometheus.yml",
           "kubernetes/*.yaml")


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "dashboards", help="write the Grafana dashboards, Prometheus rules and Kubernetes manifests to a folder",
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    export = actions.add_parser("export", help="write every shipped file under DIR",
                                description="Write grafana/, rules/, provisioning/, prometheus.yml and kubernetes/ "
                                            "under DIR, as the package ships them.")
    export.add_argument("directory", type=Path, metavar="DIR", help="folder to write into (created if missing)")
    export.add_argument("--force", action="store_true", help="overwrite files that exist")
    export.add_argument("--editable", action="store_true",
                        help="dashboards editable in Grafana's UI (shipped read-only: they are generated)")
    export.set_defaults(run=run)


def shipped_files() -> list[tuple[Path, Path]]:
    """(source, path relative to the export folder) for every shipped file."""
    import capwatch.dashboards

    root = Path(capwatch.dashboards.__file__).parent
    files = [(path, path.relative_to(root)) for pattern in SHIPPED for path in sorted(root.glob(pattern))]
    if not any(relative.parts[0] == "kubernetes" for _, relative in files):
        raise CommandError(f"this capwatch ships no manifests under {root}: reinstall it")
    return files


def editable(dashboard_json: bytes) -> bytes:
    """The dashboard with ``editable`` true, written as the generator writes it (only that key differs)."""
    import json

    dashboard = json.loads(dashboard_json)
    dashboard["editable"] = True
    return (json.dumps(dashboard, indent=2, sort_keys=True) + "\n").encode()


def run(args: argparse.Namespace) -> int:
    target: Path = args.directory
    if target.exists() and not target.is_dir():
        raise CommandError(f"{target} is a file, not a folder; pass a folder to write into")
    files = shipped_files()
    existing = [relative for _, relative in files if (target / relative).exists()]
    if existing and not args.force:
        raise CommandError(f"{len(existing)} file(s) exist under {target} (e.g. {existing[0]}); nothing was written. "
                           "Pass --force to overwrite them, or another folder")
    for source, relative in files:
        (target / relative).parent.mkdir(parents=True, exist_ok=True)
        content = source.read_bytes()
        if args.editable and relative.parts[0] == "grafana":
            content = editable(content)
        (target / relative).write_bytes(content)
    print(f"wrote {len(files)} files under {target}: grafana/ (import or provision), rules/ (Prometheus rule_files), "
          f"kubernetes/ (kubectl apply -f; docs/kubernetes.md)")
    return 0
