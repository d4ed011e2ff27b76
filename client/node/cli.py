"""``fedlora node``: a data owner's flower-supernode over their own data, with their policy
(client/node/policy.py) in its node config (client/node/sdk.py writes it); ``fedlora node keygen``:
the owner's own identity key for secure aggregation.

``keygen`` is an optional positional word rather than a subparser, so that ``fedlora node
--superlink ...`` keeps its form; the node's required options are therefore checked in :func:`run`
(one line, exit 2), not by argparse."""

from __future__ import annotations

import argparse

from common.config import INSTRUCTION_FORMATS, MECHANISMS
from common.errors import FedloraError
from common.privacy.participation.threat import TRUST

KEYGEN = "keygen"
REQUIRED = ("superlink", "data", "mechanism")  # a node's required options (not keygen's)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.usage = (
        "%(prog)s --superlink HOST:PORT --data PATH --mechanism M [--epsilon E] [options]\n"
        f"       %(prog)s {KEYGEN} [--out KEY]"
    )
    parser.add_argument(
        "action",
        nargs="?",
        choices=[KEYGEN],
        metavar=KEYGEN,
        help="make this node's own identity key (Ed25519, mode 0600) at --out, its public line at "
        "KEY.pub, and print that line (send it to the operator for the roster) and its fingerprint; "
        "refuses to overwrite a key. ssh-keygen -t ed25519 -N '' -f KEY makes an equivalent key",
    )
    parser.add_argument(
        "--out", metavar="KEY", help="with keygen: the private key's path (default ~/.fedlora/identity)"
    )
    parser.add_argument("--superlink", metavar="HOST:PORT", help="the federation's SuperLink (required)")
    parser.add_argument(
        "--data",
        metavar="PATH",
        help="your examples (required): a JSONL of {text, label}, or a CSV / Parquet / JSONL file with "
        "--text-column and --label-column (written to <state-dir>/data.jsonl)",
    )
    parser.add_argument("--text-column", default="text", help="your data file's text column (text)")
    parser.add_argument("--label-column", default="label", help="your data file's label column (label)")
    parser.add_argument(
        "--instruction-format",
        choices=INSTRUCTION_FORMATS,
        default="auto",
        help="instruction or chat data (docs/instruction-tuning.md): auto (from the columns), alpaca, "
        "prompt-completion, chat, or none (read it as labelled or plain text)",
    )
    parser.add_argument(
        "--prompt-column", default="", help="a prompt/completion file's prompt column (prompt)"
    )
    parser.add_argument(
        "--response-column", default="", help="a prompt/completion file's response column (completion)"
    )
    parser.add_argument(
        "--skip-bad-rows",
        action="store_true",
        help="skip (and count) malformed rows of --data instead of stopping at the first",
    )
    parser.add_argument(
        "--labels",
        metavar="A,B,C",
        help="the federation's label names, comma-separated: your labels are these names (class "
        "indices: the names sorted, as the federation numbers its own file's classes)",
    )
    parser.add_argument(
        "--mechanism", choices=list(MECHANISMS), help="the only mechanism this node joins (required)"
    )
    parser.add_argument(
        "--epsilon", type=float, help="your privacy budget for that mechanism (not with fedavg)"
    )
    parser.add_argument("--delta", type=float, default=1e-5, help="the largest delta you accept (1e-5)")
    parser.add_argument(
        "--run-epsilon",
        type=float,
        metavar="E",
        help="the most of --epsilon one run may spend (default: all of it, and the node warns so at "
        "start); a run whose plan would spend more is refused",
    )
    parser.add_argument(
        "--dataset",
        help="the federation's dataset: this node refuses runs on any other (a packaged one also gives "
        "the label names; a file dataset need not be on this machine, give --labels)",
    )
    parser.add_argument("--model", help="load the base model from here (local directory or Hugging Face id)")
    parser.add_argument(
        "--state-dir", default="~/.fedlora/node", help="persistent node state (ledger, encoders)"
    )
    parser.add_argument("--root-certificates", metavar="CA.crt", help="CA certificate of the SuperLink's TLS")
    parser.add_argument(
        "--auth-key", metavar="KEY", help="this node's private key (SuperNode authentication)"
    )
    parser.add_argument(
        "--identity-key",
        metavar="KEY",
        help="the private key this node signs its secure-aggregation keys with (default: --auth-key); "
        "make it yourself (fedlora node keygen) and send only its public line to the operator",
    )
    parser.add_argument(
        "--roster",
        metavar="FILE",
        help="the federation's node identity public keys, one OpenSSH line each, assembled by its operator "
        "from the owners' public lines; must list --identity-key (needed by --trust aggregate). The node "
        "prints its SHA-256 and key count at start: compare them with the other data owners",
    )
    parser.add_argument("--insecure", action="store_true", help="plain HTTP, no TLS (your own machine only)")
    parser.add_argument(
        "--give-up-after",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="stop, exit 1, when the SuperLink has not answered for this long (120; 0: keep trying)",
    )
    parser.add_argument(
        "--port", type=int, help="local port for the node's ClientApp process (default: free)"
    )
    parser.add_argument(
        "--allow-clear-statistics",
        action="store_true",
        help="take part in dr-encoder runs that send the statistics round in the clear (not private)",
    )
    parser.add_argument(
        "--trust",
        choices=list(TRUST),
        default="none",
        help="whom this node trusts with less than its own noise: none (default: local noise only; your "
        "epsilon holds against the server), aggregate (also --threat-model secure-aggregation[-hidden], "
        "needs --roster: the server sees only the sum; your epsilon holds against it too, even one that "
        "deviates from the protocol, as long as no identity on --roster is the server's or colludes with "
        "it; with node keys the operator made, only against parties other than the operator) or server "
        "(central / distributed noise, --encode-at server: your epsilon holds against everyone else)",
    )
    parser.add_argument(
        "--print-command",
        action="store_true",
        help="print the flower-supernode command and start nothing (the data file and local port it names are written)",
    )


