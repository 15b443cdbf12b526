"""The ``celery-fencing`` command: ``demo``, ``inspect``, ``doctor``, ``arm``, ``rebase`` and ``repair``.

::

    celery-fencing demo                       # the paused-writer race, live, no server needed
    celery-fencing inspect --source URL --gate URL RESOURCE...
    celery-fencing doctor -A proj.celery:app [--json]
    celery-fencing rebase --source URL --gate URL [--yes] RESOURCE...   # marks of another grantor
    celery-fencing repair --source URL --gate URL [--yes] RESOURCE...   # poisoned (too high) marks

Exit codes: 0 all good; 1 findings (doctor), failures (demo), a resource
whose mark is above the source's counter (inspect), changes planned but not
made without ``--yes`` or refused (rebase, repair); 2 usage or configuration
error (a clear message, never a traceback); 130 interrupted.

Drivers (celery, kazoo, redis, sqlalchemy) are imported only by the
subcommand that needs them, so ``import celery_fencing.cli`` pulls none in.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from typing import TYPE_CHECKING, Any, NoReturn, TextIO

from ._version import __version__
from .exceptions import FencingConfigurationError

if TYPE_CHECKING:
    from .operations.urls import OpenedGate

__all__ = ["EXIT_FINDINGS", "EXIT_OK", "EXIT_USAGE", "build_parser", "main"]

EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_USAGE = 2


class _UsageError(Exception):
    """Raised by the parser instead of exiting, so main() decides how to report it."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise _UsageError(f"{self.prog}: {message}")


def build_parser() -> argparse.ArgumentParser:
    """The whole command line, one sub-parser per subcommand."""
    parser = _Parser(
        prog="celery-fencing",
        description="Fencing tokens for Celery: see the race (demo), look at tokens and marks (inspect), "
        "check a deployment (doctor).",
    )
    parser.add_argument("--version", action="version", version=f"celery-fencing {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    demo = sub.add_parser(
        "demo",
        help="play the paused-writer race with real celery workers, fencing off then on",
        description="Play the paused-writer race with two real celery worker processes, once without and once "
        "with fencing, and print the timeline. With no flag it needs no server: SQLite token source and "
        "gate, kombu's filesystem broker, Celery's file:// results. Each flag swaps in a real server.",
    )
    demo.add_argument("--zookeeper", metavar="HOSTS", help="ZooKeeper token source, e.g. 127.0.0.1:2181")
    demo.add_argument("--redis", metavar="URL", help="keep the account in Redis, behind a RedisGate")
    demo.add_argument(
        "--postgres", metavar="URL", help="keep the account in PostgreSQL, behind a SQLGate (postgresql://...)"
    )
    demo.add_argument("--broker", metavar="URL", help="Celery broker URL, e.g. redis://127.0.0.1:6379/0 or amqp://")
    demo.add_argument("--keep", action="store_true", help="keep the temp dir (worker logs, event log) for inspection")

    inspect = sub.add_parser(
        "inspect",
        help="show resources' last token and high-water marks side by side (reads only)",
        description="Show each RESOURCE's last token at the source and its high-water mark at each gate. "
        "Nothing is minted or written. A mark above the source's counter means the source was reset or "
        "is not the one the workers use: every new token would be refused (exit code 1).",
    )
    inspect.add_argument(
        "--source", metavar="URL", required=True, help="token source: zookeeper://h1:2181/fencing or sqlite:///f.db"
    )
    _add_gate_flags(
        inspect,
        "a gate's store: redis://host:6379/0, postgresql://user@host/db, mysql://..., sqlite:///f.db (repeatable)",
    )
    inspect.add_argument("--sql-table", metavar="TABLE", default=None, help="SQLGate mark table (fencing_high_water)")
    inspect.add_argument(
        "--task-id",
        metavar="ID",
        action="append",
        default=[],
        help="also show which execution of this task applied on each resource (exactly once; repeatable)",
    )
    inspect.add_argument("--json", action="store_true", help="print JSON instead of a table")
    inspect.add_argument("resources", metavar="RESOURCE", nargs="+", help="resource names, e.g. account:42")

    doctor = sub.add_parser(
        "doctor",
        help="check a Celery app's fencing setup and print each finding with its fix",
        description="Load a Celery app (like celery -A) and check its fencing setup: settings, the token "
        "source (reachable, monotonic: it mints twice on the resource 'celery-fencing:doctor'), the gates "
        "(reachable; Redis persistence), the result backend, the broker, and the timing settings that make "
        "a broker re-deliver running tasks. Exit code 0: no finding; 1: findings; 2: the app cannot be loaded.",
    )
    doctor.add_argument("-A", "--app", metavar="APP", required=True, help="the Celery app: module or module:attr")
    doctor.add_argument("--json", action="store_true", help="print JSON instead of text")
    _add_worker_flags(doctor)

    arm = sub.add_parser(
        "arm",
        help="give Redis stores a floor: after they lost their data (a restart without persistence), or new",
        description="A Redis store without its floor refuses every token (it is new, or it forgot its marks). "
        "arm sets the floor of each --gate to a token minted now from --source (or to --floor), so that every "
        "token minted before is refused and every later one passes. A floor is only ever raised. Fenced tasks "
        "arm their stores by themselves; this is for gates without a source.",
    )
    arm.add_argument("--source", metavar="URL", help="the token source the workers use (mints the floor)")
    _add_gate_flags(
        arm, "a RedisGate's store (redis://...) or the fenced result backend's (fenced+redis://...); repeatable"
    )
    arm.add_argument("--floor", metavar="N", type=int, help="this floor instead of a minted one (0: a new store)")

    for name, summary, description in (
        (
            "rebase",
            "move resources whose marks belong to another grantor (a wiped ZooKeeper) to the source's grantor",
            "For each RESOURCE and gate, a mark held by another grantor than the source's (a ZooKeeper whose data "
            "was wiped, a new SQLite file) is set to a token freshly minted by the source, with its grantor id. "
            "Tokens of the old grantor are refused from then on. Prints every change; changes nothing without "
            "--yes; logs each change on the celery_fencing.audit logger.",
        ),
        (
            "repair",
            "lower poisoned marks (above anything the grantor has issued) to a fresh token",
            "For each RESOURCE, mint a fresh token and, at each gate, lower a mark of the same grantor that is "
            "above it (a forged or corrupted token got in: every honest token is refused) to that fresh token. "
            "Tokens minted before stay refused. Prints every change; changes nothing without --yes; logs each "
            "change on the celery_fencing.audit logger. The fresh token is minted even without --yes.",
        ),
    ):
        admin = sub.add_parser(name, help=summary, description=description)
        admin.add_argument("--source", metavar="URL", required=True, help="the token source the workers use")
        admin.add_argument(
            "--gate", metavar="URL", action="append", default=[], help="a gate's store (repeatable), as for inspect"
        )
        admin.add_argument("--redis-prefix", metavar="PREFIX", default="fencing", help="RedisGate prefix (fencing)")
        admin.add_argument("--sql-table", metavar="TABLE", default=None, help="SQLGate mark table (fencing_high_water)")
        admin.add_argument("--yes", action="store_true", help="make the changes (without it: print them only)")
        admin.add_argument("--json", action="store_true", help="print JSON instead of text")
        admin.add_argument("resources", metavar="RESOURCE", nargs="+", help="resource names, e.g. account:42")
    return parser


