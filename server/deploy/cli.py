"""``fedlora deploy``: its arguments and its entry point."""

from __future__ import annotations

import argparse
from pathlib import Path

from server.deploy.deployment import REPO, Options
from server.deploy.interrupts import interrupts_shut_down


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True, parser_class=type(parser))
    up = actions.add_parser(
        "up",
        help="start a SuperLink and N SuperNodes here, run the app with `flwr run`, shut down",
        description="Start flower-superlink and N flower-supernodes on this machine, run this "
        "checkout's Flower app with `flwr run`, stream the logs, and shut everything down.",
    )
    up.add_argument(
        "--nodes", type=int, required=True, metavar="N", help="number of SuperNodes (= num-clients)"
    )
    up.add_argument(
        "--restart-nodes",
        action="store_true",
        help="start a SuperNode again when it exits during the run (default: report it; the run goes on)",
    )
    up.add_argument("--tls", action="store_true", help="HTTPS and SuperNode authentication (registered keys)")
    up.add_argument("--work-dir", type=Path, default=None, help="default runs/deploy-<time>")
    up.add_argument(
        "--run-config",
        action="append",
        default=[],
        metavar='"K=V ..."',
        help="run-config overrides as for `flwr run` (TOML values: preset='minilm-rt' rounds=2); repeatable",
    )
    up.add_argument("--host", default="127.0.0.1", help="SuperLink bind address (0.0.0.0 for remote nodes)")
    up.add_argument(
        "--san",
        action="append",
        default=[],
        metavar="NAME",
        help="with --tls: a DNS name or IP remote nodes use for this machine (in the certificate); repeatable",
    )
    up.add_argument(
        "--port", type=int, default=8000, help="SuperLink HTTP(S) port (Fleet, Control, Runtime API)"
    )
    up.add_argument(
        "--timeout",
        type=float,
        default=3600.0,
        metavar="S",
        help="time limit for bringing the nodes up, and again for the run (then it is stopped)",
    )
    up.add_argument(
        "--grace", type=float, default=10.0, metavar="S", help="SIGTERM -> SIGKILL delay at shutdown"
    )
    up.add_argument(
        "--app", type=Path, default=REPO, help="the Flower app directory (default: this checkout)"
    )
    up.add_argument(
        "--quiet", action="store_true", help="echo only the run's log (every log is still written)"
    )

    resume = actions.add_parser(
        "resume",
        help="continue the run of a deployment whose ServerApp or SuperLink died (same work dir)",
        description="Start the deployment in WORK_DIR again (its stored options and run config, a fresh "
        "SuperLink state) and continue its run from the run directory's checkpoint and ledger.",
    )
    resume.add_argument("work_dir", type=Path, metavar="WORK_DIR", help="the work dir of `deploy up`")
    resume.add_argument("--timeout", type=float, default=None, metavar="S", help="default: as stored")
    resume.add_argument("--grace", type=float, default=None, metavar="S", help="default: as stored")
    resume.add_argument("--restart-nodes", action="store_true", default=None, help="as for `up`")
    resume.add_argument("--quiet", action="store_true", default=None, help="as for `up`")

    # a run on a SuperLink started elsewhere: exit by the run's outcome (`flwr run --stream` exits 0)
    submit = actions.add_parser(
        "run",
        help="submit this app to a running SuperLink, follow it, exit 0 only if the run completed",
        description="`flwr run` of the app to the SuperLink CONNECTION names (in FLWR_HOME's config.toml: "
        "one started by hand, by docker compose or on another machine), its log streamed as `flwr log "
        "--stream` would, then Flower's final status: exit 0 for finished:completed, else exit 1 with "
        "Flower's details in one line (a run that applied no round fails). Ctrl-C stops following, not "
        "the run.",
    )
    submit.add_argument(
        "--run-config", action="append", default=[], metavar='"K=V ..."', help="as for `up`; checked first"
    )
    submit.add_argument("--app", type=Path, default=REPO, help="as for `up`")
    wait = actions.add_parser(
        "wait",
        help="follow a run already submitted (say by `flwr run`); exit 0 only if it completed",
        description="Stream RUN_ID's log from the SuperLink CONNECTION names until the run ends; exit 0 for "
        "finished:completed, else exit 1 with Flower's details in one line.",
    )
    wait.add_argument("run_id", type=int, metavar="RUN_ID", help="the run id `flwr run` printed")
    for verb in (submit, wait):
        verb.add_argument(
            "connection", metavar="CONNECTION", help="a SuperLink connection of FLWR_HOME's config"
        )
        verb.add_argument(
            "--timeout",
            type=float,
            default=None,
            metavar="S",
            help="stop the run after S seconds (default: none)",
        )
        verb.add_argument(
            "--work-dir",
            type=Path,
            default=None,
            help="its run config and logs/run.log (default runs/submit-<time>)",
        )


def options_from_args(args: argparse.Namespace) -> Options:
    return Options(
        nodes=args.nodes,
        tls=args.tls,
        work_dir=args.work_dir,
        run_config=tuple(args.run_config),
        host=args.host,
        port=args.port,
        timeout=args.timeout,
        grace=args.grace,
        app_dir=args.app.resolve(),
        quiet=args.quiet,
        san=tuple(args.san),
        restart_nodes=args.restart_nodes,
    )


def echo(line: str) -> None:
    print(line, flush=True)


def run(args: argparse.Namespace) -> int:
    from server.deploy.up import check_result, deploy_resume, deploy_up  # the run's stack, not --help's

    if args.action in ("run", "wait"):
        return _attached(args)
    with interrupts_shut_down():
        if args.action == "resume":
            keys = ("timeout", "grace", "restart_nodes", "quiet")
            overrides = {k: getattr(args, k) for k in keys if getattr(args, k) is not None}
            result = deploy_resume(args.work_dir, overrides, echo)
        else:
            result = deploy_up(options_from_args(args), echo)
    check_result(result)  # a run that applied no round: exit 1
    return 0


def _attached(args: argparse.Namespace) -> int:
    """``deploy run`` / ``deploy wait``: exit 0 only when the run finished completed."""
    from server.deploy.attach import attach, follow, submit

    with interrupts_shut_down():
        app = args.app if args.action == "run" else None
        dep = attach(args.connection, work_dir=args.work_dir, app_dir=app, timeout=args.timeout, echo=echo)
        run_id = submit(dep, tuple(args.run_config)) if args.action == "run" else args.run_id
        follow(dep, run_id)
    return 0
