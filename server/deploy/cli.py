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


def run(args: argparse.Namespace) -> int:
    from server.deploy.up import check_result, deploy_resume, deploy_up  # the run's stack, not --help's

    def echo(line: str) -> None:
        print(line, flush=True)

    with interrupts_shut_down():
        if args.action == "resume":
            keys = ("timeout", "grace", "restart_nodes", "quiet")
            overrides = {k: getattr(args, k) for k in keys if getattr(args, k) is not None}
            result = deploy_resume(args.work_dir, overrides, echo)
        else:
            result = deploy_up(options_from_args(args), echo)
    check_result(result)  # a run that applied no round: exit 1
    return 0
