"""``runifold ui``: serve the read-only web view of runs, histories and audits."""

from __future__ import annotations

import argparse
import ipaddress
import sys
from typing import Any

from runifold.cli._common import (
    UsageError,
    emit_json,
    exit_on_stop_signals,
    printable,
    registry_of,
    store_of,
)
from runifold.stores._open import redacted

DEFAULT_HOST, DEFAULT_PORT = "127.0.0.1", 8233
EXTRA = "pip install '/path/to/runifold[ui]' from a checkout, or 'runifold[ui]' from a package index"
#: what the ui extra brings (and what they need), whose absence means "install the extra"
_EXTRA_MODULES = frozenset({"starlette", "uvicorn", "jinja2", "markupsafe", "anyio", "h11", "click", "sniffio"})


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    ui = sub.add_parser("ui", help="serve a read-only web view of runs, histories and signal audits "
                                   "(needs the ui extra: " + EXTRA + ")")
    ui.add_argument("--host", default=DEFAULT_HOST,
                    help=f"address to listen on (default {DEFAULT_HOST}: this machine only; to share the view, put "
                         "an authenticating proxy in front, see docs/operations.md)")
    ui.add_argument("--allow-host", type=_hosts, default=[], metavar="NAMES",
                    help="listening on loopback, the view answers only requests whose Host is localhost, 127.0.0.1 "
                         "or [::1]; these comma-separated names too (the host name a proxy in front passes on)")
    ui.add_argument("--port", type=_port, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0: any free one)")
    ui.add_argument("--refresh", type=_refresh, default=5,
                    help="seconds between reloads of the runs page (default 5; 0: never)")
    ui.set_defaults(handler=ui_cmd)


def _loopback(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)  # ::ffff:127.0.0.1
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


def _hosts(value: str) -> list[str]:
    names = [name.strip().lower() for name in value.split(",") if name.strip()]
    bad = [name for name in names if not all(c.isalnum() or c in ".-:[]" for c in name)]
    if bad:
        raise argparse.ArgumentTypeError(f"{bad[0]!r} is not a host name (give names like runifold.example.com, "
                                         "comma-separated, without a port)")
    return [name.removeprefix("[").removesuffix("]") for name in names]


def _port(value: str) -> int:
    if not value.isdigit() or int(value) > 65_535:
        raise argparse.ArgumentTypeError(f"{value!r} is not a port number (0 to 65535)")
    return int(value)


def _refresh(value: str) -> int:
    if not value.isdigit() or int(value) > 3_600:
        raise argparse.ArgumentTypeError(f"{value!r} must be a whole number of seconds from 0 to 3600")
    return int(value)


async def ui_cmd(args: argparse.Namespace) -> int:
    try:
        from runifold.ui import create_app
        from runifold.ui._app import LOOPBACK_HOSTS
        from runifold.ui._serve import bind, serve
    except ImportError as exc:
        if (exc.name or "").partition(".")[0] not in _EXTRA_MODULES:
            raise  # not a missing extra: a bug, reported as one
        raise UsageError(f"`runifold ui` needs the ui extra, which is not installed (no module {exc.name!r}): "
                         f"{EXTRA}") from exc
    registry = registry_of(args) if args.app else None
    label = redacted(args.store)
    store = await store_of(args, readonly=True)
    try:
        try:
            sock = bind(args.host, args.port)
        except OSError as exc:
            raise UsageError(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}; "
                             "choose another --port (0: any free one) or --host") from exc
        with sock:
            host, port = sock.getsockname()[:2]
            address = f"http://{f'[{host}]' if ':' in host else host}:{port}/"
            _announce(args, {"event": "ui_started", "url": address, "store": label,
                             "app": args.app, "read_only": True})
            # listening on this machine only, it answers only requests that name this machine (DNS rebinding)
            hosts = {*LOOPBACK_HOSTS, args.host, host, *args.allow_host} if _loopback(host) else None
            await serve(create_app(store, registry, store_label=label, refresh=args.refresh, hosts=hosts), sock)
            exit_on_stop_signals()  # (the view holds nothing: a signal now ends it at once)
    finally:
        await store.close()
    _announce(args, {"event": "ui_stopped"})
    return 0


def _announce(args: argparse.Namespace, event: dict[str, Any]) -> None:
    if args.json:
        emit_json(event)
    elif event["event"] == "ui_started":
        loaded = f" with the workflows of {event['app']}" if event["app"] else " (no --app: no replay verdicts)"
        print(printable(f"runifold ui: {event['store']}{loaded}, read-only, at {event['url']} (Ctrl-C stops)"))
    else:
        print("runifold ui: stopped")
    sys.stdout.flush()
