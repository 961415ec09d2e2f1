#!/usr/bin/env python3
"""Helm without the helm binary: lint, render and install baton's chart through PyPI's
helm-python-sdk (Helm's own Go SDK). Used by tests/helm/; also handy by hand.

  python3 hack/helm.py lint     CHART [--values JSON]
  python3 hack/helm.py render   CHART --name N --namespace NS [--values JSON] [--api-versions GV/KIND,...]
  python3 hack/helm.py install  CHART --name N --namespace NS [--values JSON] [--skip-crds] [--create-namespace]
  python3 hack/helm.py upgrade  CHART --name N --namespace NS [--values JSON]
  python3 hack/helm.py uninstall --name N --namespace NS
  python3 hack/helm.py rollback  --name N --namespace NS [--revision K]

Output is one JSON document on stdout: the lint report, the rendered manifests
({template path: YAML}) plus the CRDs, or the release summary. Exit 1 on a Helm error
(message on stderr), 2 on lint errors.
"""

import argparse
import json
import sys

try:
    import helm_python as helm
    from helm_python import _native
except ImportError:
    sys.exit("helm-python-sdk is missing: python3 -m pip install helm-python-sdk==0.2.2 (see .ci/run)")


def lint(args, values):
    report = helm.lint(args.chart, values, strict=True, namespace=args.namespace)
    print(json.dumps(report))
    errors = [m for m in report.get("messages", []) if m.get("severity", 0) >= 2]
    return 2 if report.get("errors") or errors else 0


def render(args, values):
    chart = helm.Chart.load(args.chart)
    chart.validate_schema(values)
    opts = {"name": args.name, "namespace": args.namespace, "is_install": True}
    if args.api_versions:
        # Extra capabilities (`.Capabilities.APIVersions`), as `helm template --api-versions`.
        # The SDK's C layer takes the option; its Python wrapper does not expose it yet.
        opts["api_versions"] = args.api_versions.split(",")
    rendered = _native.call_string("helm_render", chart._raw(), json.dumps(values), json.dumps(opts))
    manifests = json.loads(rendered)
    crds = {c["name"]: c["data"] for c in chart.crds} if chart.crds else {}
    print(json.dumps({"manifests": manifests, "crds": crds}))
    return 0


def install(args, values):
    opts = {"namespace": args.namespace, "timeout_seconds": 120}
    if args.skip_crds:
        # As `helm install --skip-crds` (the C layer's option; the wrapper lacks it): the
        # control-plane tests install the CRDs themselves.
        opts["skip_crds"] = True
    if args.create_namespace:
        opts["create_namespace"] = True
    with helm.Config(namespace=args.namespace) as cfg:
        chart, ref = cfg._chart_args(args.chart)
        payload = _native.call_string(
            "helm_install", cfg._raw(), cfg._context_arg(None), chart, ref, args.name,
            json.dumps(values), json.dumps(opts),
        )
        release = json.loads(payload)
    print(json.dumps(release, default=str))
    return 0


def upgrade(args, values):
    with helm.Config(namespace=args.namespace) as cfg:
        release = cfg.upgrade(args.chart, args.name, values, namespace=args.namespace, timeout=120)
    print(json.dumps(release, default=str))
    return 0


def uninstall(args, _values):
    with helm.Config(namespace=args.namespace) as cfg:
        release = cfg.uninstall(args.name, ignore_not_found=True)
    print(json.dumps(release, default=str))
    return 0


def rollback(args, _values):
    # As `helm rollback N [K]`: a new revision with revision K's chart and values (by default
    # the one before the current).
    with helm.Config(namespace=args.namespace) as cfg:
        cfg.rollback(args.name, version=args.revision, timeout=120)
        history = cfg.history(args.name)
    print(json.dumps(history, default=str))
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["lint", "render", "install", "upgrade", "uninstall", "rollback"])
    parser.add_argument("chart", nargs="?", default="charts/baton")
    parser.add_argument("--name", default="baton")
    parser.add_argument("--namespace", default="default")
    parser.add_argument("--values", default="{}", help="values as JSON")
    parser.add_argument("--api-versions", default="", help="render: extra capabilities, comma-separated")
    parser.add_argument("--skip-crds", action="store_true", help="install: leave crds/ alone")
    parser.add_argument("--create-namespace", action="store_true", help="install: create the namespace")
    parser.add_argument("--revision", type=int, default=None, help="rollback: to this revision (default: the previous)")
    args = parser.parse_args()
    values = json.loads(args.values)
    actions = {
        "lint": lint,
        "render": render,
        "install": install,
        "upgrade": upgrade,
        "uninstall": uninstall,
        "rollback": rollback,
    }
    action = actions[args.action]
    try:
        return action(args, values)
    except helm.HelmError as err:
        print(f"helm {args.action}: {type(err).__name__}: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
