"""``capwatch serve``: run the capwatch service (FastAPI on uvicorn).

Every mistake that can be found before serving is found first, in an order that creates nothing
until it passes: settings (flags and CAPWATCH_* variables), the database path, the port (bound
here and handed to uvicorn, so nothing can take it in between), then the database itself."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from capwatch.arguments import port_number
from capwatch.usage_errors import CommandError

# Settings fields that have a flag; every other field is set by its CAPWATCH_* variable only.
FLAGS = {"host": "--host", "port": "--port", "db_path": "--db", "token": "--token",
         "prometheus_url": "--prometheus-url"}


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve", help="run the service that aggregates rank reports and advises on the cap",
        description=("Run the capwatch service: POST /v1/reports from every rank, one view per EP group, and "
                     "raise/lower/hold advice on the per-rank cap. Every flag can also be set as a CAPWATCH_* "
                     "environment variable (CAPWATCH_TOKEN, CAPWATCH_DB_PATH, ...); flags win."),
        epilog=SETTINGS_EPILOG, formatter_class=HelpWithSettings)
    parser.add_argument("--host", help="address to bind (default 127.0.0.1: loopback only)")
    parser.add_argument("--port", type=port_number, help="port to bind, 1..65535 (default 8321)")
    parser.add_argument("--db", dest="db_path", help="SQLite database file (default ./capwatch.db); checked at start: "
                                                      "a damaged file is refused (exit 2)")
    parser.add_argument("--token", help="bearer token required on POST /v1/reports (prefer CAPWATCH_TOKEN: "
                                        "a flag is visible in the process list)")
    parser.add_argument("--prometheus-url", help="read the ranks from this Prometheus server instead of reports")
    parser.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    parser.add_argument("--config", type=Path, metavar="FILE",
                        help="a TOML file of settings (keys as the variables below, lower case, without CAPWATCH_; "
                             "[advisor], [clusters.<name>.advisor]); the environment and the flags win over it "
                             "(default: CAPWATCH_CONFIG)")
    parser.add_argument("--print-config", action="store_true",
                        help="print the effective settings as a config file (the token hidden) and exit")
    parser.set_defaults(run=run)


SETTINGS_EPILOG = "\0settings"  # replaced by settings_help() when --help is printed, not on every start of the CLI


class HelpWithSettings(argparse.HelpFormatter):
    def add_text(self, text):
        if text == SETTINGS_EPILOG:  # laid out already: kept as is
            self._add_item(lambda table: table + "\n", [settings_help()])
        else:
            super().add_text(text)


def settings_help() -> str:
    """Every CAPWATCH_* setting with its default and range, from the Settings model (its one place)."""
    import textwrap

    try:
        from capwatch.service.config import settings_reference
    except ImportError:  # a plain install without the service extra: serve says so when run
        return "settings: install a2a-capwatch[service] to list them"
    lines = ["settings (environment variables; a value outside its range is refused at start):"]
    for name, default, bounds, what in settings_reference():
        head = f"  {name}={default}" + (f"  range {bounds}" if bounds else "")
        lines.append(head)
        lines.extend(textwrap.wrap(what, 100, initial_indent="      ", subsequent_indent="      "))
    return "\n".join(lines)


def setting_name(location: tuple, from_flags: set[str]) -> str:
    """How the user set a setting: its flag if given, else its CAPWATCH_* variable."""
    if not location:  # a rule over several settings: its message names them
        return "settings"
    field = str(location[0])
    if field in from_flags:
        return FLAGS[field]
    return "CAPWATCH_" + "__".join(str(part) for part in location).upper()


def settings_error_line(error, from_flags: set[str]) -> str:
    """A pydantic ValidationError from Settings as one line naming the flag or variable."""
    problems = []
    for item in error.errors():
        location = tuple(item["loc"])
        message = item["msg"].removeprefix("Value error, ")
        if item["msg"] == message and location[:1] != ("token",):  # a type error: show what was given
            message += f" (got {item.get('input')!r})"
        problems.append(f"{setting_name(location, from_flags)}: {message}")
    return "; ".join(problems)


def check_db_path(path, name: str) -> None:
    """The database must be a writable file, or creatable: fail before anything starts."""

    try:
        _check_db_path(path, name)
    except OSError as error:  # e.g. a name longer than the file system takes
        raise CommandError(f"{name} {str(path)[:80]}{'...' if len(str(path)) > 80 else ''}: {error.strerror}; "
                           "pick another path") from None


def read_only_mount(path) -> str | None:
    """The mount point of the read-only file system ``path`` (or its nearest existing folder) is on, or None."""
    import os

    existing = os.path.abspath(path)
    while not os.path.exists(existing) and os.path.dirname(existing) != existing:
        existing = os.path.dirname(existing)
    if not os.statvfs(existing).f_flag & os.ST_RDONLY:
        return None
    mount = existing if os.path.isdir(existing) else os.path.dirname(existing)
    while not os.path.ismount(mount):
        mount = os.path.dirname(mount)
    return mount


def _check_db_path(path, name: str) -> None:
    import os

    mount = read_only_mount(path)
    if mount is not None:  # permissions would not explain it: name the mount
        raise CommandError(f"{name} {path}: the file system mounted at {mount} is read-only, and SQLite writes the "
                           "database and its -wal and -shm beside it; the database was not touched: mount it "
                           "read-write, or pick a path on a writable file system")
    if path.exists():
        if path.is_dir():
            raise CommandError(f"{name} {path} is a directory; give a file path such as {path / 'capwatch.db'}")
        if not path.is_file():
            raise CommandError(f"{name} {path} is not a regular file; give a SQLite database file")
        if not os.access(path, os.R_OK | os.W_OK):
            raise CommandError(f"{name} {path} is not readable and writable by this user (its permissions, or an "
                               "immutable flag: see ls -l and lsattr); the file was not touched: make it writable")
        folder = path.parent
        missing = [f"{path.name}{suffix}" for suffix in ("-wal", "-shm")
                   if not (folder / f"{path.name}{suffix}").exists()]
        if missing and not os.access(folder, os.W_OK | os.X_OK):
            # Not damage: SQLite's WAL mode keeps two files beside the database and cannot create them.
            raise CommandError(f"{name} {path}: its folder {folder} is not writable by this user, and SQLite needs to "
                               f"create {' and '.join(missing)} there (write-ahead log); the database was not touched: "
                               "make the folder writable")
        return
    parent = path.parent
    if not parent.is_dir():
        raise CommandError(f"the directory of {name} {path} does not exist; create it or pick another path")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise CommandError(f"{name} {path} cannot be created: {parent} is not writable; pick another path")


def bind_listener(host: str, port: int, host_name: str, port_name: str):
    """Bind the listening socket now: a port in use fails here, before the database is touched."""
    import errno
    import socket

    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as error:
        raise CommandError(f"{host_name} {host!r} is not an address this machine can bind ({error.strerror})") from None
    listener = socket.socket(family, kind, proto)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: TIME_WAIT is no conflict
    try:
        listener.bind(address)
    except OSError as error:
        listener.close()
        if error.errno == errno.EADDRINUSE:
            raise CommandError(f"{port_name} {port}: {host}:{port} is already in use; pick another port or stop "
                               "what listens there") from None
        if error.errno == errno.EACCES:
            raise CommandError(f"{port_name} {port}: not allowed to bind {host}:{port} (ports below 1024 need "
                               "privileges); pick a port above 1023") from None
        raise CommandError(f"{host_name} {host}: cannot bind {host}:{port} ({error.strerror})") from None
    return listener


# Descriptors beyond the connections: the listener, SQLite's files and connections, logs, the threads' pipes.
SPARE_FILES = 256


def raise_open_files_limit(max_connections: int) -> None:
    """Every connection is a file descriptor: raise this process's soft limit to hold them (up to the hard
    limit, as servers do), or refuse to start, saying so, instead of failing accept() under load."""
    import resource

    needed = max_connections + SPARE_FILES
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        if hard != resource.RLIM_INFINITY and hard < needed:
            raise CommandError(f"CAPWATCH_MAX_CONNECTIONS {max_connections} needs {needed} open files, and this "
                               f"process may open at most {hard} (ulimit -Hn); lower CAPWATCH_MAX_CONNECTIONS to "
                               f"{max(hard - SPARE_FILES, 0)} or raise the limit")
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


def listening_url(host: str, port: int) -> str:
    """The URL the service answers on (an IPv6 address in brackets)."""
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/"


def run(args: argparse.Namespace) -> int:
    import sqlite3
    import sys

    from capwatch.extras import require_extra

    require_extra("serve", "service")  # before anything is read, bound or written
    from pydantic import ValidationError
    from pydantic_settings import SettingsError

    from capwatch.service.config import LOOPBACK_HOSTS, Settings, load_settings, settings_toml
    from capwatch.service.http_server import bounded_server, serve
    from capwatch.service.main import create_app
    from capwatch.service.store.errors import StoreDamaged, StoreInaccessible

    overrides = {name: getattr(args, name) for name in FLAGS if getattr(args, name) is not None}
    config_file = args.config or (Path(os.environ["CAPWATCH_CONFIG"]) if os.environ.get("CAPWATCH_CONFIG") else None)
    try:
        settings = load_settings(config_file, **overrides)
    except ValidationError as error:
        raise CommandError(settings_error_line(error, set(overrides))
                           + (f" (flags, CAPWATCH_* variables or {config_file})" if config_file else "")) from None
    except SettingsError as error:  # a CAPWATCH_* variable that is not even parseable (bad JSON)
        raise CommandError(f"{error}; check the CAPWATCH_* environment variables") from None
    except (OSError, ValueError) as error:  # the config file: missing, unreadable, not TOML
        raise CommandError(f"config file {config_file}: {error}; nothing was started") from None
    if args.print_config:
        print(settings_toml(settings), end="")
        return 0
    db_name = setting_name(("db_path",), set(overrides))
    raise_open_files_limit(settings.max_connections)
    if not settings.prometheus_url:
        check_db_path(settings.db_path, db_name)
    listener = bind_listener(settings.host, settings.port, setting_name(("host",), set(overrides)),
                             setting_name(("port",), set(overrides)))
    if settings.host not in LOOPBACK_HOSTS and settings.allowed_hosts == \
            Settings.model_fields["allowed_hosts"].default:
        print(f"capwatch serve: warning: listening on {settings.host}, but only requests addressed to a loopback "
              "name are answered; add the names it is reached under to CAPWATCH_ALLOWED_HOSTS", file=sys.stderr)
    if settings.host not in LOOPBACK_HOSTS and settings.token is None:
        print(f"capwatch serve: warning: listening on {settings.host} without a token: anyone who can reach it "
              "can post reports; set CAPWATCH_TOKEN", file=sys.stderr)
    try:
        try:
            app = create_app(settings)
        except StoreInaccessible as error:
            raise CommandError(f"{db_name} {settings.db_path}: {error}; check the permissions of the file and of "
                               "its folder, where SQLite keeps its -wal and -shm files; the database was not "
                               "touched") from None
        except StoreDamaged as error:
            raise CommandError(f"{db_name} {settings.db_path} is damaged: {error}; restore it from a backup, or move "
                               "it aside to start with an empty database") from None
        except sqlite3.Error as error:
            raise CommandError(f"{db_name} {settings.db_path}: cannot use it as a SQLite database ({error}); "
                               "pick another path") from None
        server = bounded_server(app, settings, args.log_level)
        listener.listen(server.config.backlog)  # connections wait from now on, so the URL below is true at once
        print(f"capwatch serve: listening on {listening_url(settings.host, settings.port)} (the web page; API "
              f"under /v1, metrics at /metrics; "
              + (f"ranks read from {settings.prometheus_url})" if settings.prometheus_url
                 else f"reports kept in {settings.db_path})"),
              file=sys.stderr, flush=True)
        serve(server, [listener])
    finally:
        listener.close()
    return 0