def run(args: argparse.Namespace) -> int:
    from client.node import sdk

    if args.action == KEYGEN:
        return keygen(args)
    if args.out is not None:
        raise FedloraError(f"--out goes with fedlora node {KEYGEN}")
    missing = [f"--{name}" for name in REQUIRED if getattr(args, name) is None]
    if missing:
        raise FedloraError(f"fedlora node needs {', '.join(missing)} (or: fedlora node {KEYGEN} [--out KEY])")
    options = {
        "delta": args.delta,
        "dataset": args.dataset,
        "model": args.model,
        "state_dir": args.state_dir,
        "root_certificates": args.root_certificates,
        "auth_key": args.auth_key,
        "identity_key": args.identity_key,
        "roster": args.roster,
        "insecure": args.insecure,
        "port": args.port,
        "clear_statistics": args.allow_clear_statistics,
        "trust": args.trust,
        "label_names": args.labels,
        "run_epsilon": args.run_epsilon,
        "give_up_after": args.give_up_after,
    }
    if (args.text_column, args.label_column) != ("text", "label"):
        options.update(text_column=args.text_column, label_column=args.label_column)
    instructions = sdk.Instructions(args.instruction_format, args.prompt_column, args.response_column)
    if instructions != sdk.Instructions():
        options["instructions"] = instructions
    if args.skip_bad_rows:
        options["skip_bad_rows"] = True
    cfg = sdk.configure(args.superlink, args.data, args.mechanism, args.epsilon, **options)
    return sdk.start(cfg, print_command=args.print_command, port_given=args.port is not None)


def keygen(args: argparse.Namespace) -> int:
    """``fedlora node keygen [--out KEY]``: the owner's identity key, and what to send the operator."""
    from client.node import sdk
    from common.secagg import identity

    given = [f"--{name}" for name in REQUIRED if getattr(args, name) is not None]
    if given:
        raise FedloraError(f"fedlora node {KEYGEN} takes only --out, not {', '.join(given)}")
    key, public = sdk.keygen(args.out or sdk.DEFAULT_IDENTITY)
    print(f"identity key {key} (private: it stays on this machine)")
    print(f"send this public line ({key}.pub) to the federation's operator for the roster:")
    print(public.decode())
    print(f"fingerprint {identity.fingerprint(public)}")
    return 0


__all__ = ["add_arguments", "run"]