def _run_demo(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from .demo.runner import DemoOptions, run_demo

    options = DemoOptions(
        zookeeper=args.zookeeper, redis=args.redis, postgres=args.postgres, broker=args.broker, keep=args.keep
    )
    return run_demo(options, out, err)


@contextmanager
def _gates_and_source(
    args: argparse.Namespace, open_source: Callable[[str], Any]
) -> Iterator[tuple[list[OpenedGate], Any]]:
    """Open every ``--gate`` URL and the ``--source`` (with *open_source*); close them all when done, whatever happens.

    :raises FencingConfigurationError: no ``--gate`` was given.
    """
    from .operations.urls import gate_from_url

    if not args.gate:
        raise FencingConfigurationError(f"{args.command} needs at least one --gate URL (where the marks are kept)")
    with ExitStack() as opened_here:
        opened: list[OpenedGate] = []
        for url in args.gate:
            gate = gate_from_url(url, redis_prefix=args.redis_prefix, sql_table=args.sql_table)
            opened_here.callback(gate.close)
            opened.append(gate)
        source = open_source(args.source)
        opened_here.callback(source.close)
        yield opened, source


def _run_inspect(args: argparse.Namespace, out: TextIO) -> int:
    from .operations.inspection import inspect_resources, open_peeker
    from .urls import redact_url

    with _gates_and_source(args, open_peeker) as (opened, peeker):
        reports = inspect_resources(peeker, opened, list(args.resources), list(args.task_id))
        source_label = peeker.description
        grantor: str | None = getattr(peeker, "grantor", None)
    failing = any(report.problems for report in reports)
    if args.json:
        document = {
            "source": redact_url(args.source),
            "grantor": grantor,
            "gates": [gate.label for gate in opened],
            "resources": [report.to_json() for report in reports],
            "ok": not failing,
        }
        out.write(json.dumps(document, indent=2) + "\n")
        return EXIT_FINDINGS if failing else EXIT_OK
    out.write(f"source  {source_label}\n")
    if grantor is not None:
        out.write(f"grantor {grantor}\n")
    for index, gate in enumerate(opened, 1):
        out.write(f"gate {index}  {gate.label}\n")
    out.write("\n")
    header = ["resource", "last token", *(f"mark @ gate {i}" for i in range(1, len(opened) + 1)), "status"]
    rows = []
    for report in reports:
        if report.last_token is not None:
            last = str(report.last_token)
        else:
            last = (report.peek_note or "never minted") if report.peek_supported else "cannot peek"
        marks = ["-" if mark is None else str(mark) for _, mark in report.marks]
        rows.append([report.resource, last, *marks, report.status])
    out.write(_table(header, rows) + "\n")
    applied_rows = [
        [report.resource, task_id, label, execution or "not applied (or expired)"]
        for report in reports
        for label, task_id, execution in report.applied
    ]
    if applied_rows:
        out.write("\n" + _table(["resource", "task id", "gate", "applied by execution"], applied_rows) + "\n")
    notes = sorted({r.peek_note for r in reports if not r.peek_supported and r.peek_note})
    notes += sorted({note for r in reports for note in r.notes})
    for note in notes:
        out.write(f"\nnote: {note}\n")
    for report in reports:
        for problem in report.problems:
            out.write(f"\n{report.resource}: {problem}\n")
    if any(mark is None for report in reports for _, mark in report.marks):
        out.write("\n'-' means no mark yet: the resource was never claimed or written through that gate.\n")
    return EXIT_FINDINGS if failing else EXIT_OK


def _add_gate_flags(parser: argparse.ArgumentParser, gate_help: str) -> None:
    """--gate (repeatable) and --redis-prefix: the stores a command looks at or arms."""
    parser.add_argument("--gate", metavar="URL", action="append", default=[], help=gate_help)
    parser.add_argument("--redis-prefix", metavar="PREFIX", default="fencing", help="RedisGate prefix (fencing)")


def _add_worker_flags(parser: argparse.ArgumentParser) -> None:
    """The worker's --fencing-* flags, so that doctor judges the configuration the workers run with."""
    from .celery.settings import SETTINGS

    group = parser.add_argument_group(
        "worker flags", "the --fencing-* flags the workers are started with; as on the worker, they win over app.conf"
    )
    for setting in SETTINGS:
        if setting.is_flag:
            group.add_argument(setting.flag, dest=setting.name, action="store_true", default=None, help=setting.help)
        else:
            group.add_argument(
                setting.flag, dest=setting.name, metavar=setting.metavar, default=None, help=setting.help
            )


def _apply_worker_flags(app: Any, args: argparse.Namespace) -> list[str]:
    """Put the given --fencing-* flags on *app*'s configuration, as the worker's bootstep does; return their names."""
    from .celery.settings import SETTINGS

    applied = []
    for setting in SETTINGS:
        value = getattr(args, setting.name, None)
        if value is not None:
            app.conf[setting.name] = value
            applied.append(setting.flag)
    return applied


def _run_doctor(args: argparse.Namespace, out: TextIO) -> int:
    from .operations.doctor import Doctor, load_app

    app = load_app(args.app)
    flags = _apply_worker_flags(app, args)
    checks = Doctor(app, flags=flags).run()
    failing = [c for c in checks if c.failing]
    code = EXIT_FINDINGS if failing else EXIT_OK
    counts = {status: sum(1 for c in checks if c.status == status) for status in ("ok", "note", "warning", "error")}
    if args.json:
        document = {
            "app": args.app,
            "ok": not failing,
            "exit_code": code,
            "counts": counts,
            "checks": [c.to_json() for c in checks],
        }
        out.write(json.dumps(document, indent=2) + "\n")
        return code
    out.write(f"celery-fencing doctor: app {args.app!r}\n\n")
    width = max(len(c.area) for c in checks)
    for check in checks:
        label = check.status.upper() if check.failing else check.status
        out.write(f"  {label:<8} {check.area:<{width}}  {check.message}\n")
        if check.fix and check.status != "ok":
            out.write(f"  {'':<8} {'':<{width}}  fix: {check.fix}\n")
    summary = f"{counts['error']} error(s), {counts['warning']} warning(s), {counts['note']} note(s)"
    verdict = "findings to fix" if failing else "no finding"
    out.write(f"\n{verdict}: {summary}\n")
    return code


def _run_admin(args: argparse.Namespace, out: TextIO) -> int:
    from .operations.admin import apply_changes, open_admin_source, plan_rebase, plan_repair
    from .urls import redact_url

    with _gates_and_source(args, open_admin_source) as (opened, source):
        grantor = source.grantor_id()
        if args.command == "rebase":
            changes = plan_rebase(grantor, opened, list(args.resources))
        else:
            changes = plan_repair(source, opened, list(args.resources))
        if changes and args.yes:
            apply_changes(changes, source, command=args.command)
    failed = [change for change in changes if change.outcome.startswith("skipped")]
    code = EXIT_FINDINGS if failed or (changes and not args.yes) else EXIT_OK
    if args.json:
        document = {
            "command": args.command,
            "source": redact_url(args.source),
            "grantor": grantor,
            "applied": bool(args.yes),
            "changes": [change.to_json() for change in changes],
            "exit_code": code,
        }
        out.write(json.dumps(document, indent=2) + "\n")
        return code
    out.write(f"{args.command}: source {redact_url(args.source)} (grantor {grantor})\n")
    if not changes:
        out.write("nothing to change\n")
        return code
    for change in changes:
        verb = {"planned": "would change", "done": "changed"}.get(change.outcome, "NOT changed")
        out.write(f"  {verb} {change.describe()}\n")
        if change.outcome.startswith("skipped"):
            out.write(f"    {change.outcome}\n")
    if not args.yes:
        out.write(f"\nnothing was changed: re-run with --yes to make these {len(changes)} change(s)\n")
    return code


def _run_arm(args: argparse.Namespace, out: TextIO) -> int:
    from .operations.urls import gate_from_url
    from .urls import redact_url

    if not args.gate:
        raise FencingConfigurationError("arm needs at least one --gate URL (a Redis store)")
    if (args.source is None) == (args.floor is None):
        raise FencingConfigurationError("arm needs exactly one of --source (mint the floor) and --floor N")
    for url in args.gate:
        if _is_database_result_backend(url):
            # Checked before any store is opened, so nothing is armed when one --gate cannot be.
            raise FencingConfigurationError(
                f"{redact_url(url)!r} is a database result backend, which has no floor to raise: only Redis stores "
                f"have floors ({_NO_SQL_FLOOR})"
            )
    opened: list[OpenedGate] = []
    try:
        for url in args.gate:
            gate = gate_from_url(url, redis_prefix=args.redis_prefix)
            opened.append(gate)
            if not callable(getattr(gate.gate, "arm", None)):
                reason = f" ({_NO_SQL_FLOOR})" if gate.kind == "sql" else ""
                raise FencingConfigurationError(
                    f"{redact_url(url)!r} is no Redis store: only Redis stores have floors{reason}"
                )
        floor = args.floor
        if floor is None:
            from .gates.redis_floor import mint_floor
            from .sources import token_source_from_url

            source = token_source_from_url(args.source)
            try:
                floor = mint_floor(source)
            finally:
                source.close()
        for gate in opened:
            armable: Any = gate.gate
            out.write(f"{gate.label}: floor {armable.arm(floor)}\n")
    finally:
        for gate in opened:
            gate.close()
    return EXIT_OK


#: Why arm refuses a SQL store: a floor makes a Redis that lost its marks refuse older tokens.
_NO_SQL_FLOOR = (
    "a database keeps its marks and fence rows in the transactions of the data they guard, so a restart "
    "loses neither; the SQL gate and the database result backends keep no floor"
)


def _is_database_result_backend(url: str) -> bool:
    """``fenced+db+<SQLAlchemy URL>`` or ``fenced+django-db[://]``: a fenced database result backend's URL."""
    scheme = url.split("://", 1)[0].lower() if isinstance(url, str) else ""
    return scheme.startswith("fenced+db+") or scheme == "fenced+django-db"


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows, strict=True)]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(header, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * width for width in widths))
    for row in rows:
        lines.append("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None, *, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run the command line; return the exit code (the console script exits with it)."""
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    parser = build_parser()
    # The commands report driver failures themselves; kazoo would also log each reconnect attempt.
    logging.getLogger("kazoo").setLevel(logging.CRITICAL)
    try:
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help(err)
            return EXIT_USAGE
        if args.command == "demo":
            return _run_demo(args, out, err)
        if args.command == "inspect":
            return _run_inspect(args, out)
        if args.command == "doctor":
            return _run_doctor(args, out)
        if args.command == "arm":
            return _run_arm(args, out)
        if args.command in ("rebase", "repair"):
            return _run_admin(args, out)
        raise _UsageError(f"unknown command {args.command!r}")
    except _UsageError as exc:
        err.write(f"{exc}\n")
        return EXIT_USAGE
    except FencingConfigurationError as exc:
        err.write(f"celery-fencing: {exc}\n")
        return EXIT_USAGE
    except KeyboardInterrupt:
        err.write("interrupted\n")
        return 130
    except Exception as exc:
        # A driver error nothing above anticipated: one line, unless asked for the traceback.
        if os.environ.get("CELERY_FENCING_DEBUG"):
            raise
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        err.write(
            f"celery-fencing: {type(exc).__name__}: {detail}\n"
            "(set CELERY_FENCING_DEBUG=1 to see the traceback, and please report it if the input was valid)\n"
        )
        return EXIT_USAGE
